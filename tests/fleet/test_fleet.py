"""Connecting to a fleet of (mock) engines: waiting for late ones (but not for ever), refusing ones
that disagree, and admitting pending ones later."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from trio_direct.engine.errors import EngineUnavailable, EngineUnimplemented
from trio_direct.fleet import fleet as fleet_module
from trio_direct.fleet.card import EngineCard
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, FleetOverrides, PendingEngine, fleet_model
from trio_direct.fleet.probe import ProbedEngine

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


VLLM_PD = {
    "api": "vllm",
    "kv_connector": "NixlConnector",
    "pairing": (("kv_cache_dtype", "auto"), ("block_size", "16")),
}


@pytest.mark.parametrize(
    ("decode_change", "refused"),
    [
        ({}, None),
        ({"pairing": (("kv_cache_dtype", "fp8"), ("block_size", "16"))}, "kv_cache_dtype 'fp8'"),
        ({"kv_connector": "MooncakeConnector"}, "kv_connector 'MooncakeConnector'"),
        ({"pairing": (("kv_cache_dtype", "auto"), ("pairing_protocol", "v2"))}, None),  # v2 vs unset: unknown
        ({"api": "smg", "kv_connector": None, "pairing": ()}, "speaks the smg API"),
    ],
)
def test_vllm_prefill_and_decode_engines_that_cannot_hand_over_kv_are_refused(decode_change, refused):
    fleet = cards({**VLLM_PD, "role": "prefill"}, {**VLLM_PD, "role": "decode", **decode_change})
    if refused is None:
        assert fleet_model(fleet).block_size == 16
        return
    with pytest.raises(FleetError, match=refused):
        fleet_model(fleet)


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


async def test_an_engine_that_never_comes_up_is_left_pending(start_mock, pool, unused_port, caplog):
    up = await start_mock()
    down = f"127.0.0.1:{unused_port}"
    with caplog.at_level(logging.WARNING, logger="trio_direct.fleet.fleet"):
        fleet = await Fleet.connect([url(up), down], pool, wait_timeout=30, join_grace=0.3)
    assert [e.id for e in fleet.engines] == ["e0"]
    assert [(p.id, p.url) for p in fleet.pending] == [("e1", down)]
    assert "cannot connect" in fleet.pending[0].reason
    assert [e.id for e in (w.engine for w in fleet.workers())] == ["e0"]  # never routed to
    assert f"engine e1 ({down}) is not up yet; it joins when it comes up" in caplog.text


async def test_no_engine_up_within_the_wait_stops_start_up_naming_each(pool, unused_port):
    down = f"127.0.0.1:{unused_port}"
    with pytest.raises(FleetError, match=rf"^engine e0 \({down}\) did not come up within 0.5s: cannot connect"):
        await Fleet.connect([down], pool, wait_timeout=0.5)
    with pytest.raises(FleetError, match=r"engine e0 .* did not come up within 0.5s: .*; engine e1 .*did not come up"):
        await Fleet.connect([down, "127.0.0.1:1"], pool, wait_timeout=0.5)


async def test_an_engine_that_answers_but_cannot_be_used_stops_start_up_even_with_others_up(start_mock, pool):
    up = await start_mock()
    smg_only = await start_mock(api="smg")
    with pytest.raises(FleetError, match=rf"engine e1 \({url(smg_only)}\) (does not serve|cannot be used)"):
        await Fleet.connect([url(up), url(smg_only)], pool, api="native", wait_timeout=5, join_grace=5)


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


# --- the start-up rule, on a fake clock with fake probes --------------------------------------------


def probed(engine_url: str, **changes) -> ProbedEngine:
    card = dataclasses.replace(CARD, url=engine_url, **changes)
    return ProbedEngine(card, SimpleNamespace(name=engine_url))


@pytest.fixture
def engines_up_at(monkeypatch):
    """Replace probing: each URL answers from its time on (None: never; an exception: raised then)."""
    schedule: dict[str, float | tuple[float, Exception] | None] = {}

    async def fake_probe(engine_url, pool, *, api="auto", timeout=10.0):
        at = schedule[engine_url]
        if isinstance(at, tuple) and trio.current_time() >= at[0]:
            raise at[1]
        if at is None or isinstance(at, tuple) or trio.current_time() < at:
            raise EngineUnavailable(f"cannot connect to {engine_url}")
        return probed(engine_url)

    monkeypatch.setattr(fleet_module, "probe_engine", fake_probe)
    return schedule


URLS = ["h:1", "h:2", "h:3"]
#: No channels: these tests replace probing (the `engines_up_at` fixture).
NO_POOL: Any = None


async def test_start_up_goes_as_soon_as_every_engine_is_up(autojump_clock, engines_up_at):
    engines_up_at.update({"h:1": 0.0, "h:2": 1.0, "h:3": 2.5})
    fleet = await Fleet.connect(URLS, pool=NO_POOL, wait_timeout=120, join_grace=5)
    assert [e.id for e in fleet.engines] == ["e0", "e1", "e2"] and not fleet.pending
    assert trio.current_time() < 5  # the retries' backoff, not the grace


async def test_start_up_waits_only_the_grace_after_the_first_engine_is_up(autojump_clock, engines_up_at):
    engines_up_at.update({"h:1": 10.0, "h:2": None, "h:3": 11.0})
    fleet = await Fleet.connect(URLS, pool=NO_POOL, wait_timeout=120, join_grace=5)
    assert [e.id for e in fleet.engines] == ["e0", "e2"]
    assert [(p.id, p.url) for p in fleet.pending] == [("e1", "h:2")]
    first_up = 11.2  # the retry after 10 s (0.2 s doubling to 5 s: ..., 6.2, 11.2)
    assert trio.current_time() == pytest.approx(first_up + 5)


async def test_start_up_never_waits_past_the_timeout(autojump_clock, engines_up_at):
    engines_up_at.update({"h:1": 0.0, "h:2": None, "h:3": None})
    await Fleet.connect(URLS, pool=NO_POOL, wait_timeout=2, join_grace=60)
    assert trio.current_time() == pytest.approx(2)
    engines_up_at.update({"h:1": None})
    expected = r"engine e0 \(h:1\) did not come up within 2s: cannot connect to h:1; engine e1"
    with pytest.raises(FleetError, match=expected):
        await Fleet.connect(URLS, pool=NO_POOL, wait_timeout=2, join_grace=60)


async def test_an_unusable_engine_stops_start_up_during_the_grace(autojump_clock, engines_up_at):
    engines_up_at.update({"h:1": 0.0, "h:2": (3.0, EngineUnimplemented("unknown service")), "h:3": None})
    with pytest.raises(FleetError, match=r"engine e1 \(h:2\) does not serve the native or the SMG gRPC API"):
        await Fleet.connect(URLS, pool=NO_POOL, wait_timeout=120, join_grace=5)


# --- joining after start-up (no engines needed) ----------------------------------------------------


def fleet_with_pending(*pending_ids: str, overrides: FleetOverrides | None = None) -> Fleet:
    members = [f"e{i}" for i in range(3) if f"e{i}" not in pending_ids]
    engines = [Engine(i, dataclasses.replace(CARD, url=f"h:{i}"), SimpleNamespace()) for i in members]
    model = fleet_model([(e.id, e.card) for e in engines], overrides)
    return Fleet(engines, model, [PendingEngine(i, f"h:{i}") for i in pending_ids], overrides)


def test_a_pending_engine_that_agrees_joins_in_url_order_keeping_its_id():
    fleet = fleet_with_pending("e0", "e2")
    e2 = fleet.join(fleet.pending[1], probed("h:e2"))
    e0 = fleet.join(fleet.pending[0], probed("h:e0", context_length=1024))
    assert [e.id for e in fleet.engines] == ["e0", "e1", "e2"]
    assert fleet.engines[0] is e0 and fleet.engines[2] is e2 and e0.healthy
    assert not fleet.pending
    assert fleet.model.context_length == 1024  # a prompt that fits still fits everywhere


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"served_model_name": "llama"}, r"engine e1 \(h:e1\) has served_model_name 'llama', but engine e0"),
        ({"block_size": 32}, r"block size \(page_size\) 32"),
        ({"model_path": "/m/other"}, r"model_path '/m/other'"),
    ],
)
def test_a_pending_engine_that_disagrees_is_refused_and_stays_pending(change, message):
    fleet = fleet_with_pending("e1")
    before = fleet.model
    with pytest.raises(FleetError, match=message):
        fleet.join(fleet.pending[0], probed("h:e1", **change))
    assert [e.id for e in fleet.engines] == ["e0", "e2"] and [p.id for p in fleet.pending] == ["e1"]
    assert fleet.model is before


def test_overrides_apply_to_joining_engines_too_and_the_frontend_check_has_the_last_word():
    fleet = fleet_with_pending("e1", overrides=FleetOverrides(served_model_name="chat"))
    pending = fleet.pending[0]

    def refuse(engine: Engine) -> None:
        raise FleetError(f"{engine.id} is in the wrong flag")

    with pytest.raises(FleetError, match="e1 is in the wrong flag"):
        fleet.join(pending, probed("h:e1", served_model_name="other"), check=refuse)
    assert fleet.pending == [pending]
    joined = fleet.join(pending, probed("h:e1", served_model_name="other"))
    assert joined.id == "e1" and fleet.model.served_model_name == "chat"


def test_embedding_and_generation_engines_do_not_form_one_fleet():
    assert fleet_model(cards({"is_embedding": True}, {"is_embedding": True})).is_embedding
    with pytest.raises(FleetError, match="is_embedding"):
        fleet_model(cards({"is_embedding": True}, {}))


def test_the_fleet_takes_images_only_if_every_engine_does():
    assert fleet_model(cards({"supports_images": True}, {"supports_images": True})).supports_images
    assert not fleet_model(cards({"supports_images": True}, {})).supports_images
