"""`/v1/tokenize` and `/v1/detokenize` bodies: vLLM's and SGLang's shapes, in and out."""

from __future__ import annotations

import json

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.openai.tokenization import (
    decode_detokenize_request,
    decode_tokenize_request,
    detokenize_body,
    tokenize_body,
)


def body(**fields) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def test_a_prompt_or_a_list_of_prompts_or_messages():
    assert decode_tokenize_request(body(prompt="hi")).prompt == "hi"
    assert decode_tokenize_request(body(prompt=["a", "b"])).prompt == ["a", "b"]
    chat = decode_tokenize_request(body(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=False))
    assert chat.messages is not None and chat.messages[0].content == "hi" and chat.add_generation_prompt is False
    assert chat.add_special_tokens is None  # the surface picks vLLM's default per form


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, "continue_final_message"),
        (
            {
                "messages": [{"role": "assistant", "content": "x"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "continue_final_message",
        ),
    ],
)
def test_bad_tokenize_bodies(fields, param):
    with pytest.raises(ApiError) as caught:
        decode_tokenize_request(body(**fields))
    assert caught.value.status == 400 and caught.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "tokens"),
        ({"tokens": [1, -1]}, "tokens[1]"),
        ({"tokens": [[1], [2, -3]]}, "tokens[1][1]"),
        ({"tokens": [[1], 2]}, "tokens[1]"),
        ({"tokens": [1, [2]]}, "tokens[1]"),
        ({"tokens": "12"}, "tokens"),
    ],
)
def test_bad_detokenize_bodies(fields, param):
    with pytest.raises(ApiError) as caught:
        decode_detokenize_request(body(**fields))
    assert caught.value.status == 400 and caught.value.param == param


def test_answers_in_the_shape_both_client_kinds_read():
    assert json.loads(tokenize_body([5, 6], 100)) == {"count": 2, "max_model_len": 100, "tokens": [5, 6]}
    assert json.loads(tokenize_body([[5], [6, 7]], 100)) == {
        "count": [1, 2],
        "max_model_len": 100,
        "tokens": [[5], [6, 7]],
    }
    with_strs = json.loads(tokenize_body([5], 100, ["Ġhi"]))
    assert with_strs["token_strs"] == ["Ġhi"]
    # vLLM's clients read `prompt`, SGLang's `text`
    assert json.loads(detokenize_body("hi there")) == {"prompt": "hi there", "text": "hi there"}
    assert decode_detokenize_request(body(tokens=[1, 2])).skip_special_tokens is False
