"""Engine cards built from the info JSON real engines send (sglang-native-grpc.md §7, sglang-smg-grpc.md §4)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from trio_direct.fleet.card import CardError, KvEventSource
from trio_direct.fleet.engine_apis import engine_card

# GetModelInfo.json_info of an SGLang 0.5.23 engine (native API, §7.2).
NATIVE_MODEL_INFO = {
    "model_path": "Qwen/Qwen3-8B",
    "served_model_name": "qwen3-8b",
    "tokenizer_path": "Qwen/Qwen3-8B",
    "is_generation": True,
    "weight_version": "default",
    "load_format": "auto",
    "reasoning_parser": "qwen3",
    "tool_call_parser": "qwen25",
    "disaggregation_mode": "null",
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
}

# GetServerInfo.json_info of the same engine: resolved server args + scheduler info + descriptor (§7.1).
NATIVE_SERVER_INFO: dict[str, Any] = {
    "model_path": "Qwen/Qwen3-8B",
    "tokenizer_path": "Qwen/Qwen3-8B",
    "served_model_name": "qwen3-8b",
    "host": "0.0.0.0",
    "port": 30000,
    "grpc_port": 30001,
    "page_size": 16,
    "dp_size": 2,
    "tp_size": 2,
    "load_balance_method": "round_robin",
    "enable_dp_attention": False,
    "context_length": None,
    "max_total_num_tokens": 412160,
    "max_req_input_len": 40955,
    "status": "ready",
    "startup_time": 1761830400.5,
    "disaggregation_mode": "null",
    "disaggregation_bootstrap_port": 8998,
    "disaggregation_transfer_backend": "mooncake",
    "tool_call_parser": "qwen25",
    "reasoning_parser": "qwen3",
    "incremental_streaming_output": True,
    "kv_events_config": json.dumps(
        {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": ""}
    ),
    "kv_events": {
        "publisher": "zmq",
        "endpoint_host": "*",
        "endpoint_port_base": 5557,
        "topic": "",
        "block_size": 16,
        "dp_size": 2,
        "replay_endpoint_port_base": 5600,
    },
    "kv_event_sources": [
        {"dp_rank": 0, "endpoint": "tcp://127.0.0.1:5557", "topic": "", "block_size": 16},
        {"dp_rank": 1, "endpoint": "tcp://127.0.0.1:5558", "topic": "", "block_size": 16},
    ],
    "grpc_features": {"image_inputs": [], "video_inputs": [], "audio_inputs": []},
    "launch_command": "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --grpc-port 30001",
}

# SMG GetModelInfo as SmgEngineClient.model_info() returns it, with the max_context_length quirk (§4).
SMG_MODEL_INFO = {
    "model_path": "Qwen/Qwen3-8B",
    "tokenizer_path": "Qwen/Qwen3-8B",
    "is_generation": True,
    "preferred_sampling_params": "",
    "weight_version": "default",
    "served_model_name": "qwen3-8b",
    "max_context_length": 412160,
    "vocab_size": 128256,
    "supports_vision": False,
    "model_type": "qwen3",
    "eos_token_ids": [],
    "pad_token_id": 0,
    "bos_token_id": 1,
    "max_req_input_len": 40955,
    "architectures": ["Qwen3ForCausalLM"],
    "id2label_json": "",
    "num_labels": 0,
    "default_sampling_params_json": "",
}

# SMG GetServerInfo as SmgEngineClient.server_info() flattens it: server_args + scheduler_info.
SMG_SERVER_INFO = {
    "model_path": "Qwen/Qwen3-8B",
    "tokenizer_path": "Qwen/Qwen3-8B",
    "served_model_name": "qwen3-8b",
    "host": "0.0.0.0",
    "port": 30000,
    "page_size": 16,
    "dp_size": 2,
    "tp_size": 2,
    "enable_dp_attention": False,
    "context_length": None,
    "max_running_requests": 2048,
    "disaggregation_mode": "null",
    "disaggregation_bootstrap_port": 8998,
    "disaggregation_transfer_backend": "mooncake",
    "tool_call_parser": None,
    "reasoning_parser": "qwen3",
    "incremental_streaming_output": False,
    "kv_events_config": json.dumps(
        {"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}
    ),
    "status": "ready",
    "max_total_num_tokens": 412160,
    "max_req_input_len": 40955,
    "startup_time": 1761830400.5,
    "server_type": "grpc",
}

URL = "grpc://10.1.2.3:30001"


def native(server_changes=None, model_changes=None, *, url=URL, host="10.1.2.3", port=30001):
    server_info = copy.deepcopy(NATIVE_SERVER_INFO) | (server_changes or {})
    model_info = copy.deepcopy(NATIVE_MODEL_INFO) | (model_changes or {})
    return engine_card(url, host, port, "native", model_info, server_info)


def smg(server_changes=None, model_changes=None, *, host="10.1.2.3"):
    server_info = copy.deepcopy(SMG_SERVER_INFO) | (server_changes or {})
    model_info = copy.deepcopy(SMG_MODEL_INFO) | (model_changes or {})
    return engine_card(URL, host, 30001, "smg", model_info, server_info)


def test_native_aggregated_engine_card():
    card = native()
    assert (card.url, card.host, card.port, card.api, card.role) == (URL, "10.1.2.3", 30001, "native", "aggregated")
    assert (card.model_path, card.served_model_name, card.tokenizer_path) == (
        "Qwen/Qwen3-8B", "qwen3-8b", "Qwen/Qwen3-8B",
    )  # fmt: skip
    assert card.block_size == 16 and card.kv_block_size == 16
    assert card.context_length == 40955  # max_req_input_len, the limit the scheduler enforces
    assert card.dp_size == 2
    assert card.bootstrap_host is None and card.bootstrap_port is None
    assert card.incremental_streaming is True
    assert (card.tool_call_parser, card.reasoning_parser) == ("qwen25", "qwen3")


def test_native_kv_events_dial_the_engine_host_per_rank_with_replay():
    assert native().kv_events == (
        KvEventSource(0, "tcp://10.1.2.3:5557", "", "tcp://10.1.2.3:5600"),
        KvEventSource(1, "tcp://10.1.2.3:5558", "", "tcp://10.1.2.3:5601"),
    )


@pytest.mark.parametrize("wildcard", ["*", "0.0.0.0", "::"])
def test_every_wildcard_publisher_host_becomes_the_engine_host(wildcard):
    descriptor = NATIVE_SERVER_INFO["kv_events"] | {"endpoint_host": wildcard}
    card = native({"kv_events": descriptor})
    assert [s.endpoint for s in card.kv_events] == ["tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558"]


def test_a_named_publisher_host_is_kept_and_ipv6_is_bracketed():
    descriptor = NATIVE_SERVER_INFO["kv_events"] | {"endpoint_host": "10.9.9.9"}
    assert native({"kv_events": descriptor}).kv_events[1].endpoint == "tcp://10.9.9.9:5558"
    card = native(url="[fd00::7]:30001", host="fd00::7")
    assert card.kv_events[0].endpoint == "tcp://[fd00::7]:5557"
    assert card.kv_events[0].replay_endpoint == "tcp://[fd00::7]:5600"


def test_kv_events_without_replay_and_publishing_off():
    descriptor = {k: v for k, v in NATIVE_SERVER_INFO["kv_events"].items() if k != "replay_endpoint_port_base"}
    descriptor["dp_size"] = 1
    card = native({"kv_events": descriptor, "dp_size": 1})
    assert card.kv_events == (KvEventSource(0, "tcp://10.1.2.3:5557", "", None),)
    off = native({"kv_events": None, "page_size": 32})
    assert off.kv_events == ()
    assert off.kv_block_size == 32  # no descriptor: the page size


def test_kv_event_block_size_comes_from_the_descriptor_or_page_size_times_dcp():
    descriptor = NATIVE_SERVER_INFO["kv_events"] | {"block_size": 64}
    card = native({"kv_events": descriptor, "dcp_size": 4})
    assert (card.block_size, card.kv_block_size) == (16, 64)
    assert native({"kv_events": None, "dcp_size": 2}).kv_block_size == 32


def test_prefill_engine_advertises_its_bootstrap_address():
    card = native({"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 9100, "host": "0.0.0.0"})
    assert card.role == "prefill"
    assert (card.bootstrap_host, card.bootstrap_port) == ("10.1.2.3", 9100)  # wildcard: the dialled host
    named = native({"disaggregation_mode": "prefill", "host": "10.0.0.7"})
    assert named.bootstrap_host == "10.0.0.7"
    loopback = native({"disaggregation_mode": "prefill", "host": "127.0.0.1"})
    assert loopback.bootstrap_host == "10.1.2.3"
    default_port = native({"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": None})
    assert default_port.bootstrap_port == 8998


def test_decode_and_aggregated_engines_have_no_bootstrap_address():
    decode = native({"disaggregation_mode": "decode"}, {"disaggregation_mode": "decode"})
    assert decode.role == "decode"
    assert (decode.bootstrap_host, decode.bootstrap_port) == (None, None)
    old = native({"disaggregation_mode": None}, {"disaggregation_mode": None})  # 0.5.19 model info has none
    assert old.role == "aggregated"


def test_unset_parsers_and_names_fall_back():
    card = native(
        {"tool_call_parser": None, "reasoning_parser": "", "served_model_name": None, "tokenizer_path": None},
        {"tool_call_parser": None, "reasoning_parser": None, "served_model_name": "", "tokenizer_path": ""},
    )
    assert (card.tool_call_parser, card.reasoning_parser) == (None, None)
    assert card.served_model_name == "Qwen/Qwen3-8B"
    assert card.tokenizer_path == "Qwen/Qwen3-8B"


def test_context_length_falls_back_to_the_user_override_then_unknown():
    assert native({"max_req_input_len": None, "context_length": 8192}).context_length == 8192
    assert native({"max_req_input_len": None}).context_length is None


def test_unusable_info_is_refused():
    with pytest.raises(CardError, match="disaggregation_mode 'encode'"):
        native({"disaggregation_mode": "encode"})
    with pytest.raises(CardError, match="no model_path"):
        native({"model_path": None}, {"model_path": ""})


def test_smg_engine_card_from_server_args_and_raw_kv_events_config():
    card = smg()
    assert (card.api, card.role, card.served_model_name, card.dp_size) == ("smg", "aggregated", "qwen3-8b", 2)
    assert card.block_size == 16 and card.kv_block_size == 16
    assert card.context_length == 40955  # never the KV-pool-sized max_context_length
    assert card.incremental_streaming is True  # SMG chunks are always deltas
    assert (card.tool_call_parser, card.reasoning_parser) == (None, "qwen3")
    assert card.kv_events == (
        KvEventSource(0, "tcp://10.1.2.3:5557", "kv", "tcp://10.1.2.3:5600"),
        KvEventSource(1, "tcp://10.1.2.3:5558", "kv", "tcp://10.1.2.3:5601"),
    )


def test_smg_context_length_without_scheduler_info_uses_model_info():
    assert smg({"max_req_input_len": None}).context_length == 40955
    assert smg({"max_req_input_len": None}, {"max_req_input_len": 0}).context_length is None


def test_smg_kv_events_config_variants():
    def sources(config):
        return smg({"kv_events_config": config, "dp_size": 1}).kv_events

    assert sources(None) == ()
    assert sources('{"publisher": "null"}') == ()
    assert sources('{"publisher": "zmq", "endpoint": "ipc:///tmp/kv"}') == ()  # not dialable remotely
    assert sources('{"publisher": "zmq"}') == (KvEventSource(0, "tcp://10.1.2.3:5557", "", None),)  # SGLang's default
    assert sources('{"publisher": "zmq", "endpoint": "tcp://10.8.0.1:6000"}')[0].endpoint == "tcp://10.8.0.1:6000"
    with pytest.raises(CardError, match="not JSON"):
        sources("{publisher: zmq")


def test_smg_unknown_page_size_and_prefill_role():
    card = smg({"page_size": None, "kv_events_config": None})
    assert (card.block_size, card.kv_block_size) == (None, None)
    prefill = smg({"disaggregation_mode": "prefill", "disaggregation_bootstrap_port": 8999})
    assert (prefill.role, prefill.bootstrap_host, prefill.bootstrap_port) == ("prefill", "10.1.2.3", 8999)


def test_card_json_is_plain_json():
    data = json.loads(json.dumps(native().to_json()))
    assert data["kv_events"][1] == {
        "dp_rank": 1, "endpoint": "tcp://10.1.2.3:5558", "topic": "", "replay_endpoint": "tcp://10.1.2.3:5601",
    }  # fmt: skip
    assert data["role"] == "aggregated" and data["context_length"] == 40955


def test_an_embedding_model_is_told_by_is_generation_on_both_apis():
    assert not native().is_embedding and not smg().is_embedding
    assert native(model_changes={"is_generation": False}).is_embedding
    assert smg(model_changes={"is_generation": False}).is_embedding
    # an engine whose model info says nothing: the server arg decides
    assert native({"is_embedding": True}, {"is_generation": None}).is_embedding
    assert native(model_changes={"is_generation": None}).is_embedding is False


def test_image_input_is_what_a_native_engine_lists_in_grpc_features():
    assert not native().supports_images  # 0.5.23 with a text-only model lists no formats
    features = {"image_inputs": ["url", "data_url"], "video_inputs": [], "audio_inputs": []}
    assert native({"grpc_features": features}).supports_images
    assert not native({"grpc_features": None}).supports_images  # 0.5.21 and older: no media at all
    # SMG servicers take images only as pixel values a gateway made, whatever they report
    assert not smg({"grpc_features": features}, {"supports_vision": True}).supports_images
    assert native({"grpc_features": features}).to_json()["supports_images"] is True
