"""Request decoding: what real clients send is accepted; every malformed body is a 400 naming its param."""

from __future__ import annotations

import json

import msgspec
import pytest

from trio_direct.core.errors import ApiError
from trio_direct.openai.errors import openai_error_body
from trio_direct.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    ImageURLPart,
    NamedToolChoice,
    ResponseFormatJsonSchema,
    TextPart,
    decode_chat_request,
    decode_completion_request,
    prompt_batch,
)

USER = {"role": "user", "content": "hi"}


def chat(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": [USER], **fields}).encode()


def completion(**fields) -> bytes:
    return json.dumps({"model": "m", "prompt": "hi", **fields}).encode()


def rejected(decode, body: bytes) -> ApiError:
    with pytest.raises(ApiError) as caught:
        decode(body)
    error = caught.value
    assert error.status == 400 and error.type == "invalid_request_error"
    assert json.loads(openai_error_body(error))["error"]["param"] == error.param
    return error


# ----------------------------------------------------------------------------------------------
# Accepted bodies


def test_sdk_chat_body_with_every_feature_decodes(sent_body):
    body = sent_body(
        lambda client: client.chat.completions.create(
            model="m",
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    ],
                    "name": "ann",
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
            ],
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=64,
            temperature=0.2,
            top_p=0.9,
            n=2,
            stop=["\n\n", "END"],
            seed=7,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            logprobs=True,
            top_logprobs=3,
            user="u1",
            tools=[{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
            tool_choice={"type": "function", "function": {"name": "look"}},
            parallel_tool_calls=False,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
            extra_body={
                "top_k": 20,
                "min_p": 0.05,
                "repetition_penalty": 1.1,
                "chat_template_kwargs": {"enable_thinking": False},
            },
        )
    )
    request = decode_chat_request(body)
    assert isinstance(request, ChatCompletionRequest)
    assert [m.role for m in request.messages] == ["developer", "system", "user", "assistant", "tool"]
    user = request.messages[2]
    assert isinstance(user.content, list)
    assert isinstance(user.content[0], TextPart) and isinstance(user.content[1], ImageURLPart)
    image = user.content[1]
    assert isinstance(image, ImageURLPart) and image.image_url.detail == "low"
    tool_calls = request.messages[3].tool_calls
    assert tool_calls is not None and tool_calls[0].function.arguments == '{"x": 1}'
    assert request.stream and request.stream_options is not None and request.stream_options.include_usage
    assert (request.max_completion_tokens, request.n, request.top_k, request.min_p) == (64, 2, 20, 0.05)
    assert request.stop == ["\n\n", "END"]
    assert isinstance(request.tool_choice, NamedToolChoice)
    assert isinstance(request.response_format, ResponseFormatJsonSchema)
    assert request.chat_template_kwargs == {"enable_thinking": False}


def test_messages_become_template_dicts_without_unsent_keys():
    request = decode_chat_request(chat(messages=[USER, {"role": "assistant", "content": "yo", "name": None}]))
    assert msgspec.to_builtins(request.messages) == [USER, {"role": "assistant", "content": "yo"}]


def test_nulls_and_unknown_keys_mean_defaults_like_openai():
    request = decode_chat_request(
        chat(stop=None, n=None, stream=None, max_tokens=None, temperature=None, rid="r1", store=True, metadata={})
    )
    assert (request.stop, request.n, request.stream, request.max_tokens) == (None, 1, False, None)
    assert not hasattr(request, "rid")


def test_minimal_chat_defaults():
    request = decode_chat_request(chat())
    assert request.model == "m" and request.n == 1 and not request.stream
    assert request.skip_special_tokens and request.separate_reasoning and not request.logprobs


def test_sdk_completion_body_decodes(sent_body):
    body = sent_body(
        lambda client: client.completions.create(
            model="m", prompt=["a", "b"], max_tokens=5, echo=True, logprobs=2, best_of=3, n=3, stream=False
        )
    )
    request = decode_completion_request(body)
    assert isinstance(request, CompletionRequest)
    assert (request.prompt, request.max_tokens, request.echo, request.logprobs) == (["a", "b"], 5, True, 2)


@pytest.mark.parametrize(
    ("prompt", "batch"),
    [
        ("hi", ["hi"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_prompt_shapes(prompt, batch):
    assert prompt_batch(decode_completion_request(completion(prompt=prompt))) == batch


def test_completion_max_tokens_defaults_to_16_like_openai():
    assert decode_completion_request(completion()).max_tokens == 16
    assert decode_completion_request(completion(max_tokens=None)).max_tokens == 16


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 2},
        {"top_p": 1},
        {"top_k": -1},
        {"top_k": 0},
        {"n": 128},
        {"presence_penalty": -2, "frequency_penalty": 2},
        {"top_logprobs": 0},
        {"logprobs": True, "top_logprobs": 20},
        {"stop": "x"},
        {"stop": [str(i) for i in range(16)]},
        {"stop": []},
        {"logit_bias": {}},
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}, "regex": "a+"},
        {"response_format": {"type": "json_object"}},
        {"modalities": ["text"]},
        {"min_tokens": 4, "max_tokens": 4},
        {"messages": [USER, {"role": "assistant", "content": "Sure"}], "continue_final_message": True},
        {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    ],
)
def test_boundary_values_are_accepted(fields):
    decode_chat_request(chat(**fields))


# ----------------------------------------------------------------------------------------------
# Rejected bodies


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"{'model': 'm'}", b"\xff\xfe", b'{"model": "m",}', b'{"temperature": NaN}', b'{"n": 1e400}'],
)
def test_malformed_json(body):
    for decode in (decode_chat_request, decode_completion_request):
        error = rejected(decode, body)
        assert error.message.startswith("We could not parse the JSON body of your request.")
        assert error.param is None


def test_absurdly_nested_json_is_a_client_error():
    nested = b"[" * 100_000 + b"]" * 100_000
    assert rejected(decode_chat_request, nested).param is None
    assert rejected(decode_completion_request, b'{"model": "m", "prompt": "x", "extra": ' + nested + b"}").param is None


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"1", b"null"])
def test_body_must_be_an_object(body):
    assert rejected(decode_chat_request, body).param is None


CHAT_REJECTIONS = [
    # missing and mistyped fields
    ({"messages": [USER]}, "model"),
    ({"model": "m"}, "messages"),
    ({"model": 3, "messages": [USER]}, "model"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
    ({"model": "m", "messages": [USER, {"role": "system", "content": None}]}, "messages[1].content"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "pdf"}]}]}, "messages[0].content[0].type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0].type"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].image_url.url",
    ),
    (
        {"model": "m", "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
        "messages[0].content[0].type",
    ),
    ({"model": "m", "messages": [{"role": "assistant"}]}, "messages[0].content"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    (
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
        "messages[0].tool_calls[0].function.arguments",
    ),
    ({"model": "m", "messages": [{"role": "user", "content": "hi", "name": 1}]}, "messages[0].name"),
    ({"model": "m", "messages": [USER], "stream": "yes"}, "stream"),
    ({"model": "m", "messages": [USER], "temperature": "hot"}, "temperature"),
    ({"model": "m", "messages": [USER], "n": 1.5}, "n"),
    ({"model": "m", "messages": [USER], "n": True}, "n"),
    ({"model": "m", "messages": [USER], "stop": 5}, "stop"),
    ({"model": "m", "messages": [USER], "stop": ["a", 5]}, "stop[1]"),
    ({"model": "m", "messages": [USER], "chat_template_kwargs": []}, "chat_template_kwargs"),
    # ranges
    ({"model": "m", "messages": [USER], "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": [USER], "max_tokens": -5}, "max_tokens"),
    ({"model": "m", "messages": [USER], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"model": "m", "messages": [USER], "max_tokens": 2**40}, "max_tokens"),
    ({"model": "m", "messages": [USER], "n": 0}, "n"),
    ({"model": "m", "messages": [USER], "n": 129}, "n"),
    ({"model": "m", "messages": [USER], "temperature": -0.1}, "temperature"),
    ({"model": "m", "messages": [USER], "temperature": 2.01}, "temperature"),
    ({"model": "m", "messages": [USER], "top_p": 0}, "top_p"),
    ({"model": "m", "messages": [USER], "top_p": 1.5}, "top_p"),
    ({"model": "m", "messages": [USER], "top_k": -2}, "top_k"),
    ({"model": "m", "messages": [USER], "min_p": 1.5}, "min_p"),
    ({"model": "m", "messages": [USER], "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "m", "messages": [USER], "frequency_penalty": -3}, "frequency_penalty"),
    ({"model": "m", "messages": [USER], "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": "m", "messages": [USER], "min_tokens": -1}, "min_tokens"),
    ({"model": "m", "messages": [USER], "min_tokens": 10, "max_tokens": 5}, "min_tokens"),
    ({"model": "m", "messages": [USER], "seed": 2**64}, "seed"),
    ({"model": "m", "messages": [USER], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"model": "m", "messages": [USER], "logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"model": "m", "messages": [USER], "top_logprobs": 2}, "top_logprobs"),
    ({"model": "m", "messages": [USER], "stop": ""}, "stop"),
    ({"model": "m", "messages": [USER], "stop": ["ok", ""]}, "stop[1]"),
    ({"model": "m", "messages": [USER], "stop": [str(i) for i in range(17)]}, "stop"),
    ({"model": "m", "messages": [USER], "stop_token_ids": [1, -1]}, "stop_token_ids[1]"),
    # streaming, tools, structured output
    ({"model": "m", "messages": [USER], "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "m", "messages": [USER], "stream": False, "stream_options": {}}, "stream_options"),
    ({"model": "m", "messages": [USER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"model": "m", "messages": [USER], "tool_choice": "required"}, "tool_choice"),
    (
        {
            "model": "m",
            "messages": [USER],
            "tools": [{"type": "function", "function": {"name": "a"}}],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
        },
        "tool_choice",
    ),
    ({"model": "m", "messages": [USER], "tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
    ({"model": "m", "messages": [USER], "tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"model": "m", "messages": [USER], "response_format": {"type": "yaml"}}, "response_format.type"),
    ({"model": "m", "messages": [USER], "response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"model": "m", "messages": [USER], "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
    ),
    ({"model": "m", "messages": [USER], "response_format": {"type": "json_object"}, "regex": "a+"}, "regex"),
    ({"model": "m", "messages": [USER], "regex": "a+", "ebnf": "root ::= 'a'"}, "ebnf"),
    ({"model": "m", "messages": [USER], "regex": ""}, "regex"),
    ({"model": "m", "messages": [USER], "continue_final_message": True}, "continue_final_message"),
    # OpenAI features we refuse rather than drop
    ({"model": "m", "messages": [USER], "logit_bias": {"50256": -100}}, "logit_bias"),
    ({"model": "m", "messages": [USER], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"model": "m", "messages": [USER], "modalities": ["text", "audio"]}, "modalities"),
    ({"model": "m", "messages": [USER], "functions": [{"name": "f"}]}, "functions"),
    ({"model": "m", "messages": [USER], "prediction": {"type": "content", "content": "x"}}, "prediction"),
]


@pytest.mark.parametrize(("fields", "param"), CHAT_REJECTIONS, ids=[p for _, p in CHAT_REJECTIONS])
def test_chat_rejections_name_the_param(fields, param):
    error = rejected(decode_chat_request, json.dumps(fields).encode())
    assert error.param == param
    assert param in error.message


COMPLETION_REJECTIONS = [
    ({"model": "m"}, "prompt"),
    ({"model": "m", "prompt": ""}, "prompt"),
    ({"model": "m", "prompt": []}, "prompt"),
    ({"model": "m", "prompt": 5}, "prompt"),
    ({"model": "m", "prompt": ["a", ""]}, "prompt[1]"),
    ({"model": "m", "prompt": [[1], []]}, "prompt[1]"),
    ({"model": "m", "prompt": [1, -2]}, "prompt[1]"),
    ({"model": "m", "prompt": [[1], [2, -3]]}, "prompt[1][1]"),
    ({"model": "m", "prompt": [1, "a"]}, "prompt[1]"),
    ({"model": "m", "prompt": ["a", [1]]}, "prompt[1]"),
    ({"model": "m", "prompt": [{"text": "a"}]}, "prompt[0]"),
    ({"model": "m", "prompt": [[1, "a"]]}, "prompt[0][1]"),
    ({"model": "m", "prompt": [True]}, "prompt[0]"),
    ({"model": "m", "prompt": "hi", "suffix": "bye"}, "suffix"),
    ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "prompt": "hi", "min_tokens": 17}, "min_tokens"),
    ({"model": "m", "prompt": "hi", "best_of": 2}, "best_of"),
    ({"model": "m", "prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"model": "m", "prompt": "hi", "logprobs": True}, "logprobs"),
    ({"model": "m", "prompt": "hi", "echo": "yes"}, "echo"),
    ({"model": "m", "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"model": "m", "prompt": "hi", "temperature": 3}, "temperature"),
]


@pytest.mark.parametrize(("fields", "param"), COMPLETION_REJECTIONS, ids=[p for _, p in COMPLETION_REJECTIONS])
def test_completion_rejections_name_the_param(fields, param):
    error = rejected(decode_completion_request, json.dumps(fields).encode())
    assert error.param == param
    assert param in error.message


def test_unsupported_features_say_so():
    error = rejected(decode_chat_request, chat(logit_bias={"1": 5}))
    assert error.code == "unsupported_parameter"
    assert "not supported" in error.message


# Run in a fresh interpreter: msgspec builds a request type's validators once per process, on first
# use, calling back into Python (`msgspec._utils.get_class_annotations`) for every struct type.
_FIRST_DECODES = """
import json, sys
from trio_direct.openai import requests
from trio_direct.openai.errors import openai_error_body

if sys.argv[1] == "warm":
    requests.warm_up_request_decoding()
built = []
sys.setprofile(lambda frame, event, arg: event == "call" and frame.f_code.co_name == "get_class_annotations"
               and built.append(frame.f_locals.get("obj")))
tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
requests.decode_chat_request(json.dumps({
    "model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "tools": [tool],
    "stream": True, "stream_options": {"include_usage": True}, "response_format": {"type": "json_object"},
}).encode())
requests.decode_completion_request(b'{"model": "m", "prompt": [1, 2, 3], "logprobs": 2}')
sys.setprofile(None)
print(len(built))
"""


@pytest.mark.parametrize("warm", [True, False])
def test_after_the_warm_up_the_first_requests_find_their_validators_built(warm):
    import subprocess
    import sys

    mode = "warm" if warm else "cold"
    result = subprocess.run([sys.executable, "-c", _FIRST_DECODES, mode], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    built = int(result.stdout)
    if warm:
        assert built == 0
    else:  # the check can see the work the warm-up saves
        assert built > 10
