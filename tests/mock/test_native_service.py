"""The mock's native API (`sglang.runtime.v1.SglangService`) as a client sees it over gRPC."""

from __future__ import annotations

import json

import pytest
import trio
from support import wait_until
from tokenizers import Tokenizer

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.errors import EngineCancelled, EngineError, EngineInternal, EngineInvalidArgument
from trio_direct.engine.transport import EngineChannel

P = "/sglang.runtime.v1.SglangService/"
PROMPT = [718, 722, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
ALWAYS_KEYS = {
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "weight_version",
    "num_retractions",
    "reasoning_tokens",
    "dp_rank",
}


def gen(rid: str, *, stream: bool = False, prompt=PROMPT, **sampling) -> pb.GenerateRequest:
    sampling.setdefault("max_new_tokens", 8)
    return pb.GenerateRequest(input_ids=prompt, rid=rid, stream=stream, sampling_params=pb.SamplingParams(**sampling))


def meta(message: pb.GenerateResponse) -> dict:
    return {key: json.loads(value) for key, value in message.meta_info.items()}


async def collect(channel: EngineChannel, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=10) as stream:
        return [message async for message in stream]


async def server_info(channel: EngineChannel) -> dict:
    reply = await channel.unary(P + "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=5)
    return json.loads(reply.json_info)


@pytest.fixture
async def engine(mock_engine_factory):
    return await mock_engine_factory()


@pytest.fixture
def channel(engine, dial) -> EngineChannel:
    return dial(engine.port)


# --- Generate: message flow --------------------------------------------------------------------


async def test_cumulative_stream_repeats_all_ids_and_finishes_once(channel):
    messages = await collect(channel, gen("cumulative", stream=True, max_new_tokens=6, seed=1))

    assert len(messages) == 6
    assert [m.finished for m in messages] == [False] * 5 + [True]
    for i, message in enumerate(messages):
        assert len(message.output_ids) == i + 1  # every message repeats everything so far
        assert list(message.output_ids[:i]) == list(messages[i - 1].output_ids) if i else True
    assert meta(messages[-1])["finish_reason"] == {"type": "length", "length": 6}
    assert all(meta(m)["finish_reason"] is None for m in messages[:-1])


async def test_incremental_stream_sends_deltas_with_the_same_final_ids(mock_engine_factory, dial, channel):
    incremental = dial((await mock_engine_factory(incremental_streaming_output=True)).port)
    request = gen("same-ids", stream=True, max_new_tokens=7, seed=3)

    cumulative = await collect(channel, request)
    deltas = await collect(incremental, request)

    assert all(m.output_ids for m in deltas), "every message carries new ids (queued ones coalesced)"
    assert json.loads(deltas[-1].meta_info["completion_tokens"]) == 7
    assert [t for m in deltas for t in m.output_ids] == list(cumulative[-1].output_ids)
    assert deltas[-1].finished and not any(m.finished for m in deltas[:-1])
    info = await server_info(incremental)
    assert info["incremental_streaming_output"] is True
    assert (await server_info(channel))["incremental_streaming_output"] is False


async def test_non_stream_returns_one_full_message(channel):
    streamed = await collect(channel, gen("s", stream=True, seed=9))
    [message] = await collect(channel, gen("ns", seed=9))

    assert message.finished
    assert list(message.output_ids) == list(streamed[-1].output_ids)
    info = meta(message)
    assert {"response_sent_to_client_ts", "e2e_latency"} <= info.keys()


async def test_meta_info_is_json_with_sglang_keys(channel):
    messages = await collect(channel, gen("meta-keys", stream=True, max_new_tokens=3))

    for message in messages:
        assert message.meta_info.keys() >= ALWAYS_KEYS
        assert message.meta_info["id"] == '"meta-keys"'  # strings are JSON-quoted
        assert message.meta_info["weight_version"] == '"default"'
    first, last = meta(messages[0]), meta(messages[-1])
    assert "response_sent_to_client_ts" in first and "response_sent_to_client_ts" not in last
    assert "e2e_latency" in last and "e2e_latency" not in first
    assert last["dp_rank"] is None  # single-rank engine
    assert (last["prompt_tokens"], last["completion_tokens"]) == (len(PROMPT), 3)
    assert (last["num_retractions"], last["reasoning_tokens"]) == (0, 0)


async def test_usage_counts_and_cached_tokens_on_a_repeated_prompt(channel):
    prompt = list(range(100, 140))
    [first] = await collect(channel, gen("first", prompt=prompt, max_new_tokens=5))
    [second] = await collect(channel, gen("second", prompt=prompt, max_new_tokens=5))

    assert meta(first)["cached_tokens"] == 0
    assert 0 < meta(second)["cached_tokens"] < len(prompt)
    for message in (first, second):
        assert meta(message)["prompt_tokens"] == len(prompt)
        assert meta(message)["completion_tokens"] == len(message.output_ids) == 5


async def test_same_seed_same_tokens_other_seed_other_tokens(channel):
    a = await collect(channel, gen("seed-a", seed=11, max_new_tokens=12))
    b = await collect(channel, gen("seed-b", seed=11, max_new_tokens=12))
    c = await collect(channel, gen("seed-c", seed=12, max_new_tokens=12))

    assert a[0].output_ids == b[0].output_ids
    assert a[0].output_ids != c[0].output_ids


async def test_identical_requests_without_a_seed_differ_as_on_a_real_engine(channel):
    a = await collect(channel, gen("free-a", max_new_tokens=12, ignore_eos=True))
    b = await collect(channel, gen("free-b", max_new_tokens=12, ignore_eos=True))
    assert a[0].output_ids != b[0].output_ids


async def test_engines_with_the_same_seed_flag_answer_the_same_requests_alike(mock_engine_factory, dial):
    answers = []
    for _ in range(2):
        channel = dial((await mock_engine_factory(seed=42)).port)
        answers.append([(await collect(channel, gen(f"r{i}", max_new_tokens=8)))[0].output_ids for i in range(3)])
    assert answers[0] == answers[1]
    assert len({tuple(ids) for ids in answers[0]}) == 3


async def test_n_samples_get_their_own_rids(channel):
    messages = await collect(channel, gen("parent", n=3, max_new_tokens=4))

    assert len(messages) == 3
    assert [m.finished for m in messages] == [False, False, True]
    ids = {meta(m)["id"] for m in messages}
    assert len(ids) == 3 and "parent" not in ids
    assert len({tuple(m.output_ids) for m in messages}) == 3  # samples differ without a seed

    streamed = await collect(channel, gen("parent-s", stream=True, n=2, max_new_tokens=3))
    assert sum(m.finished for m in streamed) == 1 and streamed[-1].finished
    assert len({meta(m)["id"] for m in streamed}) == 2


# --- finish reasons ----------------------------------------------------------------------------


async def test_stop_token_finish_names_the_token(channel):
    [free] = await collect(channel, gen("free", seed=5, max_new_tokens=10, ignore_eos=True))
    target = free.output_ids[3]

    [stopped] = await collect(channel, gen("stopped", seed=5, max_new_tokens=10, stop_token_ids=[target]))

    assert meta(stopped)["finish_reason"] == {"type": "stop", "matched": target}
    assert stopped.output_ids[-1] == target
    assert list(stopped.output_ids) == list(free.output_ids[: len(stopped.output_ids)])


async def test_ignore_eos_also_disables_stop_token_ids(channel):
    [free] = await collect(channel, gen("free2", seed=5, max_new_tokens=10, ignore_eos=True))
    [ignored] = await collect(
        channel, gen("ignored", seed=5, max_new_tokens=10, ignore_eos=True, stop_token_ids=[free.output_ids[2]])
    )

    assert meta(ignored)["finish_reason"] == {"type": "length", "length": 10}


async def test_stop_string_with_the_tiny_tokenizer(channel, tiny_model):
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    [free] = await collect(channel, gen("free3", seed=21, max_new_tokens=16, ignore_eos=True))
    ids = list(free.output_ids)
    stop = next(
        text for i in range(2, len(ids)) if (text := tokenizer.decode([ids[i]], skip_special_tokens=True).strip())
    )

    [stopped] = await collect(channel, gen("stop-str", seed=21, max_new_tokens=16, ignore_eos=True, stop=[stop]))

    assert meta(stopped)["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop in tokenizer.decode(list(stopped.output_ids), skip_special_tokens=True)
    assert len(stopped.output_ids) < len(ids)


# --- errors ------------------------------------------------------------------------------------


async def test_prompt_too_long_is_internal_with_the_engine_message(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory(context_length=64)).port)

    with pytest.raises(EngineInternal, match=r"The input \(100 tokens\) is longer than the model's context length"):
        await collect(channel, gen("long", prompt=[7] * 100))


async def test_guided_decoding_validation_is_invalid_argument(channel):
    empty = pb.GenerateRequest(
        input_ids=PROMPT, rid="g", sampling_params=pb.SamplingParams(guided_decoding=pb.GuidedDecoding())
    )
    with pytest.raises(EngineInvalidArgument, match="guided decoding constraint must be specified"):
        await collect(channel, empty)
    with pytest.raises(EngineInvalidArgument, match="legacy regex must not be empty"):
        await collect(channel, gen("g2", regex=""))
    choice = pb.GuidedDecoding(choice=pb.ChoiceConstraint(values=["yes", ""]))
    with pytest.raises(EngineInvalidArgument, match="guided choice must contain only non-empty values"):
        await collect(channel, gen("g3", guided_decoding=choice))


async def test_max_thinking_tokens_is_rejected(channel):
    request = gen("think")
    request.max_thinking_tokens = 10
    with pytest.raises(EngineInternal, match="enable-strict-thinking"):
        await collect(channel, request)


# --- DP ----------------------------------------------------------------------------------------


async def test_dp_ranks_round_robin_routed_rank_and_get_load(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory(dp_size=2)).port)

    ranks = [meta((await collect(channel, gen(f"rr{i}")))[0])["dp_rank"] for i in range(4)]
    routed = gen("routed")
    routed.routed_dp_rank = 1
    [pinned] = await collect(channel, routed)
    bad = gen("bad-rank")
    bad.routed_dp_rank = 2

    assert sorted(ranks) == [0, 0, 1, 1]
    assert meta(pinned)["dp_rank"] == 1
    with pytest.raises(EngineInternal, match=r"routed_dp_rank=2 out of range \[0, 2\)"):
        await collect(channel, bad)

    async def load(**kwargs) -> list:
        reply = await channel.unary(P + "GetLoad", pb.GetLoadRequest(**kwargs), pb.GetLoadResponse, timeout=5)
        return json.loads(reply.json_info)

    everything = await load()
    assert [entry["dp_rank"] for entry in everything] == [0, 1]
    assert {"num_running_reqs", "num_waiting_reqs", "max_total_num_tokens", "token_usage"} <= everything[0].keys()
    assert [entry["dp_rank"] for entry in await load(dp_rank=1)] == [1]
    assert await load(dp_rank=7) == []


async def test_routed_rank_zero_is_ignored_on_a_single_rank_engine(channel):
    request = gen("zero")
    request.routed_dp_rank = 0
    [message] = await collect(channel, request)
    assert message.finished


# --- Abort and cancel --------------------------------------------------------------------------


async def _stream_until_aborted(channel, request, started: trio.Event, outcome: dict) -> None:
    """Consume a stream; record its messages and the error that ended it."""
    messages = []
    try:
        async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=30) as stream:
            async for message in stream:
                messages.append(message)
                started.set()
    except EngineError as exc:
        outcome["error"] = exc
    outcome["messages"] = messages
    started.set()


def long_request(rid: str) -> pb.GenerateRequest:
    return gen(rid, stream=True, max_new_tokens=20000, ignore_eos=True)


async def abort(channel, rid: str = "", abort_all: bool = False) -> pb.AbortResponse:
    request = pb.AbortRequest(rid=rid, abort_all=abort_all)
    return await channel.unary(P + "Abort", request, pb.AbortResponse, timeout=5)


async def test_abort_on_a_live_stream_ends_it_cancelled(mock_engine_factory, dial):
    running = await mock_engine_factory(speedup=1.0)
    channel = dial(running.port)
    started = trio.Event()
    outcome: dict = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stream_until_aborted, channel, long_request("victim"), started, outcome)
        await started.wait()
        reply = await abort(channel, "victim")

    assert reply.success
    assert isinstance(outcome["error"], EngineCancelled)
    assert outcome["error"].message == "Request aborted: victim"
    assert not any(m.finished for m in outcome["messages"])
    accounting = running.engine.accounting
    assert accounting.aborted == 1 and not accounting.live
    assert [rid for rid, _ in accounting.abort_rpcs] == ["victim"]


async def test_abort_needs_a_live_exact_rid_then_cascades_by_prefix(mock_engine_factory, dial):
    running = await mock_engine_factory(speedup=1.0)
    channel = dial(running.port)
    rids = ["job-1", "job-1-child", "job-2"]
    outcomes: dict[str, dict] = {rid: {} for rid in rids}
    async with trio.open_nursery() as nursery:
        for rid in rids:
            started = trio.Event()
            nursery.start_soon(_stream_until_aborted, channel, long_request(rid), started, outcomes[rid])
            await started.wait()

        await abort(channel, "job")  # a prefix of all three, but no live request is called "job"
        assert sorted(running.engine.accounting.live) == sorted(rids)

        await abort(channel, "job-1")  # exact match, then every rid starting with it
        await wait_until(lambda: "error" in outcomes["job-1"] and "error" in outcomes["job-1-child"])
        assert sorted(running.engine.accounting.live) == ["job-2"]

        await abort(channel, abort_all=True)

    assert all(isinstance(outcome["error"], EngineCancelled) for outcome in outcomes.values())
    assert outcomes["job-1-child"]["error"].message == "Request aborted: job-1-child"
    assert running.engine.accounting.aborted == 3


async def test_abort_with_empty_rid_is_invalid(channel):
    with pytest.raises(EngineInvalidArgument, match="Abort requires a non-empty rid unless abort_all is true"):
        await abort(channel, "")


async def test_client_cancel_aborts_the_request_in_the_engine(mock_engine_factory, dial):
    running = await mock_engine_factory(speedup=1.0)
    channel = dial(running.port)
    async with channel.open_stream(P + "Generate", long_request("walk-away"), pb.GenerateResponse, timeout=30) as s:
        async for _ in s:
            break  # leaving the block resets the stream

    accounting = running.engine.accounting
    await wait_until(lambda: accounting.cancelled == 1)
    assert not accounting.live and accounting.aborted == 0
    info = await server_info(channel)
    assert info["mock_accounting"]["cancelled"] == 1 and info["mock_accounting"]["live"] == []
    assert "walk-away" in info["mock_accounting"]["first_output_at"]


# --- info RPCs ---------------------------------------------------------------------------------


async def test_server_info_keys(engine, channel):
    info = await server_info(channel)

    assert info["status"] == "ready"
    assert info["port"] == info["grpc_port"] == engine.port
    assert (info["page_size"], info["dp_size"], info["tp_size"]) == (1, 1, 1)
    assert info["disaggregation_mode"] == "null"
    assert info["context_length"] is None
    assert info["max_req_input_len"] < info["max_total_num_tokens"]
    assert info["kv_events"] is None and info["kv_events_config"] is None
    assert info["tool_call_parser"] is None and info["reasoning_parser"] is None
    assert set(info["mock_accounting"]) >= {"started", "finished", "aborted", "cancelled", "failed", "live"}


async def test_accounting_is_hidden_unless_exposed(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory(expose_accounting=False, served_model_name="tiny")).port)
    info = await server_info(channel)
    assert "mock_accounting" not in info
    assert info["served_model_name"] == "tiny"


async def test_model_info_list_models_health_and_flush(engine, channel):
    model = await channel.unary(P + "GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout=5)
    models = await channel.unary(P + "ListModels", pb.ListModelsRequest(), pb.ListModelsResponse, timeout=5)
    health = await channel.unary(P + "HealthCheck", pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
    flushed = await channel.unary(P + "FlushCache", pb.FlushCacheRequest(), pb.FlushCacheResponse, timeout=5)

    details = json.loads(model.json_info)
    assert model.model_path == details["model_path"] == engine.info.model_path
    assert details["is_generation"] is True and details["disaggregation_mode"] == "null"
    assert [card.id for card in models.models] == [engine.info.served_model_name]
    assert models.models[0].max_model_len == engine.info.context_length
    assert health.healthy and flushed.success


async def test_tokenize_and_detokenize_round_trip(channel):
    tokens = await channel.unary(P + "Tokenize", pb.TokenizeRequest(text="Hello world"), pb.TokenizeResponse, timeout=5)
    text = await channel.unary(
        P + "Detokenize", pb.DetokenizeRequest(tokens=tokens.tokens), pb.DetokenizeResponse, timeout=5
    )

    assert tokens.count == len(tokens.tokens) > 0
    assert text.text == "Hello world"
    with pytest.raises(EngineInvalidArgument, match="non-negative"):
        await channel.unary(P + "Detokenize", pb.DetokenizeRequest(tokens=[-1]), pb.DetokenizeResponse, timeout=5)


async def test_watch_engine_state_sends_one_snapshot_and_stays_open(engine, channel):
    request = pb.WatchEngineStateRequest()
    async with channel.open_stream(P + "WatchEngineState", request, pb.EngineStateSnapshot, timeout=None) as s:
        snapshot = await s.__anext__()
        with trio.move_on_after(0.05):
            await s.__anext__()
            pytest.fail("a second snapshot arrived although nothing changed")

    assert snapshot.revision == 1 and snapshot.healthy and not snapshot.is_pause
    assert json.loads(snapshot.server_info.json_info)["port"] == engine.port


async def test_rpcs_the_mock_does_not_serve_are_unimplemented(channel):
    from trio_direct.engine.errors import EngineUnimplemented

    with pytest.raises(EngineUnimplemented):
        await channel.unary(P + "TextEmbed", pb.TextEmbedRequest(text="hi"), pb.TextEmbedResponse, timeout=5)


async def test_scripted_outputs_answer_matching_prompts_with_their_text(
    mock_engine_factory, dial, tmp_path, tiny_model
):
    from tokenizers import Tokenizer

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"match": "weather", "text": "It is sunny."}]))
    channel = dial((await mock_engine_factory(scripted_outputs=str(script), incremental_streaming_output=True)).port)
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    prompt = tokenizer.encode("What is the weather?").ids
    messages = await collect(channel, gen("scripted", stream=True, prompt=prompt, max_new_tokens=50))
    ids = [t for m in messages for t in m.output_ids]
    assert tokenizer.decode(ids) == "It is sunny."
    finish = json.loads(messages[-1].meta_info["finish_reason"])
    assert finish["type"] == "stop"
    other = await collect(channel, gen("sampled", stream=True, prompt=tokenizer.encode("Hello").ids, max_new_tokens=5))
    assert sum(len(m.output_ids) for m in other) == 5
