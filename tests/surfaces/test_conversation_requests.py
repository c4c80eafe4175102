"""Messages and Responses requests become the planner's `ConversationRequest` straight from their
typed requests: no chat body is written and chat's decoder never runs, yet the template sees the
messages chat's decoder would give it (key order included) and a value chat refuses is refused
with chat's words."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from surface_support import tiny_pool

from trio_direct.anthropic.requests import decode_count_tokens_request, decode_messages_request
from trio_direct.core.errors import ApiError
from trio_direct.openai import requests as chat_requests
from trio_direct.openai.requests import chat_request_from_object, decode_chat_request
from trio_direct.openai.responses_request import decode_responses_request
from trio_direct.surfaces import messages, responses
from trio_direct.surfaces.conversation import stored_messages

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def messages_request(**fields):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Weather?"}], **fields}
    return decode_messages_request(json.dumps(body).encode())


def responses_request(**fields):
    return decode_responses_request(json.dumps({"model": "m", "input": "Weather?", **fields}).encode())


@pytest.fixture
def no_chat_decoding(monkeypatch):
    """Chat's body decoder raises if anything calls it (after the test's own requests are decoded)."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("chat's body decoder was called")

    monkeypatch.setattr(chat_requests, "chat_request_from_object", refuse)
    monkeypatch.setattr(chat_requests, "decode_object", refuse)


def as_chat_decodes_them(conversation) -> tuple[str, str]:
    """The conversation's messages and tools as chat's decoder would hand them to the template
    (JSON text: key order counts)."""
    chat = chat_request_from_object({"model": "m", "messages": conversation.messages, "tools": conversation.tools})
    tools = msgspec.to_builtins(chat.tools) if chat.tools else None
    return json.dumps(msgspec.to_builtins(chat.messages)), json.dumps(tools)


def as_given(conversation) -> tuple[str, str]:
    return json.dumps(conversation.messages), json.dumps(conversation.tools)


async def test_a_messages_request_is_planned_without_chats_decoder(tiny_model, no_chat_decoding):
    request = messages_request(
        system="Be terse.",
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "22C"}]},
        ],
        tools=[{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        max_tokens=2048,
        stop_sequences=["END"],
        temperature=0.3,
        top_k=0,
        min_tokens=2,
        stream=True,
    )  # fmt: skip
    conversation = messages.conversation_request(request, eos_token_ids=(2,))
    assert conversation.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    "type": "function",
                }
            ],
            "reasoning_content": "Use the tool.",
        },
        {"role": "tool", "content": "22C", "tool_call_id": "toolu_1"},
    ]
    assert conversation.tools == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}
    ]
    assert (conversation.tool_choice, conversation.forced_tool) == (None, "get_weather")
    assert conversation.chat_template_kwargs == {"enable_thinking": True}
    assert not conversation.continue_final_message and conversation.stream
    sampling = conversation.sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_k) == (2048, 0.3, -1)
    assert (sampling.stop, sampling.min_new_tokens, sampling.stop_token_ids) == (("END",), 2, (2,))
    assert as_given(conversation) == as_chat_decodes_them(conversation)

    plan = await messages.plan_message(tiny_pool(tiny_model), request)
    assert plan.id.startswith("msg_") and plan.stream
    engine_sampling = plan.choices[0].request.sampling
    assert json.loads(engine_sampling.json_schema or "") == WEATHER  # the forced tool, by guided decoding
    assert engine_sampling.stop_token_ids  # the tokenizer's EOS
    assert type(plan.choices[0].output.tool_parser).__name__ == "NamedToolCallParser"


async def test_count_tokens_counts_the_conversation_without_chats_decoder(tiny_model, no_chat_decoding):
    body = {"model": "m", "system": "Be terse.", "messages": [{"role": "user", "content": "Weather?"}]}
    request = decode_count_tokens_request(json.dumps(body).encode())
    counted = await messages.conversation_prompt(tiny_pool(tiny_model), messages.conversation_request(request))
    planned = await messages.plan_message(tiny_pool(tiny_model), messages_request(**body))
    assert counted.token_ids == planned.prompts[0].token_ids


async def test_a_responses_request_is_planned_without_chats_decoder(tiny_model, no_chat_decoding):
    request = responses_request(
        instructions="Be terse.",
        input=[
            {"role": "developer", "content": "Metric units."},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "22C"},
            {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}],
        tool_choice="required",
        max_output_tokens=33,
        top_p=0.9,
        stop="END",
        reasoning={"effort": "none"},
        ignore_eos=True,
        stop_token_ids=[7],
    )
    history = [{"role": "user", "content": "Earlier"}, {"role": "assistant", "content": "Answer"}]
    messages = history + responses.input_messages(request.input)
    conversation = responses.conversation_request(request, messages, eos_token_ids=(2,))
    assert conversation.messages == [
        {"role": "system", "content": "Be terse."},
        *history,
        {"role": "system", "content": "Metric units."},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    "type": "function",
                }
            ],
            "reasoning_content": "Use the tool.",
        },
        {"role": "tool", "content": "22C", "tool_call_id": "call_1"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    assert conversation.tools == [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}
    ]
    assert (conversation.tool_choice, conversation.forced_tool, conversation.reasoning_effort) == (
        "required",
        None,
        "minimal",
    )
    sampling = conversation.sampling
    assert (sampling.max_new_tokens, sampling.top_p, sampling.stop) == (33, 0.9, ("END",))
    assert (sampling.ignore_eos, sampling.stop_token_ids) == (True, (7,))  # ignore_eos: no EOS added
    assert as_given(conversation) == as_chat_decodes_them(conversation)

    plan = await responses.plan_response(tiny_pool(tiny_model), request, messages)
    assert plan.id.startswith("resp_")
    engine_sampling = plan.choices[0].request.sampling
    assert json.loads(engine_sampling.json_schema or "")["minItems"] == 1  # "required", by guided decoding
    assert type(plan.choices[0].output.tool_parser).__name__ == "RequiredToolCallsParser"


def test_stored_messages_are_put_in_chats_key_order():
    """A conversation an earlier version stored (its own key order) reads back as chat's decoder
    would have given it to the template."""
    stored: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "reasoning_content": "Use the tool.",
            "content": "Checking.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "22C"},
    ]
    ordered = stored_messages(stored)
    assert ordered == stored
    chat = chat_request_from_object({"model": "m", "messages": stored})
    assert json.dumps(ordered) == json.dumps(msgspec.to_builtins(chat.messages))


def chats_error(fields: dict) -> ApiError:
    with pytest.raises(ApiError) as raised:
        decode_chat_request(
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields}).encode()
        )
    return raised.value


@pytest.mark.parametrize(
    ("fields", "chat_fields"),
    [
        ({"min_p": 5}, {"min_p": 5}),
        ({"stop_sequences": [str(i) for i in range(17)]}, {"stop": [str(i) for i in range(17)]}),
        ({"regex": "a", "ebnf": "b"}, {"regex": "a", "ebnf": "b"}),
        ({"min_tokens": 65}, {"min_tokens": 65, "max_tokens": 64}),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {}}}, "regex": "a"},
            {"response_format": {"type": "json_object"}, "regex": "a"},
        ),
    ],
)
def test_messages_values_chat_refuses_are_refused_in_chats_words(fields, chat_fields):
    with pytest.raises(ApiError) as raised:
        messages.conversation_request(messages_request(**fields))
    expected = chats_error(chat_fields)
    assert (raised.value.status, raised.value.message, raised.value.param) == (400, expected.message, expected.param)


@pytest.mark.parametrize(
    ("fields", "chat_fields"),
    [
        ({"temperature": 3}, {"temperature": 3}),
        ({"stop": ""}, {"stop": ""}),
        ({"top_k": -2}, {"top_k": -2}),
        (
            {"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}},
            {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
        ),
        ({"tool_choice": "required"}, {"tool_choice": "required"}),
    ],
)  # fmt: skip
def test_responses_values_chat_refuses_are_refused_in_chats_words(fields, chat_fields):
    request = responses_request(**fields)
    with pytest.raises(ApiError) as raised:
        responses.conversation_request(request, responses.input_messages(request.input))
    expected = chats_error(chat_fields)
    assert (raised.value.status, raised.value.message, raised.value.param) == (400, expected.message, expected.param)
