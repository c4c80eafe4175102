"""The SMG-API adapter against a scripted servicer: final chunk + complete, legacy shapes, errors."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from trio_direct._proto.smg import sglang_scheduler_pb2 as pb
from trio_direct.engine import smg
from trio_direct.engine.errors import EngineInternal, EngineInvalidArgument
from trio_direct.engine.types import Bootstrap, EmbedInput, GenerateInput, SamplingOptions

TYPES = {
    smg.GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    smg.GET_SERVER_INFO: (False, pb.GetServerInfoRequest, pb.GetServerInfoResponse),
    smg.GET_LOADS: (False, pb.GetLoadsRequest, pb.GetLoadsResponse),
    smg.EMBED: (False, pb.EmbedRequest, pb.EmbedResponse),
}


def chunk(ids, completion):
    return pb.GenerateResponse(
        request_id="r",
        chunk=pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=3, completion_tokens=completion, cached_tokens=1),
    )


def complete(ids, completion, **extra):
    return pb.GenerateResponse(
        request_id="r",
        complete=pb.GenerateComplete(
            output_ids=ids,
            finish_reason="stop",
            prompt_tokens=3,
            completion_tokens=completion,
            cached_tokens=1,
            **extra,
        ),
    )


def replies(*messages):
    def handler(call):
        for message in messages:
            call.send(message)
        call.finish()

    return handler


@pytest.fixture
async def engine(fake_engine_factory):
    return await fake_engine_factory(TYPES)


async def collect(engine, request=None):
    client = smg.SmgEngineClient(engine.channel())
    try:
        async with client.generate(request or GenerateInput(rid="r", input_ids=[1, 2, 3])) as chunks:
            return [c async for c in chunks]
    finally:
        client.channel.close()


async def test_final_chunk_then_complete_is_not_double_counted(engine):
    engine.handlers[smg.GENERATE] = replies(chunk([5], 1), chunk([6, 7], 3), complete([6, 7], 3, matched_token_id=7))
    chunks = await collect(engine)
    assert [t for c in chunks for t in c.token_ids] == [5, 6, 7]
    assert (chunks[-1].finish_reason, chunks[-1].matched_stop, chunks[-1].completion_tokens) == ("stop", 7, 3)


async def test_legacy_complete_carrying_the_last_delta_is_appended(engine):
    engine.handlers[smg.GENERATE] = replies(chunk([5], 1), complete([6, 7], 3, matched_stop_str="END"))
    chunks = await collect(engine)
    assert [t for c in chunks for t in c.token_ids] == [5, 6, 7]
    assert chunks[-1].matched_stop == "END"


async def test_non_stream_complete_carries_all_tokens(engine):
    engine.handlers[smg.GENERATE] = replies(complete([5, 6, 7], 3))
    chunks = await collect(engine, GenerateInput(rid="r", input_ids=[1], stream=False))
    assert [c.token_ids for c in chunks] == [[5, 6, 7]]


async def test_legacy_in_band_error_becomes_an_engine_error(engine):
    error = b"\x0a\x10Request aborted!\x12\x03500"
    raw = b"\x0a\x01r" + b"\x22" + bytes([len(error)]) + error  # field 4 = GenerateError
    engine.handlers[smg.GENERATE] = replies(pb.GenerateResponse.FromString(raw))
    with pytest.raises(EngineInternal, match="Request aborted!"):
        await collect(engine)


async def test_status_errors_are_typed(engine):
    engine.handlers[smg.GENERATE] = lambda call: call.fail("INVALID_ARGUMENT", "Tokenized input must be provided")
    with pytest.raises(EngineInvalidArgument, match="Tokenized input"):
        await collect(engine)


def test_semantic_defaults_are_always_sent():
    request = smg.generate_request(
        GenerateInput(
            rid="r", input_ids=[1], sampling=SamplingOptions(max_new_tokens=4), bootstrap=Bootstrap("h", 1, 5)
        )
    )
    params = request.sampling_params
    assert (params.temperature, params.top_p, params.top_k, params.repetition_penalty, params.n) == (
        1.0,
        1.0,
        -1,
        1.0,
        1,
    )
    assert params.HasField("max_new_tokens") and params.max_new_tokens == 4
    assert request.logprob_start_len == -1
    assert request.disaggregated_params.bootstrap_room == 5
    with pytest.raises(ValueError, match="int32"):
        smg.generate_request(GenerateInput(rid="r", input_ids=[1], bootstrap=Bootstrap("h", 1, 2**40)))


async def test_server_info_is_flattened_with_integral_numbers(engine):
    args = struct_pb2.Struct()
    args.update({"page_size": 16.0, "disaggregation_mode": "null", "temperature": 0.5})
    scheduler = struct_pb2.Struct()
    scheduler.update({"max_total_num_tokens": 1000.0})
    engine.handlers[smg.GET_SERVER_INFO] = replies(
        pb.GetServerInfoResponse(server_args=args, scheduler_info=scheduler, server_type="grpc")
    )
    engine.handlers[smg.GET_LOADS] = replies(
        pb.GetLoadsResponse(loads=[pb.SchedulerLoad(dp_rank=0, num_running_reqs=2)])
    )
    client = smg.SmgEngineClient(engine.channel())
    info = await client.server_info()
    assert info["page_size"] == 16 and isinstance(info["page_size"], int)
    assert info["max_total_num_tokens"] == 1000 and info["temperature"] == 0.5 and info["server_type"] == "grpc"
    (load,) = await client.load()
    assert load["num_running_reqs"] == 2
    client.channel.close()


def test_image_urls_are_refused_rather_than_dropped():
    # the servicers read `mm_inputs.image_urls` only in an encoder-disaggregated deployment
    with pytest.raises(EngineInvalidArgument):
        smg.generate_request(GenerateInput(rid="r", input_ids=[1], image_data=["https://x/cat.png"]))


async def test_embed_reads_the_flat_response(engine):
    seen = []

    def answer(call):
        seen.append(call.request)
        call.send(pb.EmbedResponse(embedding=[1.0, 0.0, 0.0], embedding_dim=3, prompt_tokens=2))
        call.finish()

    engine.handlers[smg.EMBED] = answer
    client = smg.SmgEngineClient(engine.channel())
    output = await client.embed(EmbedInput(rid="e1", input_ids=[4, 5], original_text="hi", routed_dp_rank=1))
    assert output.embedding == [1.0, 0.0, 0.0] and output.prompt_tokens == 2
    request = seen[0]
    assert request.request_id == "e1" and list(request.tokenized.input_ids) == [4, 5]
    assert request.tokenized.original_text == "hi" and request.data_parallel_rank == 1
    client.channel.close()
