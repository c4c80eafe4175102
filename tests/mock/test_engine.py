"""The mock engine's trio shell: request lifecycle, accounting, DP ranks and PD legs."""

from __future__ import annotations

import json
import math

import pytest
import trio
import trio.lowlevel
from support import wait_until

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct._proto.smg import sglang_scheduler_pb2 as smg
from trio_direct.engine.errors import EngineCancelled, EngineError, EngineInternal
from trio_direct.mock.engine import MockEngine
from trio_direct.mock.scheduler import MockRequest, RequestOutput, SchedulerConfig

P = "/sglang.runtime.v1.SglangService/"
PROMPT = list(range(20, 60))


class Sink:
    def __init__(self) -> None:
        self.outputs: list[tuple[RequestOutput, int]] = []
        self.aborts: list[str] = []

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        self.outputs.append((out, dp_rank))

    def aborted(self, rid: str) -> None:
        self.aborts.append(rid)

    def finished(self, rid: str) -> bool:
        return any(out.rid == rid and out.finish is not None for out, _ in self.outputs)


def request(rid: str, max_new_tokens: int = 4, **kwargs) -> MockRequest:
    return MockRequest(rid=rid, input_ids=list(PROMPT), max_new_tokens=max_new_tokens, ignore_eos=True, **kwargs)


@pytest.fixture
async def engine():
    config = SchedulerConfig(vocab_size=500, speedup=math.inf, eos_token_ids=frozenset({2}))
    engine = MockEngine(config, dp_size=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        yield engine
        nursery.cancel_scope.cancel()


# --- lifecycle and accounting (no gRPC) ----------------------------------------------------------


async def test_outputs_reach_the_sink_and_are_counted(engine):
    sink = Sink()
    ranks = engine.submit([request("a"), request("b")], sink, api="native")
    await wait_until(lambda: sink.finished("a") and sink.finished("b"))

    assert sorted(ranks) == [0, 1]  # round robin over the ranks
    assert {rank for out, rank in sink.outputs if out.rid == "a"} == {ranks[0]}
    accounting = engine.accounting
    assert (accounting.started, accounting.finished, accounting.live) == (2, 2, set())
    assert set(accounting.first_output_at) == {"a", "b"}
    assert accounting.to_json()["live"] == []


async def test_rejected_batch_leaves_nothing_behind(engine):
    sink = Sink()
    too_long = MockRequest(rid="x2", input_ids=[5] * 40000, max_new_tokens=1)
    with pytest.raises(ValueError, match="context length"):
        engine.submit([request("x1"), too_long], sink, api="native")
    with pytest.raises(ValueError, match=r"routed_dp_rank=5 out of range \[0, 2\)"):
        engine.submit([request("x3")], sink, api="native", routed_dp_rank=5)

    assert engine.accounting.started == 0 and engine.accounting.rejected == 3
    assert all(load["num_waiting_reqs"] == 0 for load in engine.loads())


async def test_native_abort_acts_only_on_an_exact_live_rid(engine):
    sink = Sink()
    engine.submit([request("abc", 10**4 - len(PROMPT)), request("abcd", 10**4 - len(PROMPT))], sink, api="native")

    assert engine.abort("ab", exact_first=True) == []
    assert engine.accounting.live == {"abc", "abcd"}
    assert sorted(engine.abort("abc", exact_first=True)) == ["abc", "abcd"]
    assert sorted(sink.aborts) == ["abc", "abcd"]
    assert engine.accounting.aborted == 2 and not engine.accounting.live
    assert [rid for rid, _ in engine.accounting.abort_rpcs] == ["ab", "abc"]


async def test_smg_abort_is_prefix_only_and_empty_matches_all(engine):
    sink = Sink()
    engine.submit([request("r-1", 9000), request("q-2", 9000)], sink, api="smg")

    assert engine.abort("r", exact_first=False) == ["r-1"]
    assert engine.abort("", exact_first=False) == ["q-2"]
    assert not engine.accounting.live


async def test_cancel_counts_cancelled_not_aborted(engine):
    sink = Sink()
    engine.submit([request("mine", 9000)], sink, api="native")
    engine.cancel(["mine"])

    assert engine.accounting.cancelled == 1 and engine.accounting.aborted == 0
    assert sink.aborts == [] and not engine.accounting.live
    await trio.lowlevel.checkpoint()  # the rank loop runs on without the request
    assert not sink.finished("mine")


async def test_flush_cache_is_refused_while_requests_run(engine):
    sink = Sink()
    engine.submit([request("busy", 9000)], sink, api="native")
    assert not engine.flush_cache()
    engine.cancel(["busy"])
    assert engine.flush_cache()


# --- PD: two engines, real bootstrap rendezvous --------------------------------------------------


def pd_request(rid: str, bootstrap_port: int, room: int, **sampling) -> pb.GenerateRequest:
    sampling.setdefault("max_new_tokens", 5)
    return pb.GenerateRequest(
        input_ids=PROMPT,
        rid=rid,
        stream=True,
        sampling_params=pb.SamplingParams(**sampling),
        disaggregated_params=pb.DisaggregatedParams(
            bootstrap_host="127.0.0.1", bootstrap_port=bootstrap_port, bootstrap_room=room
        ),
    )


async def run_leg(channel, request, outcome: dict) -> None:
    messages = []
    try:
        async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=30) as stream:
            async for message in stream:
                messages.append(message)
    except EngineError as exc:
        outcome["error"] = exc
    outcome["messages"] = messages


def finish(outcome: dict) -> dict:
    return json.loads(outcome["messages"][-1].meta_info["finish_reason"])


@pytest.fixture
async def pd(mock_engine_factory, dial):
    """A prefill and a decode engine with short bootstrap timeouts, and channels to both."""

    async def start(**overrides):
        prefill = await mock_engine_factory(role="prefill", **overrides)
        decode = await mock_engine_factory(role="decode", **overrides)
        return prefill, decode, dial(prefill.port), dial(decode.port)

    return start


@pytest.mark.parametrize("first", ["prefill", "decode"])
async def test_pd_legs_meet_in_either_order(pd, first):
    prefill, decode, to_prefill, to_decode = await pd(bootstrap_timeout=10)
    request = pd_request("pd-1", prefill.bootstrap_port, room=4242)
    legs: dict[str, tuple] = {"prefill": (prefill, to_prefill, {}), "decode": (decode, to_decode, {})}
    second = "decode" if first == "prefill" else "prefill"

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            running, channel, outcome = legs[first]
            nursery.start_soon(run_leg, channel, request, outcome)
            await wait_until(lambda: running.engine.accounting.started == 1)
            running, channel, outcome = legs[second]
            nursery.start_soon(run_leg, channel, request, outcome)

    prefill_out, decode_out = legs["prefill"][2], legs["decode"][2]
    assert "error" not in prefill_out and "error" not in decode_out
    [prefill_message] = prefill_out["messages"]
    assert finish(prefill_out) == {"type": "length", "length": 0}
    assert list(prefill_message.output_ids) == [] and prefill_message.finished
    assert finish(decode_out) == {"type": "length", "length": 5}
    assert len(decode_out["messages"][-1].output_ids) == 5
    assert json.loads(decode_out["messages"][-1].meta_info["cached_tokens"]) == len(PROMPT)
    assert not prefill.bootstrap.pending_rooms


async def test_pd_samples_pair_by_room_plus_index(pd):
    prefill, decode, to_prefill, to_decode = await pd(bootstrap_timeout=10)
    request = pd_request("pd-n", prefill.bootstrap_port, room=500, n=2, max_new_tokens=3)
    prefill_out: dict = {}
    decode_out: dict = {}

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_leg, to_prefill, request, prefill_out)
            nursery.start_soon(run_leg, to_decode, request, decode_out)

    assert "error" not in prefill_out and "error" not in decode_out
    finishes = [json.loads(m.meta_info["finish_reason"]) for m in decode_out["messages"]]
    assert [f for f in finishes if f] == [{"type": "length", "length": 3}] * 2
    assert decode.engine.accounting.finished == prefill.engine.accounting.finished == 2


@pytest.mark.parametrize("alone", ["prefill", "decode"])
async def test_pd_leg_without_partner_fails_after_the_bootstrap_timeout(pd, alone):
    prefill, decode, to_prefill, to_decode = await pd(bootstrap_timeout=0.3)
    running, channel = (prefill, to_prefill) if alone == "prefill" else (decode, to_decode)
    outcome: dict = {}

    with trio.fail_after(10):
        await run_leg(channel, pd_request("lonely", prefill.bootstrap_port, room=7), outcome)

    assert "error" not in outcome  # an engine-side abort ends the stream normally
    reason = finish(outcome)
    assert reason["type"] == "abort" and reason["status_code"] == 500
    assert "bootstrap" in reason["message"]
    assert running.engine.accounting.failed == 1 and not running.engine.accounting.live


async def test_aborting_the_prefill_leg_fails_the_decode_leg(pd):
    # A slow prefill (low speedup, long prompt) keeps the paired legs waiting for the transfer.
    prefill, decode, to_prefill, to_decode = await pd(bootstrap_timeout=30, speedup=0.05)
    long_prompt = pd_request("pair", prefill.bootstrap_port, room=99)
    long_prompt.input_ids[:] = list(range(3, 3 + 4000))
    decode_out: dict = {}
    prefill_out: dict = {}

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_leg, to_decode, long_prompt, decode_out)
            await wait_until(lambda: prefill.bootstrap.open_connections == 1)
            nursery.start_soon(run_leg, to_prefill, long_prompt, prefill_out)
            await wait_until(lambda: prefill.engine.accounting.started == 1)
            await to_prefill.unary(P + "Abort", pb.AbortRequest(rid="pair"), pb.AbortResponse, timeout=5)

    assert isinstance(prefill_out["error"], EngineCancelled)
    reason = finish(decode_out)
    assert reason["type"] == "abort" and reason["status_code"] == 500
    assert decode.engine.accounting.failed == 1 and not decode.engine.accounting.live


async def test_cancelling_the_decode_leg_fails_the_prefill_leg(pd):
    prefill, decode, to_prefill, to_decode = await pd(bootstrap_timeout=30, speedup=0.05)
    request = pd_request("pair2", prefill.bootstrap_port, room=100)
    request.input_ids[:] = list(range(3, 3 + 2000))
    prefill_out: dict = {}

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            async with to_decode.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=30):
                await wait_until(lambda: prefill.bootstrap.open_connections == 1)
                nursery.start_soon(run_leg, to_prefill, request, prefill_out)
                await wait_until(lambda: prefill.engine.accounting.started == 1)
            # leaving the block cancels the decode leg

    assert finish(prefill_out)["type"] == "abort"
    await wait_until(lambda: decode.engine.accounting.cancelled == 1)
    assert prefill.engine.accounting.failed == 1


async def test_pd_request_without_a_room_is_aborted_like_sglang(pd):
    prefill, decode, to_prefill, to_decode = await pd()
    plain = pb.GenerateRequest(input_ids=PROMPT, rid="no-room", stream=True)
    outcome: dict = {}
    await run_leg(to_decode, plain, outcome)

    reason = finish(outcome)
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert "bootstrap" in reason["message"] or "boostrap" in reason["message"]
    non_stream = pb.GenerateRequest(input_ids=PROMPT, rid="no-room-2")
    with pytest.raises(EngineInternal):
        async with to_prefill.open_stream(P + "Generate", non_stream, pb.GenerateResponse, timeout=5) as stream:
            [_ async for _ in stream]


async def test_smg_health_probes_need_no_transfer_on_pd_engines(mock_engine_factory, dial):
    for role in ("prefill", "decode"):
        running = await mock_engine_factory(role=role, api="smg", bootstrap_timeout=0.2)
        reply = await dial(running.port).unary(
            "/sglang.grpc.scheduler.SglangScheduler/HealthCheck",
            smg.HealthCheckRequest(),
            smg.HealthCheckResponse,
            timeout=5,
        )
        assert reply.healthy, role
        await wait_until(lambda: not running.engine.accounting.live)
        assert running.engine.accounting.failed == 0


async def test_smg_pd_pair_streams_from_decode_and_prefill_completes_with_length(pd):
    prefill, decode, to_prefill, to_decode = await pd(api="smg", bootstrap_timeout=10)
    request = smg.GenerateRequest(
        request_id="smg-pd",
        tokenized=smg.TokenizedInput(input_ids=PROMPT),
        sampling_params=smg.SamplingParams(temperature=1.0, max_new_tokens=4),
        stream=True,
        disaggregated_params=smg.DisaggregatedParams(
            bootstrap_host="127.0.0.1", bootstrap_port=prefill.bootstrap_port, bootstrap_room=31
        ),
    )
    path = "/sglang.grpc.scheduler.SglangScheduler/Generate"
    results: dict[str, list] = {}

    async def leg(name, channel) -> None:
        async with channel.open_stream(path, request, smg.GenerateResponse, timeout=10) as stream:
            results[name] = [message async for message in stream]

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leg, "prefill", to_prefill)
            nursery.start_soon(leg, "decode", to_decode)

    assert results["prefill"][-1].complete.finish_reason == "length"
    assert results["prefill"][-1].complete.completion_tokens == 0
    assert results["decode"][-1].complete.completion_tokens == 4
    assert sum(len(m.chunk.token_ids) for m in results["decode"] if m.WhichOneof("response") == "chunk") == 4


async def test_server_info_reports_the_pd_role_and_bootstrap_port(pd):
    prefill, decode, to_prefill, to_decode = await pd()
    reply = await to_prefill.unary(P + "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=5)
    info = json.loads(reply.json_info)
    assert info["disaggregation_mode"] == "prefill"
    assert info["disaggregation_bootstrap_port"] == prefill.bootstrap_port
    reply = await to_decode.unary(P + "GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout=5)
    assert json.loads(reply.json_info)["disaggregation_mode"] == "decode"


# --- KV events over ZMQ ----------------------------------------------------------------------------


async def test_engine_publishes_kv_events_on_each_ranks_port(mock_engine_factory, dial):
    import zmq

    from trio_direct.mock.kv_publisher import decode_batch
    from trio_direct.mock.kv_types import BlockStored
    from trio_direct.zmqio import TrioSocket

    kv_config = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv"})
    running = await mock_engine_factory(dp_size=2, page_size=2, kv_events_config=kv_config)
    channel = dial(running.port)
    reply = await channel.unary(P + "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=5)
    info = json.loads(reply.json_info)
    descriptor = info["kv_events"]
    assert descriptor == running.kv_events
    assert (descriptor["block_size"], descriptor["dp_size"], descriptor["topic"]) == (2, 2, "kv")
    assert [source["dp_rank"] for source in info["kv_event_sources"]] == [0, 1]
    assert json.loads(info["kv_events_config"])["endpoint"].endswith(f":{descriptor['endpoint_port_base']}")

    with TrioSocket(zmq.Context.instance(), zmq.SUB) as sub:
        sub.connect(f"tcp://127.0.0.1:{descriptor['endpoint_port_base'] + 1}")
        sub.subscribe(b"kv")
        stored: list[BlockStored] = []
        with trio.fail_after(10):
            attempt = 0
            while not stored:  # a SUB misses what is published before it joined: retry
                attempt += 1
                prompt = [100 + attempt, *range(30, 37)]  # four full pages, new each time
                request = pb.GenerateRequest(
                    input_ids=prompt,
                    rid=f"kv-{attempt}",
                    routed_dp_rank=1,
                    sampling_params=pb.SamplingParams(max_new_tokens=1),
                )
                async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=5) as s:
                    [_ async for _ in s]
                with trio.move_on_after(0.2):
                    topic, _seq, payload = await sub.recv_multipart()
                    assert topic == b"kv"
                    _ts, events, rank = decode_batch(payload)
                    assert rank == 1
                    stored = [event for event in events if isinstance(event, BlockStored)]
    assert stored[0].block_size == 2
    assert len(stored[0].token_ids) == 2 * len(stored[0].block_hashes)
