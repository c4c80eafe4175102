"""The Messages surface: its bytes read by the `anthropic` SDK's own models and stream accumulator,
and its blocks (system, tool_use, tool_result, thinking) planned as chat plans them."""

from __future__ import annotations

import json

import anthropic
import httpx2
import pytest
from anthropic.types import Message, MessageParam, RawMessageStreamEvent, TextBlock, ThinkingBlock, ToolUseBlock
from pydantic import TypeAdapter
from surface_support import (
    SWITCHES_TEMPLATE,
    TOOL_TURN,
    event,
    one_choice_plan,
    result_of,
    sse_records,
    stream,
    tiny_pool,
)

from trio_direct.anthropic.requests import decode_count_tokens_request, decode_messages_request
from trio_direct.core.errors import ApiError, service_unavailable
from trio_direct.surfaces.messages import MessagesRenderer, chat_messages, plan_message

EVENTS = TypeAdapter(RawMessageStreamEvent)
TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {}}}]


def request(**fields):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Weather?"}], **fields}
    return decode_messages_request(json.dumps(body).encode())


def events_of(data: bytes) -> list:
    events = []
    for name, payload in sse_records(data):
        if name == "ping":
            events.append(json.loads(payload))
            continue
        parsed = EVENTS.validate_json(payload)  # every event is one of the SDK's event models
        assert parsed.type == name
        events.append(parsed)
    return events


def sdk_answering(body: bytes, content_type: str) -> anthropic.Anthropic:
    def answer(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    client = httpx2.Client(transport=httpx2.MockTransport(answer))
    return anthropic.Anthropic(api_key="k", base_url="http://frontend.test", max_retries=0, http_client=client)


# ---- the stream ---------------------------------------------------------------------------------


def test_a_tool_turn_streams_the_messages_event_sequence():
    plan = one_choice_plan("msg_")
    events = events_of(stream(MessagesRenderer(plan), plan, TOOL_TURN))
    kinds = [e["type"] if isinstance(e, dict) else e.type for e in events]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # text
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0].message
    assert (start.id, start.role, start.content, start.stop_reason) == (plan.id, "assistant", [], None)
    blocks = [e.content_block for e in events if getattr(e, "type", "") == "content_block_start"]
    assert [b.type for b in blocks] == ["thinking", "text", "tool_use"]
    assert (blocks[2].id, blocks[2].name, blocks[2].input) == ("call_1", "get_weather", {})
    deltas = [e for e in events if getattr(e, "type", "") == "content_block_delta"]
    assert [(d.index, d.delta.type) for d in deltas] == [
        (0, "thinking_delta"), (0, "thinking_delta"), (1, "text_delta"), (1, "text_delta"),
        (2, "input_json_delta"), (2, "input_json_delta"),
    ]  # fmt: skip
    assert json.loads("".join(d.delta.partial_json for d in deltas[4:])) == {"city": "Paris"}
    final = events[-2]
    assert (final.delta.stop_reason, final.delta.stop_sequence) == ("tool_use", None)
    # 12 prompt tokens, 4 of them read from the engine's cache
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens, final.usage.output_tokens) == (8, 4, 7)


def test_the_sdk_accumulates_the_stream_into_the_final_message():
    plan = one_choice_plan("msg_")
    client = sdk_answering(stream(MessagesRenderer(plan), plan, TOOL_TURN), "text/event-stream")
    with client.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}]) as events:
        text = "".join(events.text_stream)
        final = events.get_final_message()
    assert text == "\n\nLet me check."
    thinking, said, call = final.content
    assert isinstance(thinking, ThinkingBlock) and isinstance(said, TextBlock) and isinstance(call, ToolUseBlock)
    assert thinking.thinking == "The user wants the weather." and said.text == text
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 7


@pytest.mark.parametrize(
    ("finish", "matched", "reason", "sequence"),
    [("stop", 2, "end_turn", None), ("stop", "END", "stop_sequence", "END"), ("length", None, "max_tokens", None)],
)
def test_stop_reasons(finish, matched, reason, sequence):
    batches = [[event("Hello")], [event(" there", finish=finish, matched=matched)]]
    plan = one_choice_plan("msg_")
    final = events_of(stream(MessagesRenderer(plan), plan, batches))[-2]
    assert (final.delta.stop_reason, final.delta.stop_sequence) == (reason, sequence)
    message = Message.model_validate_json(MessagesRenderer(plan).unary([result_of(batches)], plan.usage()))
    text = message.content[0]
    assert isinstance(text, TextBlock)
    assert (message.stop_reason, message.stop_sequence, text.text) == (reason, sequence, "Hello there")


def test_a_failure_mid_stream_is_anthropics_error_event():
    plan = one_choice_plan("msg_")
    r = MessagesRenderer(plan)
    r.prepare()
    data = r.opening() + r.events([event("Hel")]) + r.failure(service_unavailable("The server is shutting down."))
    name, payload = list(sse_records(data))[-1]
    assert name == "error"
    assert json.loads(payload) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "The server is shutting down."},
    }
    client = sdk_answering(data, "text/event-stream")
    messages: list[MessageParam] = [{"role": "user", "content": "x"}]
    with (
        pytest.raises(anthropic.APIStatusError, match="shutting down"),
        client.messages.stream(model="m", max_tokens=8, messages=messages) as events,
    ):
        events.get_final_message()


# ---- one body -----------------------------------------------------------------------------------


def test_the_unary_message_matches_the_sdk_model_and_the_stream():
    plan = one_choice_plan("msg_")
    body = MessagesRenderer(plan).unary([result_of(TOOL_TURN)], plan.usage())
    message = Message.model_validate_json(body)
    assert (message.type, message.role, message.stop_reason) == ("message", "assistant", "tool_use")
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    call = message.content[2]
    assert isinstance(call, ToolUseBlock) and call.input == {"city": "Paris"}
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (8, 4, 7)
    client = sdk_answering(body, "application/json")
    reply = client.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}])
    said = reply.content[1]
    assert isinstance(said, TextBlock) and said.text == "\n\nLet me check."


# ---- input ------------------------------------------------------------------------------------------


def test_blocks_become_chat_messages():
    req = request(messages=[
        {"role": "user", "content": [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": ""},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22C"}]},
            {"type": "text", "text": "And tomorrow?"},
        ]},
    ])  # fmt: skip
    assert chat_messages(req.messages) == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
            "reasoning_content": "Use the tool.",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "22C"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]


async def test_planning_maps_system_sampling_thinking_and_extensions_as_chat_does(tiny_model):
    pool = tiny_pool(tiny_model)
    req = request(
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in French."}],
        stop_sequences=["END"],
        temperature=0.3,
        top_p=0.8,
        top_k=7,
        thinking={"type": "disabled"},
        ignore_eos=True,
        min_tokens=3,
    )
    plan = await plan_message(pool, req)
    assert plan.id.startswith("msg_")
    assert plan.prompts[0].text.startswith("<|im_start|>system\nYou are terse.\nAnswer in French.<|im_end|>")
    sampling = plan.choices[0].request.sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (64, 0.3, 0.8, 7)
    assert (sampling.stop, sampling.ignore_eos, sampling.min_new_tokens) == (("END",), True, 3)
    assert plan.choices[0].output.reasoning_parser is not None  # reasoning still becomes thinking blocks


@pytest.mark.parametrize(
    ("thinking", "switch"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, "True"),
        ({"type": "adaptive"}, "True"),
        ({"type": "disabled"}, "False"),
    ],
)
async def test_thinking_is_the_templates_enable_thinking(tiny_model, thinking, switch):
    pool = tiny_pool(tiny_model, chat_template=SWITCHES_TEMPLATE)
    plan = await plan_message(pool, request(thinking=thinking, max_tokens=2048))
    assert plan.prompts[0].text.endswith(f"enable_thinking={switch}")
    unset = await plan_message(pool, request())
    assert unset.prompts[0].text.endswith("enable_thinking=")  # not given: the template's own default


async def test_any_and_named_tool_choices_are_guided_decoding(tiny_model):
    pool = tiny_pool(tiny_model)
    named = await plan_message(pool, request(tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}))
    named_schema = named.choices[0].request.sampling.json_schema
    assert named_schema is not None and json.loads(named_schema) == TOOLS[0]["input_schema"]
    required = await plan_message(pool, request(tools=TOOLS, tool_choice={"type": "any"}))
    required_schema = required.choices[0].request.sampling.json_schema
    assert required_schema is not None and json.loads(required_schema)["minItems"] == 1
    structured = await plan_message(
        pool, request(output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    )
    assert structured.choices[0].request.sampling.json_schema == '{"type":"object"}'


@pytest.mark.parametrize(
    ("choice", "parser"), [({"type": "auto"}, "HermesParser"), ({"type": "none"}, None), (None, "HermesParser")]
)
async def test_auto_and_none_tool_choices_parse_the_models_markup_or_not(tiny_model, choice, parser):
    plan = await plan_message(tiny_pool(tiny_model), request(tools=TOOLS, tool_choice=choice))
    tools = plan.choices[0].output.tool_parser
    assert (type(tools).__name__ if tools is not None else None) == parser
    assert plan.choices[0].request.sampling.json_schema is None


async def test_a_last_assistant_message_is_continued(tiny_model):
    pool = tiny_pool(tiny_model)
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}]
    plan = await plan_message(pool, request(messages=messages))
    assert plan.prompts[0].text.endswith("<|im_start|>assistant\nOne, two,")


def test_count_tokens_takes_the_prompt_fields_without_max_tokens():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s", "tools": TOOLS}
    tools = decode_count_tokens_request(json.dumps(body).encode()).tools
    assert tools is not None and tools[0].name == "get_weather"


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"max_tokens": None}, "max_tokens", "max_tokens: Field required"),
        ({"max_tokens": 0}, "max_tokens", None),
        ({"messages": []}, "messages", None),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", None),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
            None,
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages[0].content[0]",
            None,
        ),
        ({"messages": [{"role": "user", "content": [{"type": "nope"}]}]}, "messages[0].content[0].type", None),
        ({"temperature": 1.5}, "temperature", None),
        ({"top_k": -1}, "top_k", None),
        ({"stop_sequences": [""]}, "stop_sequences[0]", None),
        ({"tools": [{"type": "bash_20250124", "name": "bash", "input_schema": {}}]}, "tools[0].type", None),
        ({"tool_choice": {"type": "tool", "name": "missing"}, "tools": TOOLS}, "tool_choice", None),
        ({"tool_choice": {"type": "any"}}, "tool_choice", None),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens", None),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.budget_tokens", None),
        ({"mcp_servers": [{"url": "x"}]}, "mcp_servers", None),
    ],
)
def test_bad_requests_are_refused_naming_the_field(fields, param, message):
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "x"}], **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ApiError) as raised:
        decode_messages_request(json.dumps(body).encode())
    assert (raised.value.status, raised.value.param) == (400, param)
    if message is not None:
        assert raised.value.message == message
