"""The mock's embedding mode (`--is-embedding`) and image input (`--multimodal`), over both gRPC APIs."""

from __future__ import annotations

import json
import math

import pytest
import trio
from support import wait_until

from trio_direct._proto.native import sglang_pb2 as native_pb
from trio_direct._proto.smg import sglang_scheduler_pb2 as smg_pb
from trio_direct.engine.errors import EngineCancelled, EngineInvalidArgument
from trio_direct.mock.native_service import (
    NOT_A_GENERATION_MODEL,
    NOT_AN_EMBEDDING_MODEL,
)
from trio_direct.mock.pooling import (
    IMAGE_PROMPT_TOKENS,
    embedding_vector,
    image_prompt_tokens,
)

NATIVE = "/sglang.runtime.v1.SglangService/"
SMG = "/sglang.grpc.scheduler.SglangScheduler/"


def test_vectors_are_unit_length_deterministic_and_differ_by_input():
    first = embedding_vector([1, 2, 3], 64)
    assert len(first) == 64 and math.fsum(x * x for x in first) == pytest.approx(1.0)
    assert embedding_vector([1, 2, 3], 64) == first
    assert embedding_vector([1, 2, 4], 64) != first


def test_each_image_stands_for_a_fixed_number_of_tokens_from_its_own_text():
    one = image_prompt_tokens(["https://x/cat.png"], 1000)
    assert len(one) == IMAGE_PROMPT_TOKENS and all(0 <= t < 1000 for t in one)
    assert image_prompt_tokens(["https://x/cat.png"], 1000) == one
    assert image_prompt_tokens(["https://x/dog.png"], 1000) != one
    assert len(image_prompt_tokens(["a", "b"], 1000)) == 2 * IMAGE_PROMPT_TOKENS


async def native_embed(channel, rid: str, ids: list[int]) -> native_pb.EmbedResponse:
    request = native_pb.EmbedRequest(input_ids=ids, rid=rid)
    return await channel.unary(NATIVE + "Embed", request, native_pb.EmbedResponse, timeout=10)


async def test_an_embedding_engine_answers_embed_on_both_apis(mock_engine_factory, dial):
    engine = await mock_engine_factory(is_embedding=True)
    channel = dial(engine.port)
    reply = await native_embed(channel, "e-1", [5, 6, 7])
    vector = list(reply.embedding)
    assert len(vector) == engine.info.embedding_dim == 256  # the tiny model's hidden_size
    assert math.fsum(x * x for x in vector) == pytest.approx(1.0, abs=1e-5)
    assert json.loads(reply.meta_info["prompt_tokens"]) == 3 and json.loads(reply.meta_info["id"]) == "e-1"
    smg_request = smg_pb.EmbedRequest(request_id="e-2", tokenized=smg_pb.TokenizedInput(input_ids=[5, 6, 7]))
    smg_reply = await channel.unary(SMG + "Embed", smg_request, smg_pb.EmbedResponse, timeout=10)
    assert list(smg_reply.embedding) == vector  # the same input gives the same vector
    assert (smg_reply.embedding_dim, smg_reply.prompt_tokens) == (256, 3)
    accounting = engine.engine.accounting
    assert (accounting.started, accounting.finished, accounting.live) == (2, 2, set())


async def test_an_embedding_engine_says_so_and_does_not_generate(mock_engine_factory, dial):
    engine = await mock_engine_factory(is_embedding=True)
    channel = dial(engine.port)
    info = await channel.unary(
        NATIVE + "GetModelInfo", native_pb.GetModelInfoRequest(), native_pb.GetModelInfoResponse, timeout=5
    )
    assert json.loads(info.json_info)["is_generation"] is False
    smg_info = await channel.unary(
        SMG + "GetModelInfo", smg_pb.GetModelInfoRequest(), smg_pb.GetModelInfoResponse, timeout=5
    )
    assert smg_info.is_generation is False
    request = native_pb.GenerateRequest(input_ids=[1, 2], rid="g", sampling_params=native_pb.SamplingParams())
    with pytest.raises(EngineInvalidArgument) as caught:
        async with channel.open_stream(NATIVE + "Generate", request, native_pb.GenerateResponse, timeout=5) as stream:
            [m async for m in stream]
    assert caught.value.message == NOT_A_GENERATION_MODEL
    health = await channel.unary(
        SMG + "HealthCheck", smg_pb.HealthCheckRequest(), smg_pb.HealthCheckResponse, timeout=5
    )
    assert health.healthy  # its probe is an embedding, as the servicer's is


async def test_a_generation_engine_refuses_embed_with_sglangs_words(mock_engine_factory, dial):
    channel = dial((await mock_engine_factory()).port)
    with pytest.raises(EngineInvalidArgument) as caught:
        await native_embed(channel, "e", [1])
    assert caught.value.message == NOT_AN_EMBEDDING_MODEL


async def test_a_cancelled_embed_is_cancelled_and_an_aborted_one_ends_cancelled(mock_engine_factory, dial):
    engine = await mock_engine_factory(is_embedding=True, speedup=0.05)  # a prefill takes ~0.3 s
    channel = dial(engine.port)
    with trio.move_on_after(0.05):
        await native_embed(channel, "left", [1] * 50)
    await wait_until(lambda: engine.engine.accounting.cancelled == 1)
    outcome = {}

    async def embed() -> None:
        try:
            await native_embed(channel, "aborted", [2] * 50)
        except EngineCancelled as error:
            outcome["error"] = error

    async with trio.open_nursery() as nursery:
        nursery.start_soon(embed)
        await wait_until(lambda: engine.engine.is_live("aborted"))
        await channel.unary(NATIVE + "Abort", native_pb.AbortRequest(rid="aborted"), native_pb.AbortResponse, timeout=5)
    assert "Request aborted: aborted" in outcome["error"].message
    assert engine.engine.accounting.live == set()


async def test_images_count_prompt_tokens_on_a_multimodal_engine_and_are_refused_elsewhere(mock_engine_factory, dial):
    multimodal = await mock_engine_factory(multimodal=True, incremental_streaming_output=True)
    channel = dial(multimodal.port)
    info = await channel.unary(
        NATIVE + "GetServerInfo", native_pb.GetServerInfoRequest(), native_pb.GetServerInfoResponse, timeout=5
    )
    assert json.loads(info.json_info)["grpc_features"]["image_inputs"]
    request = native_pb.GenerateRequest(
        input_ids=[1, 2, 3], rid="img", stream=True, image_data=["https://x/a.png", "https://x/b.png"],
        sampling_params=native_pb.SamplingParams(max_new_tokens=2),
    )  # fmt: skip
    async with channel.open_stream(NATIVE + "Generate", request, native_pb.GenerateResponse, timeout=5) as stream:
        messages = [m async for m in stream]
    assert json.loads(messages[-1].meta_info["prompt_tokens"]) == 3 + 2 * IMAGE_PROMPT_TOKENS
    plain = dial((await mock_engine_factory()).port)
    with pytest.raises(EngineInvalidArgument, match="image"):
        async with plain.open_stream(NATIVE + "Generate", request, native_pb.GenerateResponse, timeout=5) as stream:
            [m async for m in stream]
