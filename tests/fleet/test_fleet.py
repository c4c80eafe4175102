"""Connecting to a fleet of (mock) engines: waiting for late ones, refusing ones that disagree."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import trio

from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.fleet import Fleet, FleetError, FleetOverrides, fleet_model

CARD = EngineCard(
    url="http://10.0.0.0:30000", host="10.0.0.0", port=30000, api="native", role="aggregated",
    model_path="/m/qwen3", served_model_name="qwen3-8b", tokenizer_path="/m/qwen3-tok", block_size=16,
    context_length=4096, dp_size=1, bootstrap_host=None, bootstrap_port=None, kv_events=(), kv_block_size=16,
    incremental_streaming=True, tool_call_parser="qwen25", reasoning_parser="qwen3",
)  # fmt: skip


def url(running) -> str:
    return f"http://127.0.0.1:{running.port}"


# --- agreement rules (no engines needed) -----------------------------------------------------------


def cards(*changes):
    return [(f"e{i}", dataclasses.replace(CARD, url=f"http://10.0.0.{i}:30000", **c)) for i, c in enumerate(changes)]


def test_agreeing_engines_give_the_fleet_model():
    model = fleet_model(cards({}, {"context_length": 2048}, {"context_length": None}))
    assert (model.served_model_name, model.model_path, model.tokenizer_path) == ("qwen3-8b", "/m/qwen3", "/m/qwen3-tok")
    assert model.block_size == 16
    assert model.context_length == 2048  # the smallest, so a prompt that fits fits everywhere
    assert (model.tool_call_parser, model.reasoning_parser) == ("qwen25", "qwen3")


@pytest.mark.parametrize(
    ("change", "field", "flag"),
    [
        ({"served_model_name": "llama"}, "served_model_name 'llama'", "--served-model-name"),
        ({"model_path": "/m/llama"}, "model_path '/m/llama'", "--model-path"),
        ({"block_size": 32}, "block size (page_size) 32", "--page-size"),
    ],
)
def test_disagreeing_engines_are_refused_naming_engine_and_field(change, field, flag):
    with pytest.raises(FleetError) as caught:
        fleet_model(cards({}, {}, change))
    message = str(caught.value)
    assert message.startswith(f"engine e2 (http://10.0.0.2:30000) has {field}, but engine e0 (http://10.0.0.0:30000)")
    assert flag in message


def test_overrides_win_and_a_differing_probe_is_only_a_warning(caplog):
    overrides = FleetOverrides(model_path="/local/qwen3", served_model_name="chat", kv_cache_block_size=64)
    with caplog.at_level(logging.WARNING):
        model = fleet_model(cards({}, {"block_size": 32, "served_model_name": "other"}), overrides)
    assert (model.served_model_name, model.model_path, model.block_size) == ("chat", "/local/qwen3", 64)
    assert model.tokenizer_path == "/local/qwen3"
    assert "block size (page_size) 32; using the configured 64" in caplog.text


def test_unknown_block_sizes_are_not_a_disagreement_and_parsers_only_warn(caplog):
    with caplog.at_level(logging.WARNING):
        model = fleet_model(cards({"block_size": None}, {"tool_call_parser": "llama3"}, {"block_size": 16}))
    assert model.block_size == 16
    assert model.tool_call_parser == "qwen25"
    assert "tool_call_parser 'llama3'" in caplog.text


# --- connecting to engines -------------------------------------------------------------------------


async def test_fleet_of_agreeing_engines(start_mock, pool):
    engines = [await start_mock(served_model_name="tiny", page_size=4) for _ in range(2)]
    fleet = await Fleet.connect([url(e) for e in engines], pool, wait_timeout=5)
    assert [e.id for e in fleet.engines] == ["e0", "e1"]
    assert [e.card.port for e in fleet.engines] == [e.port for e in engines]
    assert all(e.healthy for e in fleet.engines)
    assert (fleet.model.served_model_name, fleet.model.block_size) == ("tiny", 4)
    assert fleet.model.context_length == engines[0].info.max_req_input_len


async def test_engines_serving_different_models_are_refused(start_mock, pool):
    a = await start_mock(served_model_name="tiny")
    b = await start_mock(served_model_name="other")
    with pytest.raises(FleetError, match=rf"engine e1 \({url(b)}\) has served_model_name 'other'"):
        await Fleet.connect([url(a), url(b)], pool, wait_timeout=5)


async def test_engines_with_different_block_sizes_are_refused_unless_overridden(start_mock, pool, caplog):
    a = await start_mock(page_size=1)
    b = await start_mock(page_size=16, api="smg")
    with pytest.raises(FleetError, match=r"engine e1 .* has block size \(page_size\) 16, .*--page-size"):
        await Fleet.connect([url(a), url(b)], pool, wait_timeout=5)
    fleet = await Fleet.connect(
        [url(a), url(b)], pool, wait_timeout=5, overrides=FleetOverrides(kv_cache_block_size=16)
    )
    assert fleet.model.block_size == 16
    assert [e.card.api for e in fleet.engines] == ["native", "smg"]


async def test_an_engine_started_late_joins_within_the_wait(start_mock, pool, unused_port, caplog, nursery):
    early = await start_mock()

    async def start_late():
        await trio.sleep(1.0)
        await start_mock(port=unused_port)

    nursery.start_soon(start_late)
    with caplog.at_level(logging.WARNING, logger="trio_direct.fleet.fleet"):
        fleet = await Fleet.connect([url(early), f"127.0.0.1:{unused_port}"], pool, wait_timeout=30)
    assert [e.card.port for e in fleet.engines] == [early.port, unused_port]
    retries = [r for r in caplog.records if "is not up yet" in r.getMessage()]
    assert len(retries) == 1 and "engine e1" in retries[0].getMessage()  # logged once, not per retry


async def test_an_engine_that_never_comes_up_fails_after_the_wait(start_mock, pool, unused_port):
    up = await start_mock()
    down = f"127.0.0.1:{unused_port}"
    with pytest.raises(FleetError, match=rf"engine e1 \({down}\) did not come up within 0.5s: cannot connect"):
        await Fleet.connect([url(up), down], pool, wait_timeout=0.5)


async def test_bad_and_repeated_urls_are_refused_before_dialling(pool):
    with pytest.raises(FleetError, match="engine e1: engine URL 'nowhere': no port"):
        await Fleet.connect(["127.0.0.1:1", "nowhere"], pool)
    with pytest.raises(FleetError, match=r"engine e1 \(grpc://127.0.0.1:5000\) is the same engine as e0"):
        await Fleet.connect(["127.0.0.1:5000", "grpc://127.0.0.1:5000"], pool)


async def test_workers_expand_dp_ranks_and_leave_out_prefill_and_unhealthy(start_mock, pool):
    dp = await start_mock(dp_size=2)
    single = await start_mock(role="decode")
    prefill = await start_mock(role="prefill", disaggregation_bootstrap_port=0)
    fleet = await Fleet.connect([url(dp), url(single), url(prefill)], pool, wait_timeout=5)
    assert [(w.engine.id, w.dp_rank) for w in fleet.workers()] == [("e0", 0), ("e0", 1), ("e1", None)]
    assert [(w.engine.id, w.dp_rank) for w in fleet.prefill_workers()] == [("e2", None)]
    fleet.engines[0].healthy = False
    assert [(w.engine.id, w.dp_rank) for w in fleet.workers()] == [("e1", None)]
