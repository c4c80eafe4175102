"""The native-API adapter against a scripted engine: deltas, meta_info decoding, finish shapes."""

from __future__ import annotations

import json

import pytest

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import native
from trio_direct.engine.errors import EngineCancelled, EngineInternal
from trio_direct.engine.types import Bootstrap, EmbedInput, GenerateInput, SamplingOptions

TYPES = {
    native.GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    native.ABORT: (False, pb.AbortRequest, pb.AbortResponse),
    native.GET_SERVER_INFO: (False, pb.GetServerInfoRequest, pb.GetServerInfoResponse),
    native.GET_MODEL_INFO: (False, pb.GetModelInfoRequest, pb.GetModelInfoResponse),
    native.GET_LOAD: (False, pb.GetLoadRequest, pb.GetLoadResponse),
    native.HEALTH_CHECK: (False, pb.HealthCheckRequest, pb.HealthCheckResponse),
    native.EMBED: (False, pb.EmbedRequest, pb.EmbedResponse),
}


def meta(**values) -> dict[str, str]:
    return {key: json.dumps(value) for key, value in values.items()}


def replies(*messages):
    def handler(call):
        for message in messages:
            call.send(message)
        call.finish()

    return handler


def scripted(cumulative: bool) -> list[pb.GenerateResponse]:
    """Three engine steps producing tokens 5, 6 7, 8 and finishing on a stop token."""
    steps = [[5], [6, 7], [8]]
    out, so_far = [], []
    for i, step in enumerate(steps):
        so_far += step
        last = i == len(steps) - 1
        out.append(
            pb.GenerateResponse(
                output_ids=so_far if cumulative else step,
                meta_info=meta(
                    id="r1",
                    prompt_tokens=4,
                    completion_tokens=len(so_far),
                    cached_tokens=2,
                    dp_rank=None,
                    finish_reason={"type": "stop", "matched": 8} if last else None,
                ),
                finished=last,
            )
        )
    return out


@pytest.fixture
async def engine(fake_engine_factory):
    return await fake_engine_factory(TYPES)


async def collect(client, request):
    async with client.generate(request) as chunks:
        return [chunk async for chunk in chunks]


@pytest.mark.parametrize("cumulative", [True, False])
async def test_cumulative_and_incremental_engines_give_the_same_deltas(engine, cumulative):
    engine.handlers[native.GENERATE] = replies(*scripted(cumulative))
    client = native.NativeEngineClient(engine.channel(), incremental=not cumulative)
    chunks = await collect(client, GenerateInput(rid="r1", input_ids=[1, 2, 3, 4]))
    assert [c.token_ids for c in chunks] == [[5], [6, 7], [8]]
    last = chunks[-1]
    assert (last.finish_reason, last.matched_stop) == ("stop", 8)
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (4, 4, 2)
    assert all(c.finish_reason is None for c in chunks[:-1])
    client.channel.close()


async def test_streaming_mode_is_learnt_from_server_info_when_not_given(engine):
    engine.handlers[native.GET_SERVER_INFO] = replies(
        pb.GetServerInfoResponse(json_info=json.dumps({"incremental_streaming_output": False}))
    )
    engine.handlers[native.GENERATE] = replies(*scripted(cumulative=True))
    client = native.NativeEngineClient(engine.channel())
    chunks = await collect(client, GenerateInput(rid="r1", input_ids=[1]))
    assert [t for c in chunks for t in c.token_ids] == [5, 6, 7, 8]
    assert client.incremental is False
    client.channel.close()


def test_request_carries_every_set_field_and_nothing_else():
    request = native.generate_request(
        GenerateInput(
            rid="abc",
            input_ids=[1, 2],
            sampling=SamplingOptions(temperature=0.0, max_new_tokens=9, seed=7, stop_token_ids=[3]),
            routed_dp_rank=0,
            bootstrap=Bootstrap("10.0.0.1", 8998, 2**62),
        )
    )
    assert request.rid == "abc" and list(request.input_ids) == [1, 2]
    params = request.sampling_params
    assert params.HasField("temperature") and params.temperature == 0.0, "an explicit 0 is sent"
    assert not params.HasField("top_p"), "unset fields are left to the engine"
    assert (params.max_new_tokens, params.seed, list(params.stop_token_ids)) == (9, 7, [3])
    assert request.HasField("routed_dp_rank") and request.routed_dp_rank == 0
    assert request.disaggregated_params.bootstrap_room == 2**62


def test_meta_info_values_are_decoded_leniently():
    decoded = native.decode_meta_info(
        {"e2e_latency": "NaN", "id": '"r"', "x": "null", "weird": "not json", "l": "[1, 2]"}
    )
    assert decoded["e2e_latency"] != decoded["e2e_latency"]  # NaN
    assert (decoded["id"], decoded["x"], decoded["weird"], decoded["l"]) == ("r", None, "not json", [1, 2])


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ({"type": "length", "length": 3}, ("length", None, None)),
        ({"type": "stop", "matched": "END"}, ("stop", "END", None)),
        ({"type": "abort", "message": "bye", "status_code": 503, "err_type": None}, ("abort", None, "bye")),
    ],
)
async def test_finish_reason_shapes(engine, finish, expected):
    engine.handlers[native.GENERATE] = replies(
        pb.GenerateResponse(output_ids=[1], meta_info=meta(finish_reason=finish, completion_tokens=1), finished=True)
    )
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    (chunk,) = await collect(client, GenerateInput(rid="r", input_ids=[1]))
    assert (chunk.finish_reason, chunk.matched_stop, chunk.abort_message) == expected
    client.channel.close()


async def test_a_stream_that_ends_without_its_final_message_is_an_engine_error(engine):
    engine.handlers[native.GENERATE] = replies(pb.GenerateResponse(output_ids=[1], meta_info=meta(finish_reason=None)))
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    with pytest.raises(EngineInternal, match="without a final message"):
        await collect(client, GenerateInput(rid="r", input_ids=[1]))
    client.channel.close()


async def test_a_bare_finished_message_closes_the_generation(engine):
    engine.handlers[native.GENERATE] = replies(
        pb.GenerateResponse(output_ids=[4], meta_info=meta(finish_reason=None)), pb.GenerateResponse(finished=True)
    )
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    chunks = await collect(client, GenerateInput(rid="r", input_ids=[1]))
    assert [c.token_ids for c in chunks] == [[4], []] and chunks[-1].finish_reason == "stop"
    client.channel.close()


async def test_an_aborted_stream_raises_cancelled_with_the_engine_message(engine):
    def generate(call):
        call.send(pb.GenerateResponse(output_ids=[1], meta_info=meta(finish_reason=None)))
        call.fail("CANCELLED", "Request aborted: r")

    engine.handlers[native.GENERATE] = generate
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    with pytest.raises(EngineCancelled, match="Request aborted: r"):
        await collect(client, GenerateInput(rid="r", input_ids=[1]))
    client.channel.close()


async def test_unary_calls(engine):
    aborted = []

    def abort(call):
        aborted.append(call.request.rid)
        call.send(pb.AbortResponse(success=True))
        call.finish()

    engine.handlers[native.ABORT] = abort
    engine.handlers[native.HEALTH_CHECK] = replies(pb.HealthCheckResponse(healthy=True))
    engine.handlers[native.GET_MODEL_INFO] = replies(
        pb.GetModelInfoResponse(model_path="/m", json_info=json.dumps({"served_model_name": "m"}))
    )
    engine.handlers[native.GET_LOAD] = replies(pb.GetLoadResponse(json_info=json.dumps([{"dp_rank": 0}])))
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    assert await client.abort("r9") is True and aborted == ["r9"]
    assert await client.health() is True
    assert await client.model_info() == {"model_path": "/m", "served_model_name": "m"}
    assert await client.load() == [{"dp_rank": 0}]
    client.channel.close()


def test_images_go_in_field_19_as_given():
    urls = ["https://x/cat.png", "data:image/png;base64,AAAA"]
    request = native.generate_request(GenerateInput(rid="abc", input_ids=[1], image_data=urls))
    assert list(request.image_data) == urls
    assert [(field.number, field.name) for field, _ in request.ListFields() if field.name == "image_data"] == [
        (19, "image_data")
    ]
    assert not native.generate_request(GenerateInput(rid="abc", input_ids=[1])).image_data


async def test_embed_sends_the_rid_and_ids_and_reads_the_vector_and_prompt_tokens(engine):
    seen = []

    def answer(call):
        seen.append(call.request)
        call.send(pb.EmbedResponse(embedding=[0.6, 0.8], meta_info=meta(id="e1", prompt_tokens=3)))
        call.finish()

    engine.handlers[native.EMBED] = answer
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    output = await client.embed(EmbedInput(rid="e1", input_ids=[4, 5, 6], routed_dp_rank=0))
    assert output.embedding == pytest.approx([0.6, 0.8]) and output.prompt_tokens == 3
    assert (seen[0].rid, list(seen[0].input_ids)) == ("e1", [4, 5, 6])
    # an embed call is request work: it rides the connections for streams, not the control one
    assert client.channel.stream_connections == 1
    client.channel.close()
