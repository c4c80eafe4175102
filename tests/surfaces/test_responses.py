"""The Responses surface: its bytes read by the `openai` SDK's own models and stream reader, and its
input (items, stored history, instructions, tools, text.format, extensions) planned as chat plans it."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.responses import FunctionToolParam, Response, ResponseFunctionToolCall, ResponseStreamEvent
from pydantic import TypeAdapter
from surface_support import (
    TOOL_TURN,
    event,
    one_choice_plan,
    result_of,
    sse_records,
    stream,
    tiny_pool,
)

from trio_direct.core.errors import ApiError, rate_limited
from trio_direct.openai.responses_request import decode_responses_request
from trio_direct.surfaces.conversation import assistant_message
from trio_direct.surfaces.responses import (
    ResponsesRenderer,
    conversation_request,
    input_messages,
    plan_response,
    response_fields,
)

EVENTS = TypeAdapter(ResponseStreamEvent)
TOOLS: list[FunctionToolParam] = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}  # type: ignore[typeddict-item]  # "strict" left out on purpose: the API defaults it, the SDK marks it Required
]


def request(**fields):
    return decode_responses_request(json.dumps({"model": "m", "input": "What is the weather?", **fields}).encode())


def renderer(plan, on_finished=None, **fields) -> ResponsesRenderer:
    return ResponsesRenderer(plan, response_fields(request(**fields)), on_finished=on_finished)


def events_of(data: bytes) -> list:
    events = []
    for name, payload in sse_records(data):
        parsed = EVENTS.validate_json(payload)  # every event is one of the SDK's event models
        assert parsed.type == name
        events.append(parsed)
    return events


def sdk_answering(body: bytes, content_type: str) -> openai.OpenAI:
    transport = httpx.MockTransport(lambda _: httpx.Response(200, content=body, headers={"content-type": content_type}))
    return openai.OpenAI(
        api_key="k",
        base_url="http://frontend.test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=transport),  # type: ignore[arg-type]  # the SDK takes a legacy httpx.Client too (checked at run time); its types name only httpx2
    )


# ---- the stream ---------------------------------------------------------------------------------


def test_a_tool_turn_streams_the_responses_event_sequence():
    plan = one_choice_plan("resp_")
    events = events_of(stream(renderer(plan, tools=TOOLS), plan, TOOL_TURN))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",  # reasoning
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # message
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",  # function call
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, done = events[0].response, events[-1].response
    assert (created.id, created.status, created.output, created.usage) == (plan.id, "in_progress", [], None)
    text_done = next(e for e in events if e.type == "response.output_text.done")
    assert text_done.text == "".join(e.delta for e in events if e.type == "response.output_text.delta")
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"city": "Paris"}
    assert next(e for e in events if e.type == "response.function_call_arguments.done").arguments == arguments
    reasoning, message, call = done.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "The user wants the weather."
    assert (
        message.type == "message" and message.content[0].text == "\n\nLet me check." and message.status == "completed"
    )
    assert (call.type, call.name, call.call_id, call.arguments, call.status) == (
        "function_call", "get_weather", "call_1", arguments, "completed"
    )  # fmt: skip
    assert done.status == "completed" and done.tools[0].name == "get_weather"
    usage = done.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (12, 7, 19)
    assert usage.input_tokens_details.cached_tokens == 4
    # every item's id is the same in its added event, its deltas and its done event
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    assert added == [item.id for item in done.output] and len(set(added)) == 3


def test_the_sdk_reads_the_stream_and_assembles_the_final_response():
    plan = one_choice_plan("resp_")
    data = stream(renderer(plan, tools=TOOLS), plan, TOOL_TURN)
    client = sdk_answering(data, "text/event-stream")
    with client.responses.stream(model="m", input="x", tools=TOOLS) as events:
        final = events.get_final_response()
    assert final.output_text == "\n\nLet me check."
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    raw = list(client.responses.create(model="m", input="x", stream=True))
    assert raw[-1].type == "response.completed" and raw[-1].response.id == plan.id


def test_output_cut_by_max_output_tokens_is_incomplete():
    plan = one_choice_plan("resp_")
    events = events_of(stream(renderer(plan), plan, [[event("Once upon")], [event(" a time", finish="length")]]))
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete" and final.output[0].content[0].text == "Once upon a time"


def test_a_failure_mid_stream_is_an_error_event_then_response_failed():
    plan = one_choice_plan("resp_")
    r = renderer(plan)
    r.prepare()
    data = r.opening() + r.events([event("Hel")]) + r.failure(rate_limited("The engine is at capacity; retry later."))
    events = events_of(data)
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-2].message == "The engine is at capacity; retry later."
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "rate_limit_exceeded"
    assert failed.output[0].content[0].text == "Hel" and failed.output[0].status == "in_progress"


# ---- one body -----------------------------------------------------------------------------------


def test_the_unary_response_matches_the_sdk_model_and_the_stream():
    plan = one_choice_plan("resp_")
    stored = []
    body = renderer(plan, lambda body, blocks: stored.append((body, blocks)), tools=TOOLS, metadata={"k": "v"}).unary(
        [result_of(TOOL_TURN)], plan.usage()
    )
    response = Response.model_validate_json(body)
    assert response.object == "response" and response.status == "completed" and response.metadata == {"k": "v"}
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.output_text == "\n\nLet me check."
    streamed = events_of(stream(renderer(one_choice_plan("resp_"), tools=TOOLS), plan, TOOL_TURN))[-1].response
    assert [i.model_dump(exclude={"id"}) for i in response.output] == [
        i.model_dump(exclude={"id"}) for i in streamed.output
    ]
    # what is stored is the body as sent, and the output as the next turn's assistant message
    ((stored_body, blocks),) = stored
    assert stored_body == body
    assert assistant_message(blocks) == {
        "role": "assistant",
        "content": "\n\nLet me check.",
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    }
    client = sdk_answering(body, "application/json")
    call = client.responses.create(model="m", input="x").output[2]
    assert isinstance(call, ResponseFunctionToolCall) and call.call_id == "call_1"


# ---- input ------------------------------------------------------------------------------------------


def test_input_items_become_chat_messages():
    items = request(input=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "22C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
    ]).input  # fmt: skip
    assert input_messages(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "?"}]},
        {
            "role": "assistant",
            "reasoning_content": "Use the tool.",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
    ]


def test_a_function_call_output_must_answer_a_call_made_before():
    items = request(input=[{"type": "function_call_output", "call_id": "call_9", "output": "x"}]).input
    with pytest.raises(ApiError) as raised:
        input_messages(items)
    assert (raised.value.status, raised.value.param) == (400, "input[0].call_id")
    history = [
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
    ]
    assert input_messages(items, history) == [{"role": "tool", "tool_call_id": "call_9", "content": "x"}]


async def test_planning_puts_instructions_first_and_maps_every_field_as_chat_does(tiny_model):
    pool = tiny_pool(tiny_model)
    history = [{"role": "user", "content": "Earlier question"}, {"role": "assistant", "content": "Earlier answer"}]
    req = request(
        instructions="You are terse.",
        input="Next question",
        max_output_tokens=33,
        temperature=0.5,
        top_p=0.9,
        text={"format": {"type": "json_schema", "name": "city", "schema": {"type": "object"}}},
        top_k=5,
        min_tokens=2,
        ignore_eos=True,
        repetition_penalty=1.1,
        stop=["END"],
    )
    plan = await plan_response(pool, req, history + input_messages(req.input))
    assert plan.id.startswith("resp_") and len(plan.choices) == 1
    text = plan.prompts[0].text
    assert text.index("system\nYou are terse.") < text.index("Earlier question") < text.index("Next question")
    sampling = plan.choices[0].request.sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (33, 0.5, 0.9, 5)
    assert (sampling.min_new_tokens, sampling.ignore_eos, sampling.repetition_penalty) == (2, True, 1.1)
    assert sampling.json_schema == '{"type":"object"}' and sampling.stop == ("END",)
    assert plan.choices[0].output.stops is not None and plan.choices[0].output.reasoning_parser is not None


@pytest.mark.parametrize(("effort", "chat"), [("low", "low"), ("high", "high"), ("none", "minimal"), (None, None)])
def test_reasoning_effort_is_chats(effort, chat):
    req = request(reasoning={"effort": effort} if effort else None)
    assert conversation_request(req, input_messages(req.input)).reasoning_effort == chat


def test_an_effort_chat_does_not_know_is_refused():
    req = request(reasoning={"effort": "xhigh"})
    with pytest.raises(ApiError) as raised:
        conversation_request(req, input_messages(req.input))
    assert (raised.value.status, raised.value.param) == (400, "reasoning.effort")


async def test_a_forced_function_is_guided_decoding_of_its_parameters(tiny_model):
    pool = tiny_pool(tiny_model)
    req = request(tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"})
    plan = await plan_response(pool, req, input_messages(req.input))
    schema = plan.choices[0].request.sampling.json_schema
    assert schema is not None and json.loads(schema) == TOOLS[0]["parameters"]
    assert type(plan.choices[0].output.tool_parser).__name__ == "NamedToolCallParser"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
        ({"truncation": "auto"}, "truncation"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ],
)
def test_bad_requests_name_their_param(fields, param):
    with pytest.raises(ApiError) as raised:
        request(**fields)
    assert (raised.value.status, raised.value.param) == (400, param)
