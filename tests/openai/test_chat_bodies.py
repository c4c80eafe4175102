"""Response bytes have OpenAI's shapes: checked with the OpenAI SDK's own models and its stream reader."""

from __future__ import annotations

import json

import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageFunctionToolCall

from trio_direct.core import errors
from trio_direct.core.plan import Usage
from trio_direct.openai.chat_bodies import (
    DONE,
    ChatChoice,
    CompletionChoice,
    ResponseMessage,
    chat_chunk,
    chat_completion,
    chat_role_chunk,
    completion,
    completion_chunk,
    error_chunk,
    model_body,
    model_card,
    models_list,
    usage_chunk,
)

ID, CREATED, MODEL = "chatcmpl-1", 1_700_000_000, "tiny"
MESSAGES = [{"role": "user", "content": "hi"}]


def sse_payload(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert b"\n" not in event[:-2]  # one line per event, whatever the text holds
    return json.loads(event[len(b"data: ") : -2])


def test_chat_chunk_matches_the_sdk_model():
    event = chat_chunk(ID, CREATED, MODEL, 1, {"content": "Hel\nlo"})
    chunk = ChatCompletionChunk.model_validate(sse_payload(event))
    assert (chunk.id, chunk.object, chunk.created, chunk.model) == (ID, "chat.completion.chunk", CREATED, MODEL)
    (choice,) = chunk.choices
    assert (choice.index, choice.delta.content, choice.finish_reason) == (1, "Hel\nlo", None)
    assert chunk.usage is None


def test_role_chunk_announces_the_assistant():
    chunk = ChatCompletionChunk.model_validate(sse_payload(chat_role_chunk(ID, CREATED, MODEL, 0)))
    assert chunk.choices[0].delta.role == "assistant"
    assert chunk.choices[0].delta.content == ""


def test_final_chunk_carries_finish_reason_tool_calls_and_logprobs():
    tool_call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    logprobs = {"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []}]}
    event = chat_chunk(ID, CREATED, MODEL, 0, {"tool_calls": [tool_call]}, "tool_calls", logprobs=logprobs)
    choice = ChatCompletionChunk.model_validate(sse_payload(event)).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.delta.tool_calls is not None and choice.logprobs is not None and choice.logprobs.content is not None
    function = choice.delta.tool_calls[0].function
    assert function is not None and function.name == "f"
    assert choice.logprobs.content[0].logprob == -0.5


def test_usage_follows_the_spec():
    usage = Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4)
    chunk = ChatCompletionChunk.model_validate(sse_payload(usage_chunk(ID, CREATED, MODEL, usage)))
    assert chunk.choices == [] and chunk.usage is not None
    assert (chunk.usage.prompt_tokens, chunk.usage.completion_tokens, chunk.usage.total_tokens) == (10, 5, 15)
    assert chunk.usage.prompt_tokens_details is not None and chunk.usage.prompt_tokens_details.cached_tokens == 4
    assert "completion_tokens_details" not in sse_payload(usage_chunk(ID, CREATED, MODEL, usage))["usage"]


def test_reasoning_tokens_appear_only_when_there_was_reasoning():
    usage = Usage(prompt_tokens=1, completion_tokens=9, reasoning_tokens=6)
    chunk = ChatCompletionChunk.model_validate(sse_payload(usage_chunk(ID, CREATED, MODEL, usage)))
    assert chunk.usage is not None and chunk.usage.completion_tokens_details is not None
    assert chunk.usage.completion_tokens_details.reasoning_tokens == 6


def test_continuous_usage_rides_on_a_content_chunk():
    event = chat_chunk(ID, CREATED, MODEL, 0, {"content": "x"}, usage=Usage(3, 1))
    usage = ChatCompletionChunk.model_validate(sse_payload(event)).usage
    assert usage is not None and usage.total_tokens == 4


def test_completion_chunks_match_the_sdk_model():
    event = completion_chunk("cmpl-1", CREATED, MODEL, 2, "abc", "length")
    chunk = Completion.model_validate(sse_payload(event))
    assert chunk.object == "text_completion"
    assert (chunk.choices[0].index, chunk.choices[0].text, chunk.choices[0].finish_reason) == (2, "abc", "length")
    final = Completion.model_validate(sse_payload(usage_chunk("cmpl-1", CREATED, MODEL, Usage(2, 3), chat=False)))
    assert (
        final.object == "text_completion"
        and final.choices == []
        and final.usage is not None
        and final.usage.total_tokens == 5
    )


def test_unary_chat_completion_matches_the_sdk_model():
    tool_call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    choices = [
        ChatChoice(index=0, message=ResponseMessage(content="Hello", reasoning_content="Think."), finish_reason="stop"),
        ChatChoice(index=1, message=ResponseMessage(content=None, tool_calls=[tool_call]), finish_reason="tool_calls"),
    ]
    body = chat_completion(ID, CREATED, MODEL, choices, Usage(7, 4, cached_tokens=2))
    response = ChatCompletion.model_validate_json(body)
    assert response.object == "chat.completion"
    first, second = response.choices
    assert (first.message.role, first.message.content, first.finish_reason) == ("assistant", "Hello", "stop")
    assert first.message.model_extra is not None and first.message.model_extra["reasoning_content"] == "Think."
    assert second.message.content is None and second.message.tool_calls is not None
    call = second.message.tool_calls[0]
    assert isinstance(call, ChatCompletionMessageFunctionToolCall) and call.function.arguments == '{"a": 1}'
    assert response.usage is not None and response.usage.prompt_tokens_details is not None
    assert response.usage.prompt_tokens_details.cached_tokens == 2
    raw = json.loads(body)
    assert "reasoning_content" not in raw["choices"][1]["message"] and "content" in raw["choices"][1]["message"]


def test_unary_completion_matches_the_sdk_model():
    choices = [CompletionChoice(index=0, text="abc", finish_reason="stop")]
    body = completion("cmpl-1", CREATED, MODEL, choices, Usage(1, 3))
    response = Completion.model_validate_json(body)
    assert response.usage is not None
    assert (response.object, response.choices[0].text, response.usage.total_tokens) == ("text_completion", "abc", 4)


def test_sdk_streams_our_chat_events(answering):
    usage = Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
    events = [
        chat_role_chunk(ID, CREATED, MODEL, 0),
        chat_chunk(ID, CREATED, MODEL, 0, {"content": "Hi"}),
        chat_chunk(ID, CREATED, MODEL, 0, {"content": " there"}, "stop"),
        usage_chunk(ID, CREATED, MODEL, usage),
        DONE,
    ]
    client = answering(200, b"".join(events), "text/event-stream")
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there"
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 1


def test_sdk_streams_our_completion_events(answering):
    events = [
        completion_chunk("cmpl-1", CREATED, MODEL, 0, "a"),
        completion_chunk("cmpl-1", CREATED, MODEL, 0, "b", "length"),
        DONE,
    ]
    client = answering(200, b"".join(events), "text/event-stream")
    texts = [chunk.choices[0].text for chunk in client.completions.create(model=MODEL, prompt="x", stream=True)]
    assert texts == ["a", "b"]


def test_sdk_raises_on_a_mid_stream_error_event(answering):
    events = [
        chat_role_chunk(ID, CREATED, MODEL, 0),
        error_chunk(errors.engine_failure("The engine failed mid-stream.")),
    ]
    client = answering(200, b"".join(events), "text/event-stream")
    with pytest.raises(openai.APIError, match="The engine failed mid-stream."):
        list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))


def test_models_list_through_the_sdk(answering):
    cards = [model_card(name, CREATED, max_model_len=4096) for name in ("tiny", "big")]
    client = answering(200, models_list(cards))
    models = list(client.models.list())
    assert [(m.id, m.object, m.owned_by, m.created) for m in models] == [
        ("tiny", "model", "trio-direct", CREATED),
        ("big", "model", "trio-direct", CREATED),
    ]
    assert models[0].model_extra["max_model_len"] == 4096
    raw = json.loads(models_list([model_card("tiny", CREATED)]))
    assert raw["object"] == "list" and "max_model_len" not in raw["data"][0]
    Model.model_validate(raw["data"][0])


def test_one_model_through_the_sdk(answering):
    client = answering(200, model_body(model_card("org/tiny", CREATED)))
    model = client.models.retrieve("org/tiny")
    assert (model.id, model.object, model.created) == ("org/tiny", "model", CREATED)


def test_done_sentinel():
    assert DONE == b"data: [DONE]\n\n"
