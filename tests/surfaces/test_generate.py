"""SGLang's `/generate`: requests decoded and planned, and answers rendered as SGLang's server writes them."""

from __future__ import annotations

import json

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceResult
from trio_direct.core.plan import Usage
from trio_direct.engine.types import GenerateChunk, TokenLogprob
from trio_direct.surfaces.generate import (
    GenerateRenderer,
    finish_reason_json,
    plan_generate,
)
from trio_direct.surfaces.generate_request import (
    DEFAULT_MAX_NEW_TOKENS,
    decode_generate_request,
)


def decode(**fields):
    return decode_generate_request(json.dumps(fields).encode())


def sse(data: bytes) -> list:
    events = []
    for record in data.split(b"\n\n"):
        if record:
            assert record.startswith(b"data: ")
            payload = record[len(b"data: ") :]
            events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


async def test_sampling_params_map_to_the_engine_request(make_pool):
    pool = make_pool()
    request = decode(
        text="Hello there",
        sampling_params={
            "max_new_tokens": 9, "min_new_tokens": 2, "temperature": 0.5, "top_k": 5, "top_p": 0.9, "min_p": 0.1,
            "stop": ["END"], "stop_token_ids": [7], "ignore_eos": True, "sampling_seed": 42, "regex": "[a-z]+",
            "no_stop_trim": True, "n": 2,
        },
        rid="client-rid",
    )  # fmt: skip
    plan = await plan_generate(pool, request)
    assert len(plan.choices) == 2 and plan.n == 2
    engine = plan.choices[0].request
    assert list(engine.input_ids) == pool.tokenizer.encode("Hello there", add_special_tokens=True)
    sampling = engine.sampling
    assert (sampling.max_new_tokens, sampling.min_new_tokens, sampling.temperature) == (9, 2, 0.5)
    assert (sampling.top_k, sampling.top_p, sampling.min_p, sampling.seed, sampling.regex) == (
        5,
        0.9,
        0.1,
        42,
        "[a-z]+",
    )
    assert tuple(sampling.stop_token_ids) == (7,) and sampling.ignore_eos is True  # no EOS added with ignore_eos
    # the client's rid never reaches the engine: the frontend's ids are fixed-length and distinct
    rids = [choice.request.rid for choice in plan.choices]
    assert "client-rid" not in rids and len({len(rid) for rid in rids}) == 1 and len(set(rids)) == 2


async def test_defaults_follow_sglang(make_pool):
    pool = make_pool()
    plan = await plan_generate(pool, decode(input_ids=[5, 6, 7]))
    sampling = plan.choices[0].request.sampling
    assert sampling.max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert set(pool.tokenizer.eos_token_ids) <= set(sampling.stop_token_ids)
    assert plan.choices[0].request.input_ids == [5, 6, 7] and not plan.stream


async def test_a_batch_plans_one_choice_per_prompt(make_pool):
    plan = await plan_generate(make_pool(), decode(text=["one", "two", "three"], rid=["a", "b", "c"]))
    assert [choice.prompt_index for choice in plan.choices] == [0, 1, 2]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "text"),
        ({"text": "a", "input_ids": [1]}, "text"),
        ({"text": []}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [1, -1]}, "input_ids"),
        ({"input_ids": [[1], 2]}, "input_ids[1]"),
        ({"input_ids": [[1], []]}, "input_ids[1]"),
        ({"text": 5}, "text"),
        ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"max_new_tokens": "many"}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
        ({"text": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
        ({"text": "a", "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
        ({"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n"),
        (
            {"text": "a", "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 3}},
            "sampling_params.min_new_tokens",
        ),
        ({"text": "a", "sampling_params": {"stop": [""]}}, "sampling_params.stop"),
        ({"text": "a", "sampling_params": {"regex": "a", "json_schema": "{}"}}, "sampling_params.regex"),
        ({"text": "a", "sampling_params": {"logit_bias": {"5": 1.0}}}, "sampling_params.logit_bias"),
        ({"text": "a", "sampling_params": [{"max_new_tokens": 1}]}, "sampling_params"),
        ({"text": "a", "input_embeds": [[0.1]]}, "input_embeds"),
        ({"text": "a", "lora_path": "x"}, "lora_path"),
        ({"text": "a", "return_hidden_states": True}, "return_hidden_states"),
        ({"text": "a", "return_logprob": True, "logprob_start_len": 0}, "logprob_start_len"),
        ({"text": "a", "top_logprobs_num": 99}, "top_logprobs_num"),
        ({"text": ["a", "b"], "rid": "one"}, "rid"),
        ({"text": ["a", "b"], "rid": ["one"]}, "rid"),
        ({"text": "a", "rid": ["one"]}, "rid"),
        ({"text": ["a", "b"], "image_data": "http://x/y.png"}, "image_data"),
    ],
)
def test_bad_requests_are_400s_naming_the_parameter(fields, param):
    with pytest.raises(ApiError) as caught:
        decode(**fields)
    assert caught.value.status == 400 and caught.value.param == param, caught.value


async def test_an_embedding_model_does_not_generate(make_pool):
    with pytest.raises(ApiError) as caught:
        await plan_generate(make_pool(embedding=True), decode(text="hi"))
    assert caught.value.status == 400 and caught.value.code == "model_not_supported"


async def test_images_need_a_multimodal_model(make_pool):
    with pytest.raises(ApiError) as caught:
        await plan_generate(make_pool(), decode(text="<image> what?", image_data="http://x/cat.png"))
    assert caught.value.status == 400 and caught.value.param == "image_data"
    plan = await plan_generate(
        make_pool(images=True), decode(text="<image> what?", image_data=["data:image/png;base64,AA=="])
    )
    assert list(plan.choices[0].request.image_data) == ["data:image/png;base64,AA=="]


def test_finish_reasons_in_sglang_shapes():
    assert finish_reason_json(None, None, 3) is None
    assert finish_reason_json("length", None, 3) == {"type": "length", "length": 3}
    assert finish_reason_json("stop", 2, 3) == {"type": "stop", "matched": 2}
    assert finish_reason_json("stop", "END", 3) == {"type": "stop", "matched": "END"}


async def stream_of(make_pool, chunks, **fields):
    """A plan, its renderer, and the SSE events it writes for `chunks` (one batch each)."""
    pool = make_pool()
    request = decode(**{"stream": True, **fields})
    plan = await plan_generate(pool, request)
    renderer = GenerateRenderer(plan, request, pool.token_text, started=0.0)
    renderer.prepare()
    data = renderer.opening()
    for index, chunk in chunks:
        data += renderer.events([plan.choices[index].output.push([chunk])])
    data += renderer.closing(plan.usage())
    return pool, plan, sse(data)


async def test_a_stream_carries_cumulative_text_and_ids_then_done(make_pool):
    hello, world = 20, 21
    pool, _, events = await stream_of(
        make_pool,
        [
            (0, GenerateChunk([hello], prompt_tokens=3, completion_tokens=1)),
            (0, GenerateChunk([world], finish_reason="length", prompt_tokens=3, completion_tokens=2, cached_tokens=1)),
        ],
        input_ids=[5, 6, 7],
        rid="r-1",
        sampling_params={"max_new_tokens": 2},
    )
    assert events[-1] == "[DONE]"
    first, last = events[0], events[1]
    text = pool.tokenizer.decode([hello, world])
    assert first["output_ids"] == [hello] and last["output_ids"] == [hello, world]
    assert last["text"] == text and text.startswith(first["text"])
    assert first["meta_info"]["finish_reason"] is None and "e2e_latency" not in first["meta_info"]
    meta = last["meta_info"]
    assert meta["id"] == "r-1" and meta["finish_reason"] == {"type": "length", "length": 2}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (3, 2, 1)
    assert meta["e2e_latency"] > 0 and "index" not in last


async def test_a_streamed_batch_tags_each_answer_with_its_index_and_its_own_id(make_pool):
    _, _, events = await stream_of(
        make_pool,
        [
            (1, GenerateChunk([30], finish_reason="stop", matched_stop=2, completion_tokens=1)),
            (0, GenerateChunk([31], finish_reason="length", completion_tokens=1)),
        ],
        input_ids=[[5], [6]],
        rid=["a", "b"],
    )
    assert [(e["index"], e["meta_info"]["id"]) for e in events[:-1]] == [(1, "b"), (0, "a")]
    assert events[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}


async def test_logprobs_are_sglang_rows_with_text_when_asked(make_pool):
    row = TokenLogprob(20, -0.5, ((20, -0.5), (21, -1.5)))
    pool, _, events = await stream_of(
        make_pool,
        [(0, GenerateChunk([20], finish_reason="length", completion_tokens=1, logprobs=[row]))],
        input_ids=[5],
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    meta = events[0]["meta_info"]
    text = pool.token_text(20)
    assert meta["output_token_logprobs"] == [[-0.5, 20, text]]
    assert meta["output_top_logprobs"] == [[[-0.5, 20, text], [-1.5, 21, pool.token_text(21)]]]


async def test_a_unary_answer_is_one_object_or_a_list(make_pool):
    pool = make_pool()
    for fields, listed in (
        ({"text": "hi"}, False),
        ({"text": ["a", "b"]}, True),
        ({"text": "hi", "sampling_params": {"n": 2}}, True),
    ):
        request = decode(**fields)
        plan = await plan_generate(pool, request)
        renderer = GenerateRenderer(plan, request, pool.token_text, started=0.0)
        results = []
        for choice in plan.choices:
            event = choice.output.push(
                [GenerateChunk([20, 2], finish_reason="stop", matched_stop=2, completion_tokens=2)]
            )
            result = ChoiceResult(choice.output.index)
            result.add(event)
            results.append(result)
        body = json.loads(renderer.unary(results, Usage(1, 2)))
        answers = body if listed else [body]
        assert isinstance(body, list) is listed and len(answers) == len(plan.choices)
        for answer in answers:
            assert answer["output_ids"] == [20, 2]  # the EOS that ended it is in the ids, not the text
            assert answer["text"] == pool.tokenizer.decode([20])
            assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
        if fields.get("sampling_params"):
            ids = [answer["meta_info"]["id"] for answer in answers]
            assert ids == [plan.choices[0].request.rid, plan.choices[1].request.rid]


def test_the_renderer_ends_a_failed_stream_with_an_error_event():
    renderer = GenerateRenderer.__new__(GenerateRenderer)
    events = sse(renderer.failure(ApiError("engine went away", status=502, type="api_error")))
    assert events[0]["error"]["message"] == "engine went away" and events[1] == "[DONE]"
