"""The mock's SMG API (`sglang.grpc.scheduler.SglangScheduler`) as smg / sglang-router see it."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pytest
import trio
from grpclib.health.v1 import health_pb2
from support import wait_until

from trio_direct._proto.smg import common_pb2 as common
from trio_direct._proto.smg import sglang_scheduler_pb2 as pb
from trio_direct.engine.errors import EngineError, EngineInvalidArgument, EngineUnimplemented
from trio_direct.engine.transport import EngineChannel
from trio_direct.mock.kv_types import block_hash_chain

P = "/sglang.grpc.scheduler.SglangScheduler/"
PROMPT = [718, 722, 40, 41, 42, 43, 44, 45, 46, 47]


def gen(request_id: str, *, stream: bool = False, prompt=PROMPT, **sampling) -> pb.GenerateRequest:
    sampling.setdefault("max_new_tokens", 6)
    sampling.setdefault("temperature", 1.0)
    return pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=prompt),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
        logprob_start_len=-1,
    )


async def collect(channel: EngineChannel, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=10) as stream:
        return [message async for message in stream]


async def unary(channel: EngineChannel, name: str, request, response_type):
    return await channel.unary(P + name, request, response_type, timeout=5)


@pytest.fixture
async def engine(mock_engine_factory):
    return await mock_engine_factory(api="smg")


@pytest.fixture
def channel(engine, dial) -> EngineChannel:
    return dial(engine.port)


# --- Generate ----------------------------------------------------------------------------------


async def test_stream_is_delta_chunks_then_a_final_chunk_then_complete(channel):
    messages = await collect(channel, gen("s-1", stream=True, max_new_tokens=5))

    kinds = [m.WhichOneof("response") for m in messages]
    assert kinds == ["chunk"] * 5 + ["complete"]
    chunks = [m.chunk for m in messages[:-1]]
    complete = messages[-1].complete
    assert [len(c.token_ids) for c in chunks] == [1] * 5  # deltas
    assert [c.completion_tokens for c in chunks] == [1, 2, 3, 4, 5]  # cumulative counts
    assert list(complete.output_ids) == list(chunks[-1].token_ids)  # repeats the last delta
    # A client that accumulates chunks and takes only counts from `complete` does not double count.
    assert sum(len(c.token_ids) for c in chunks) == complete.completion_tokens == 5
    assert complete.finish_reason == "length" and complete.prompt_tokens == len(PROMPT)
    assert all(m.request_id == "s-1" for m in messages)


async def test_non_stream_is_one_complete_with_all_ids(channel):
    # The SMG API has no seed: greedy requests are the repeatable ones.
    streamed = await collect(channel, gen("s-2", stream=True, max_new_tokens=5, temperature=0.0))
    [message] = await collect(channel, gen("ns-2", max_new_tokens=5, temperature=0.0))

    assert message.WhichOneof("response") == "complete"
    assert list(message.complete.output_ids) == [t for m in streamed[:-1] for t in m.chunk.token_ids]


async def test_n_samples_are_tagged_by_index(channel):
    messages = await collect(channel, gen("multi", n=2, max_new_tokens=3))

    assert [m.complete.index for m in messages] == [0, 1]
    streamed = await collect(channel, gen("multi-s", stream=True, n=2, max_new_tokens=3))
    assert sorted(m.complete.index for m in streamed if m.WhichOneof("response") == "complete") == [0, 1]


async def test_matched_stop_token_and_stop_string(channel, tiny_model):
    from tokenizers import Tokenizer

    greedy: dict = {"max_new_tokens": 12, "temperature": 0.0}  # repeatable: the SMG API has no seed
    [free] = await collect(channel, gen("free", ignore_eos=True, **greedy))
    ids = list(free.complete.output_ids)
    [by_token] = await collect(channel, gen("tok", stop_token_ids=[ids[4]], **greedy))
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    text = next(t for i in range(2, len(ids)) if (t := tokenizer.decode([ids[i]], skip_special_tokens=True).strip()))
    [by_text] = await collect(channel, gen("str", ignore_eos=True, stop=[text], **greedy))

    assert by_token.complete.finish_reason == "stop"
    assert by_token.complete.WhichOneof("matched_stop") == "matched_token_id"
    assert by_token.complete.matched_token_id == ids[4]
    assert by_text.complete.finish_reason == "stop"
    assert by_text.complete.matched_stop_str == text


async def test_zero_temperature_is_greedy_and_repeatable(channel):
    a = await collect(channel, gen("g-a", temperature=0.0, max_new_tokens=8))
    b = await collect(channel, gen("g-b", temperature=0.0, max_new_tokens=8))
    assert a[0].complete.output_ids == b[0].complete.output_ids


async def test_generate_without_tokenized_input_is_invalid(channel):
    request = pb.GenerateRequest(request_id="no-tokens", sampling_params=pb.SamplingParams(max_new_tokens=3))
    with pytest.raises(EngineInvalidArgument, match="Tokenized input must be provided"):
        await collect(channel, request)


async def test_prompt_too_long_is_invalid_argument(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory(api="smg", context_length=32)).port)
    with pytest.raises(EngineInvalidArgument, match="longer than the model's context length"):
        await collect(channel, gen("long", prompt=[7] * 40))


async def test_cached_tokens_on_a_repeated_prompt(channel):
    prompt = list(range(200, 230))
    [first] = await collect(channel, gen("c-1", prompt=prompt))
    [second] = await collect(channel, gen("c-2", prompt=prompt))
    assert first.complete.cached_tokens == 0 < second.complete.cached_tokens


# --- Abort and cancel --------------------------------------------------------------------------


async def _consume(channel, request, started: trio.Event, outcome: dict) -> None:
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


def long_request(request_id: str) -> pb.GenerateRequest:
    return gen(request_id, stream=True, max_new_tokens=20000, ignore_eos=True)


async def test_abort_leaves_a_running_stream_silent(mock_engine_factory, dial):
    running = await mock_engine_factory(api="smg", speedup=1.0)
    channel = dial(running.port)
    started = trio.Event()
    outcome: dict = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_consume, channel, long_request("quiet"), started, outcome)
        await started.wait()
        reply = await unary(channel, "Abort", pb.AbortRequest(request_id="quiet", reason="test"), pb.AbortResponse)

    assert reply.success and reply.message == "Request quiet aborted"
    assert "error" not in outcome  # the call ends OK ...
    assert all(m.WhichOneof("response") == "chunk" for m in outcome["messages"])  # ... with no complete
    assert running.engine.accounting.aborted == 1 and not running.engine.accounting.live


async def test_abort_cascade_reaches_other_streams_as_an_abort_finish(mock_engine_factory, dial):
    running = await mock_engine_factory(api="smg", speedup=1.0)
    channel = dial(running.port)
    named: dict = {}
    cascaded: dict = {}
    async with trio.open_nursery() as nursery:
        for request_id, outcome in (("req-1", named), ("req-10", cascaded)):
            started = trio.Event()
            nursery.start_soon(_consume, channel, long_request(request_id), started, outcome)
            await started.wait()
        await unary(channel, "Abort", pb.AbortRequest(request_id="req-1"), pb.AbortResponse)

    assert "error" not in named and "error" not in cascaded
    assert named["messages"][-1].WhichOneof("response") == "chunk"
    last = cascaded["messages"][-1]
    assert last.WhichOneof("response") == "complete" and last.complete.finish_reason == "abort"
    assert running.engine.accounting.aborted == 2


async def test_health_check_ids_cannot_be_aborted(channel):
    reply = await unary(channel, "Abort", pb.AbortRequest(request_id="HEALTH_CHECK_123"), pb.AbortResponse)
    assert not reply.success


async def test_cancel_aborts_the_request(mock_engine_factory, dial):
    running = await mock_engine_factory(api="smg", speedup=1.0)
    channel = dial(running.port)
    async with channel.open_stream(P + "Generate", long_request("gone"), pb.GenerateResponse, timeout=30) as s:
        async for _ in s:
            break
    await wait_until(lambda: running.engine.accounting.cancelled == 1)
    assert not running.engine.accounting.live


# --- management --------------------------------------------------------------------------------


async def test_health_check_runs_a_probe_generation(engine, channel):
    reply = await unary(channel, "HealthCheck", pb.HealthCheckRequest(), pb.HealthCheckResponse)
    assert reply.healthy
    await wait_until(lambda: not engine.engine.accounting.live)  # the one-token probe finished


async def test_model_info_keeps_the_servicer_fallback_constants(engine, channel):
    info = await unary(channel, "GetModelInfo", pb.GetModelInfoRequest(), pb.GetModelInfoResponse)

    assert info.served_model_name == engine.info.served_model_name
    assert info.model_path == info.tokenizer_path == engine.info.model_path
    assert info.max_context_length == engine.info.max_total_num_tokens  # KV pool size, not context
    assert (info.vocab_size, list(info.eos_token_ids)) == (128256, [])
    assert (info.pad_token_id, info.bos_token_id) == (0, 1)
    assert info.is_generation and info.max_req_input_len == engine.info.max_req_input_len
    assert info.model_type == "qwen2" and list(info.architectures) == ["Qwen2ForCausalLM"]


async def test_server_info_is_a_struct_of_server_args(engine, channel):
    info = await unary(channel, "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)

    args = dict(info.server_args)
    assert info.server_type == "grpc"
    assert args["page_size"] == 1.0 and isinstance(args["page_size"], float)  # numbers are doubles
    assert args["disaggregation_mode"] == "null"
    assert args["kv_events_config"] is None
    assert info.scheduler_info["status"] == "ready"
    assert info.max_total_num_tokens == engine.info.max_total_num_tokens


async def test_get_loads_per_rank(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory(api="smg", dp_size=2)).port)

    everything = await unary(channel, "GetLoads", pb.GetLoadsRequest(), pb.GetLoadsResponse)
    one = await unary(channel, "GetLoads", pb.GetLoadsRequest(dp_rank=1, include=["core"]), pb.GetLoadsResponse)

    assert everything.dp_rank_count == 2 and [load.dp_rank for load in everything.loads] == [0, 1]
    assert everything.loads[0].HasField("memory") and everything.loads[0].HasField("queues")
    assert [load.dp_rank for load in one.loads] == [1] and not one.loads[0].HasField("memory")


async def test_get_tokenizer_streams_a_zip_of_the_tokenizer(channel, tiny_model):
    async with channel.open_stream(
        P + "GetTokenizer", common.GetTokenizerRequest(), common.GetTokenizerChunk, timeout=10
    ) as stream:
        chunks = [chunk async for chunk in stream]

    data = b"".join(chunk.data for chunk in chunks)
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.read("tokenizer.json") == (tiny_model / "tokenizer.json").read_bytes()


async def test_grpc_health_service(channel):
    async def check(service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        reply = await channel.unary("/grpc.health.v1.Health/Check", request, health_pb2.HealthCheckResponse, timeout=5)
        return reply.status

    serving = health_pb2.HealthCheckResponse.SERVING
    assert await check("") == serving
    assert await check("sglang.grpc.scheduler.SglangScheduler") == serving
    with pytest.raises(EngineInvalidArgument):  # NOT_FOUND
        await check("vllm.grpc.engine.VllmEngine")


# --- SubscribeKvEvents -------------------------------------------------------------------------


async def test_subscribe_kv_events_is_unimplemented_without_a_publisher(channel):
    with pytest.raises(EngineUnimplemented):
        await collect_kv(channel, common.SubscribeKvEventsRequest(), 1)


async def collect_kv(channel, request, count: int) -> list[common.KvEventBatch]:
    path = P + "SubscribeKvEvents"
    async with channel.open_stream(path, request, common.KvEventBatch, timeout=None) as stream:
        batches = []
        async for batch in stream:
            batches.append(batch)
            if len(batches) == count:
                break
        return batches


async def test_subscribe_kv_events_relays_batches_one_block_per_hash(mock_engine_factory, dial):
    kv_config = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": ""})
    running = await mock_engine_factory(api="smg", page_size=4, kv_events_config=kv_config)
    channel = dial(running.port)
    prompt = list(range(300, 312))  # three full pages
    batches = []

    async def subscribe() -> None:
        batches.extend(await collect_kv(channel, common.SubscribeKvEventsRequest(), 1))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            await wait_until(lambda: running.engine.kv_listener_count == 1)
            await collect(channel, gen("kv", prompt=prompt, max_new_tokens=1))

    [batch] = batches
    assert batch.sequence_number == 1 and batch.dp_rank == 0  # SGLang numbers its first batch 1
    stored = batch.events[0].stored
    expected, _ = block_hash_chain(prompt, 4)
    assert [block.block_hash for block in stored.blocks] == expected
    assert [list(block.token_ids) for block in stored.blocks] == [prompt[0:4], prompt[4:8], prompt[8:12]]
    assert all(block.block_size == 4 for block in stored.blocks)
    assert not stored.HasField("parent_block_hash")

    with pytest.raises(EngineInvalidArgument):  # OUT_OF_RANGE: the relay is live-only
        await collect_kv(channel, common.SubscribeKvEventsRequest(start_sequence_number=5), 1)


async def test_a_subscription_asking_for_load_records_gets_them_at_once(mock_engine_factory, dial):
    kv_config = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": ""})
    running = await mock_engine_factory(api="smg", dp_size=2, kv_events_config=kv_config)
    request = common.SubscribeKvEventsRequest(load_records_before_first_batch=True)
    with trio.fail_after(5):  # no KV event is ever published here: the records come first anyway
        batches = await collect_kv(dial(running.port), request, 2)
    assert [b.dp_rank for b in batches] == [0, 1]
    assert all(b.load.load_only and not b.events for b in batches)
