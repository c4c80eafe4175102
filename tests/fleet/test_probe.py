"""Probing real (mock) engines: which API they speak and what they are."""

from __future__ import annotations

import json

import pytest
from google.protobuf import struct_pb2

from trio_direct._proto.native import sglang_pb2 as native_pb
from trio_direct._proto.smg import sglang_scheduler_pb2 as smg_pb
from trio_direct.engine import native as native_api
from trio_direct.engine import smg as smg_api
from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable, EngineUnimplemented
from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.smg import SmgEngineClient
from trio_direct.engine.transport.server import RpcMethod, serve_grpc
from trio_direct.engine.vllm import VllmEngineClient
from trio_direct.fleet.probe import probe_command, probe_engine

KV_EVENTS = '{"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": ""}'


def url(running) -> str:
    return f"http://127.0.0.1:{running.port}"


async def test_native_engine_is_probed_over_the_native_api(start_mock, pool):
    running = await start_mock(served_model_name="tiny", tool_call_parser="qwen25")
    probed = await probe_engine(url(running), pool)
    card = probed.card
    assert (card.api, card.role, card.host, card.port) == ("native", "aggregated", "127.0.0.1", running.port)
    assert card.model_path == running.info.model_path
    assert card.served_model_name == "tiny"
    assert card.tokenizer_path == running.info.tokenizer_path
    assert (card.block_size, card.dp_size, card.kv_events) == (1, 1, ())
    assert card.context_length == running.info.max_req_input_len
    assert (card.tool_call_parser, card.reasoning_parser) == ("qwen25", None)
    assert card.incremental_streaming is False
    assert isinstance(probed.client, NativeEngineClient)
    assert probed.client.incremental is False
    assert await probed.client.health()


async def test_incremental_engine_gets_a_client_that_expects_deltas(start_mock, pool):
    running = await start_mock(incremental_streaming_output=True)
    probed = await probe_engine(url(running), pool)
    assert probed.card.incremental_streaming is True
    assert isinstance(probed.client, NativeEngineClient) and probed.client.incremental is True


async def test_smg_only_engine_falls_back_to_the_smg_api(start_mock, pool):
    running = await start_mock(api="smg", page_size=4, context_length=2048)
    probed = await probe_engine(f"grpc://127.0.0.1:{running.port}", pool)
    assert probed.card.api == "smg"
    assert isinstance(probed.client, SmgEngineClient)
    assert probed.card.block_size == 4
    assert probed.card.context_length == running.info.max_req_input_len
    assert await probed.client.health()
    # A grpclib server answers an unknown method with UNKNOWN "Missing content-type header", real
    # SGLang servers with UNIMPLEMENTED: either way, asking for the native API fails.
    with pytest.raises(EngineError):
        await probe_engine(url(running), pool, api="native")


async def test_prefill_engine_card_carries_its_bootstrap_address(start_mock, pool):
    running = await start_mock(role="prefill", disaggregation_bootstrap_port=0)
    card = (await probe_engine(url(running), pool)).card
    assert card.role == "prefill"
    assert (card.bootstrap_host, card.bootstrap_port) == ("127.0.0.1", running.bootstrap_port)
    decode = (await probe_engine(url(await start_mock(role="decode")), pool)).card
    assert (decode.role, decode.bootstrap_port) == ("decode", None)


@pytest.mark.parametrize("api", ["both", "smg"])
async def test_dp_engine_with_kv_events_lists_one_source_per_rank(start_mock, pool, api):
    running = await start_mock(api=api, dp_size=2, page_size=4, kv_events_config=KV_EVENTS)
    card = (await probe_engine(url(running), pool)).card
    assert card.api == ("native" if api == "both" else "smg")
    assert (card.dp_size, card.kv_block_size) == (2, 4)
    base = running.kv_events["endpoint_port_base"]
    replay = running.kv_events["replay_endpoint_port_base"]
    assert [(s.dp_rank, s.endpoint, s.replay_endpoint) for s in card.kv_events] == [
        (0, f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{replay}"),
        (1, f"tcp://127.0.0.1:{base + 1}", f"tcp://127.0.0.1:{replay + 1}"),
    ]


async def test_a_vllm_engine_is_recognised_by_the_service_it_answers(start_mock, pool):
    running = await start_mock(
        api="vllm", role="prefill", dp_size=2, page_size=4, kv_events_config=KV_EVENTS, disaggregation_bootstrap_port=0
    )
    probed = await probe_engine(url(running), pool)
    card = probed.card
    assert isinstance(probed.client, VllmEngineClient) and card.api == "vllm"
    assert (card.role, card.dp_size, card.block_size, card.kv_block_size) == ("prefill", 2, 4, 4)
    assert card.context_length == running.info.context_length and card.served_model_name == "trio-direct-mock"
    assert card.kv_connector == "MockConnector" and dict(card.pairing)["block_size"] == "4"
    address = f"grpc://127.0.0.1:{running.port}"
    assert [(s.dp_rank, s.endpoint) for s in card.kv_events] == [(0, address), (1, address)]
    assert (card.bootstrap_host, card.bootstrap_port) == (None, None)  # the connector's parameters pair it
    assert await probed.client.health()
    assert probed.client.defaults == {}  # the tiny model's generation config sets no sampling defaults
    assert (await probe_engine(url(running), pool, api="vllm")).card.api == "vllm"
    with pytest.raises(EngineError):
        await probe_engine(url(running), pool, api="smg")
    with pytest.raises(EngineError):
        await probe_engine(url(await start_mock(api="both")), pool, api="vllm")


async def test_a_vllm_engine_hands_its_models_sampling_defaults_to_the_client(start_mock, pool, tiny_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.6, "top_k": 20}))
    running = await start_mock(api="vllm", model_path=str(model))
    client = (await probe_engine(url(running), pool)).client
    assert isinstance(client, VllmEngineClient) and client.defaults == {"temperature": 0.6, "top_k": 20}


async def test_engine_that_is_down_is_unavailable(pool, unused_port):
    with pytest.raises(EngineUnavailable):
        await probe_engine(f"127.0.0.1:{unused_port}", pool, timeout=2.0)


async def test_probe_command_prints_cards_as_json(start_mock, capsys):
    running = await start_mock(served_model_name="tiny")
    assert await probe_command([url(running)], "auto", 5.0) == 0
    [card] = json.loads(capsys.readouterr().out)  # one JSON array, for one URL too
    assert (card["served_model_name"], card["api"], card["port"]) == ("tiny", "native", running.port)


async def test_probe_command_reports_failures_and_still_prints_the_rest(start_mock, capsys, unused_port):
    running = await start_mock()
    rc = await probe_command([f"127.0.0.1:{unused_port}", url(running), "nonsense"], "auto", 2.0)
    assert rc == 1
    out, err = capsys.readouterr()
    assert [card["port"] for card in json.loads(out)] == [running.port]
    assert f"127.0.0.1:{unused_port}" in err and "nonsense" in err


# --- scripted servers: exact gRPC answers a mock engine does not give ------------------------------


async def serve_scripted(nursery, handlers: dict) -> int:
    """Serve native/SMG GetModelInfo and GetServerInfo with the given handlers; returns the port."""
    types = {
        native_api.GET_MODEL_INFO: (native_pb.GetModelInfoRequest, native_pb.GetModelInfoResponse),
        native_api.GET_SERVER_INFO: (native_pb.GetServerInfoRequest, native_pb.GetServerInfoResponse),
        smg_api.GET_MODEL_INFO: (smg_pb.GetModelInfoRequest, smg_pb.GetModelInfoResponse),
        smg_api.GET_SERVER_INFO: (smg_pb.GetServerInfoRequest, smg_pb.GetServerInfoResponse),
    }
    methods = [RpcMethod(path, False, req, resp, handlers[path]) for path, (req, resp) in types.items()]
    return await nursery.start(serve_grpc, methods, "127.0.0.1", 0)


def unimplemented(call):
    call.fail("UNIMPLEMENTED", "Method not found!")


def smg_model_info(call):
    call.send(smg_pb.GetModelInfoResponse(model_path="/models/m", served_model_name="m", max_req_input_len=4095))
    call.finish()


def smg_server_info(call):
    args = struct_pb2.Struct()
    args.update({"model_path": "/models/m", "page_size": 16, "dp_size": 1, "disaggregation_mode": "null"})
    call.send(smg_pb.GetServerInfoResponse(server_args=args, server_type="grpc"))
    call.finish()


async def test_unimplemented_native_api_falls_back_to_smg(aio_loop, nursery, pool):
    port = await serve_scripted(
        nursery,
        {
            native_api.GET_MODEL_INFO: unimplemented,
            native_api.GET_SERVER_INFO: unimplemented,
            smg_api.GET_MODEL_INFO: smg_model_info,
            smg_api.GET_SERVER_INFO: smg_server_info,
        },
    )
    card = (await probe_engine(f"127.0.0.1:{port}", pool)).card
    assert (card.api, card.served_model_name, card.block_size, card.context_length) == ("smg", "m", 16, 4095)


async def test_a_server_that_speaks_neither_api_is_unimplemented(aio_loop, nursery, pool):
    port = await serve_scripted(nursery, dict.fromkeys(
        [native_api.GET_MODEL_INFO, native_api.GET_SERVER_INFO, smg_api.GET_MODEL_INFO, smg_api.GET_SERVER_INFO],
        unimplemented,
    ))  # fmt: skip
    with pytest.raises(EngineUnimplemented):
        await probe_engine(f"127.0.0.1:{port}", pool)


async def test_an_engine_that_never_answers_times_the_probe_out(aio_loop, nursery, pool):
    silent = {path: (lambda call: None) for path in (
        native_api.GET_MODEL_INFO, native_api.GET_SERVER_INFO, smg_api.GET_MODEL_INFO, smg_api.GET_SERVER_INFO,
    )}  # fmt: skip
    port = await serve_scripted(nursery, silent)
    with pytest.raises(EngineDeadlineExceeded):
        await probe_engine(f"127.0.0.1:{port}", pool, timeout=0.3)
