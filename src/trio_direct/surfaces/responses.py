"""`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`: OpenAI's Responses API on the request core.

The input (a string, or items: messages, function calls and their outputs, reasoning) becomes
chat messages, after the stored conversation of `previous_response_id` and after `instructions` as
a system message (instructions are not carried over to the next turn, as OpenAI's reference says);
tools, tool choice, `text.format` (guided decoding), `max_output_tokens` and the sampling fields
become a `ConversationRequest` (`surfaces.conversation`) directly, planned as chat plans its own
(`surfaces.chat.plan_conversation`) and held to chat's rules for the fields it shares with chat,
with chat's words. The output is rendered as Responses output items, streamed as Responses events.

Mapping decisions, as SGLang's gateway makes them: an assistant turn (reasoning, message and
function calls in a row) is one chat assistant message with `reasoning_content` and `tool_calls`;
a `function_call_output` is a `tool` message; `developer` messages are system messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from trio_direct.core import errors
from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceEvent, ChoiceResult
from trio_direct.core.plan import RequestPlan, Usage
from trio_direct.openai import responses_output as objects
from trio_direct.openai.responses_request import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoice,
    InputImage,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    decode_responses_request,
)
from trio_direct.openai.sampling import JSON_OBJECT_SCHEMA, extension_sampling, json_schema_text, stop_tuple
from trio_direct.surfaces.chat import plan_conversation
from trio_direct.surfaces.conversation import (
    ConversationRequest,
    assistant_message,
    chat_tool,
    chat_tool_call,
    check_as_chat,
    stored_messages,
    template_message,
)
from trio_direct.surfaces.images import require_image_support, responses_image_part
from trio_direct.surfaces.output_blocks import BlockSequencer, BlockStep, OutputBlock, blocks_of
from trio_direct.surfaces.response_store import ConversationStore, ResponseStore, new_item_id
from trio_direct.tenants import access as tenant_access

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = [
    "ResponsesRenderer",
    "conversation_request",
    "create",
    "delete",
    "input_item_objects",
    "input_items",
    "input_messages",
    "item_page",
    "item_structs",
    "plan_response",
    "response_fields",
    "retrieve",
]

#: Called with a finished response's body and output blocks, before the body is written.
OnFinished = Callable[[bytes, list[OutputBlock]], None]


async def create(exchange: Exchange) -> None:
    request = decode_responses_request(exchange.body)
    frontend = exchange.frontend
    pool = frontend.pool(request.model)
    exchange.label(pool.name, request.stream)
    store = ResponseStore(frontend.state, tenant_access.owner())
    conversations = ConversationStore(frontend.state, tenant_access.owner())
    history: list[dict[str, Any]] = []
    conversation: dict[str, Any] | None = None
    if request.previous_response_id is not None:
        previous = await store.get(request.previous_response_id)
        if previous is None:
            raise errors.ApiError(
                f"Previous response with id '{request.previous_response_id}' not found.",
                status=404,
                type="invalid_request_error",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = stored_messages(previous.conversation())
    elif request.conversation is not None:
        conversation_id = request.conversation if isinstance(request.conversation, str) else request.conversation.id
        conversation = await conversations.get(conversation_id)
        if conversation is None:
            raise errors.ApiError(
                f"Conversation with id '{conversation_id}' not found.",
                status=404,
                type="invalid_request_error",
                param="conversation",
            )
        history = input_messages(item_structs(await conversations.items(conversation_id), "conversation"))
    turn = input_messages(request.input, history)
    plan = await plan_response(pool, request, history + turn, session_key=exchange.session_key(request.user))
    fields = response_fields(request)
    if conversation is not None:
        fields["conversation"] = {"id": conversation["id"]}
    if not request.store and conversation is None:
        await exchange.respond(pool, plan, ResponsesRenderer(plan, fields))
        return
    finished: list[tuple[bytes, list[OutputBlock]]] = []
    inputs = input_item_objects(request.input)

    async def settle() -> None:
        """Store the finished response (and grow its conversation) before the client has it."""
        if not finished:
            return
        body, blocks = finished[-1]
        if request.store:
            await store.put(plan.id, body, [*history, *turn, assistant_message(blocks)], inputs)
        if conversation is not None:
            await conversations.add_items(conversation, [*inputs, *msgspec.json.decode(body)["output"]])

    renderer = ResponsesRenderer(plan, fields, on_finished=lambda body, blocks: finished.append((body, blocks)))
    await exchange.respond(pool, plan, renderer, settle=settle)


async def retrieve(exchange: Exchange) -> None:
    response_id = exchange.params["response_id"]
    stored = await ResponseStore(exchange.frontend.state, tenant_access.owner()).get(response_id)
    if stored is None:
        raise _unknown(response_id)
    await exchange.json(200, stored.body)


async def delete(exchange: Exchange) -> None:
    response_id = exchange.params["response_id"]
    if not await ResponseStore(exchange.frontend.state, tenant_access.owner()).delete(response_id):
        raise _unknown(response_id)
    await exchange.json(200, objects.deleted_body(response_id))


async def input_items(exchange: Exchange) -> None:
    """`GET /v1/responses/{id}/input_items`: the items the response was made from, a page at a time."""
    response_id = exchange.params["response_id"]
    stored = await ResponseStore(exchange.frontend.state, tenant_access.owner()).get(response_id)
    if stored is None:
        raise _unknown(response_id)
    await exchange.json(200, objects.encode(item_page(exchange, stored.input_items())))


def _unknown(response_id: str) -> ApiError:
    return errors.not_found(f"Response with id '{response_id}' not found.")


# ---- items ----------------------------------------------------------------------------------------

_ITEM_ID_PREFIXES = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


def input_item_objects(input: str | list[InputItem]) -> list[dict[str, Any]]:
    """This turn's input as Responses item objects, each with an id (as `input_items` and a
    conversation's items list them)."""
    items: list[InputItem] = [MessageItem(role="user", content=input)] if isinstance(input, str) else list(input)
    out = []
    for item in items:
        fields = {k: v for k, v in msgspec.to_builtins(item).items() if v is not None}
        if isinstance(item, MessageItem):
            if isinstance(item.content, str):
                part = "output_text" if item.role == "assistant" else "input_text"
                fields["content"] = [{"type": part, "text": item.content}]
                if item.role == "assistant":
                    fields["content"][0]["annotations"] = []
            fields.setdefault("status", "completed")
        fields.setdefault("id", new_item_id(_ITEM_ID_PREFIXES.get(fields["type"], "item_")))
        out.append(fields)
    return out


def item_structs(items: list[dict[str, Any]], param: str) -> list[InputItem]:
    """Stored item objects as the input items they can be read back as."""
    try:
        return msgspec.convert(items, list[InputItem])
    except msgspec.ValidationError as error:
        raise errors.invalid_request(f"Invalid item in '{param}': {error}.", param=param) from None


def item_page(exchange: Exchange, items: list[dict[str, Any]]) -> dict[str, Any]:
    """One page of `items` as OpenAI lists them: `order` (desc by default), `after` an id, `limit`
    (1 to 100, 20 by default)."""
    order = exchange.query("order") or "desc"
    if order not in ("asc", "desc"):
        raise errors.invalid_request("Invalid value for 'order': expected 'asc' or 'desc'.", param="order")
    try:
        limit = int(exchange.query("limit") or 20)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise errors.invalid_request("Invalid value for 'limit': expected an integer from 1 to 100.", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = exchange.query("after")
    if after is not None:
        position = next((i for i, item in enumerate(ordered) if item.get("id") == after), None)
        if position is None:
            raise errors.invalid_request(f"No item with id '{after}'.", param="after")
        ordered = ordered[position + 1 :]
    page = ordered[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(ordered) > limit,
    }


# ---- planning -------------------------------------------------------------------------------------


async def plan_response(
    pool: PoolView, request: ResponsesRequest, messages: list[dict[str, Any]], *, session_key: str | None = None
) -> RequestPlan:
    """Plan `request` over the conversation `messages` (the stored one, then this turn's input)."""
    if not isinstance(request.input, str):
        images = [
            f"input[{i}].content[{j}]"
            for i, item in enumerate(request.input)
            if isinstance(item, MessageItem) and not isinstance(item.content, str)
            for j, part in enumerate(item.content)
            if isinstance(part, InputImage)
        ]
        if images:
            require_image_support(pool, images)  # named as the client sent them
    conversation = conversation_request(request, messages, eos_token_ids=pool.tokenizer.eos_token_ids)
    return await plan_conversation(pool, conversation, session_key=session_key, id_prefix="resp_", prompt_param="input")


#: The efforts chat takes as `reasoning_effort` (what gpt-oss's harmony prompt is written with).
_CHAT_EFFORTS = ("minimal", "low", "medium", "high")


def conversation_request(
    request: ResponsesRequest, messages: list[dict[str, Any]], *, eos_token_ids: Collection[int] = ()
) -> ConversationRequest:
    """The conversation `request` asks for over `messages` (the stored conversation, then this
    turn's input), held to chat's rules for the fields it shares with chat; `eos_token_ids` (the
    tokenizer's) end it unless it ignores EOS."""
    if request.instructions:
        messages = [template_message("system", request.instructions), *messages]
    if not messages:
        raise errors.invalid_request("Invalid value for 'input': expected at least one item.", param="input")
    tools = [chat_tool(t.name or "", t.description, t.parameters, t.strict) for t in request.tools or ()] or None
    choice = request.tool_choice
    forced_tool = choice.name if isinstance(choice, FunctionToolChoice) else None
    tool_choice = None if isinstance(choice, FunctionToolChoice) else choice
    text_format = request.text.format if request.text is not None else None
    schema = None
    if isinstance(text_format, TextFormatJsonObject):
        schema = JSON_OBJECT_SCHEMA
    elif isinstance(text_format, TextFormatJsonSchema):
        schema = json_schema_text(text_format.schema)
    effort = _reasoning_effort(request)
    check_as_chat(
        request,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=request.stop,
        max_tokens=request.max_output_tokens,
        json_format=schema is not None,
        regex=request.regex,
        ebnf=request.ebnf,
        tool_choice=tool_choice,
        forced_tool=forced_tool,
        tools=[t.name or "" for t in request.tools or ()],
    )
    sampling = extension_sampling(
        request,
        temperature=request.temperature,
        top_p=request.top_p,
        max_new_tokens=request.max_output_tokens,
        stop=stop_tuple(request.stop),
        json_schema=schema,
        eos_token_ids=eos_token_ids,
    )
    return ConversationRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        forced_tool=forced_tool,
        constrained=schema is not None or request.regex is not None or request.ebnf is not None,
        chat_template_kwargs=request.chat_template_kwargs,
        reasoning_effort=effort,
        separate_reasoning=request.separate_reasoning is not False,
        sampling=sampling,
        include_stop_str=bool(request.include_stop_str_in_output),
        stream=request.stream,
    )


def _reasoning_effort(request: ResponsesRequest) -> str | None:
    """`reasoning.effort` as chat's `reasoning_effort` ("none" is chat's "minimal"); one chat does
    not know is refused."""
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort is None:
        return None
    effort = "minimal" if effort == "none" else effort
    if effort not in _CHAT_EFFORTS:
        raise errors.invalid_request(
            f"reasoning.effort '{effort}' is not supported here: use one of {', '.join(_CHAT_EFFORTS)}.",
            param="reasoning.effort",
            code="unsupported_parameter",
        )
    return effort


def input_messages(input: str | list[InputItem], history: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """This turn's input as chat messages. `history` (the stored conversation) supplies the calls a
    `function_call_output` may answer; an output for a call nobody made is a 400."""
    if isinstance(input, str):
        return [template_message("user", input)]
    known_calls = {call["id"] for message in history for call in message.get("tool_calls") or ()}
    out: list[dict[str, Any]] = []
    turn: _AssistantTurn | None = None  # the assistant message being assembled

    def flush() -> None:
        nonlocal turn
        if turn is not None:
            out.append(turn.message())
            turn = None

    for i, item in enumerate(input):
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                if turn is not None and (turn.content is not None or turn.tool_calls):
                    flush()
                turn = turn or _AssistantTurn()
                turn.content = _text_of(item.content)
                continue
            flush()
            role = "system" if item.role == "developer" else item.role
            content = item.content
            if isinstance(content, str):
                out.append(template_message(role, content))
            else:
                out.append(template_message(role, [_chat_part(p) for p in content]))
        elif isinstance(item, ReasoningItem):
            if turn is not None:
                flush()
            text = "\n".join(part.text for part in item.content or ()) or "\n".join(s.text for s in item.summary)
            turn = _AssistantTurn(reasoning=text)
        elif isinstance(item, FunctionCallItem):
            turn = turn or _AssistantTurn()
            turn.tool_calls.append(chat_tool_call(item.call_id, item.name, item.arguments))
            known_calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem):
            flush()
            if item.call_id not in known_calls:
                raise errors.invalid_request(
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                    param=f"input[{i}].call_id",
                )
            output = item.output if isinstance(item.output, str) else _text_of(item.output)
            out.append(template_message("tool", output, tool_call_id=item.call_id))
    flush()
    return out


@dataclass(slots=True)
class _AssistantTurn:
    """An assistant turn of Responses items (reasoning, a message, function calls in a row): one
    chat assistant message."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        content = self.content
        if content is None and not self.tool_calls:
            content = ""
        return template_message(
            "assistant", content, tool_calls=self.tool_calls or None, reasoning_content=self.reasoning
        )


def _part_text(part: Any) -> str:
    return part.refusal if hasattr(part, "refusal") else part.text


def _text_of(content: str | list[Any]) -> str:
    return content if isinstance(content, str) else "".join(_part_text(part) for part in content)


def response_fields(request: ResponsesRequest) -> dict[str, Any]:
    """What a response object repeats of its request."""
    text_format: Any = {"type": "text"}
    if request.text is not None and request.text.format is not None:
        text_format = msgspec.to_builtins(request.text.format)
    choice = request.tool_choice
    reasoning = request.reasoning
    return {
        "background": False,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "metadata": request.metadata or {},
        "parallel_tool_calls": True if request.parallel_tool_calls is None else request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        "service_tier": "default",
        "store": request.store,
        "temperature": request.temperature,
        "text": {"format": text_format},
        "tool_choice": msgspec.to_builtins(choice) if choice is not None else "auto",
        "tools": [
            {k: v for k, v in msgspec.to_builtins(tool).items() if v is not None} for tool in request.tools or ()
        ],
        "top_p": request.top_p,
        "truncation": "disabled",
        "user": request.user,
    }


# ---- rendering ------------------------------------------------------------------------------------

_ITEM_PREFIXES = {"text": "msg_", "reasoning": "rs_", "tool_call": "fc_"}


class ResponsesRenderer:
    """Responses events (created, in_progress, output items and their deltas, completed), or one
    `response` object. `on_finished` gets the finished response before it goes out, so that it can
    be retrieved as soon as the client has it."""

    __slots__ = (
        "_blocks", "_fields", "_finish", "_ids", "_on_finished", "_opening", "_plan", "_sequence", "_status", "_unsent",
    )  # fmt: skip

    def __init__(self, plan: RequestPlan, fields: dict[str, Any], *, on_finished: OnFinished | None = None) -> None:
        self._plan = plan
        self._fields = fields
        self._on_finished = on_finished
        self._opening = b""
        self._sequence = 0
        self._blocks = BlockSequencer()
        self._finish: ChoiceEvent | None = None
        #: The status each output item closed with.
        self._status: dict[int, str] = {}
        self._ids: dict[int, str] = {}
        #: After `closing`: its items' last events and the sequence number its end event took, in
        #: case that end is not sent after all (the store refused the response: `failure` follows).
        self._unsent: tuple[bytes, int] | None = None

    # -- the response object --

    def _item_id(self, block: OutputBlock) -> str:
        item_id = self._ids.get(block.position)
        if item_id is None:
            prefix = _ITEM_PREFIXES[block.kind]
            item_id = self._ids[block.position] = f"{prefix}{self._plan.key}{block.position:04x}"
        return item_id

    def _item(self, block: OutputBlock, status: str, *, opening: bool = False) -> dict[str, Any]:
        item_id = self._item_id(block)
        if block.kind == "text":
            return objects.message_item(item_id, status, None if opening else block.text)
        if block.kind == "reasoning":
            return objects.reasoning_item(item_id, status, None if opening else block.text)
        return objects.function_call_item(item_id, block.call_id, block.name, "" if opening else block.text, status)

    def _response(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None, error: ApiError | None = None
    ) -> dict[str, Any]:
        plan = self._plan
        response: dict[str, Any] = {
            "id": plan.id,
            "object": "response",
            "created_at": plan.created,
            "status": status,
            "error": objects.response_error(error) if error is not None else None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": plan.model,
            "output": output,
            "usage": objects.response_usage(usage) if usage is not None else None,
        }
        if status in ("completed", "incomplete"):
            response["completed_at"] = int(time.time())
        response.update(self._fields)
        return response

    def _final_output(self, blocks: list[OutputBlock]) -> list[dict[str, Any]]:
        return [self._item(block, self._status.get(block.position, "in_progress")) for block in blocks]

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return objects.sse_event(payload)

    # -- the stream --

    def prepare(self) -> None:
        for choice in self._plan.choices:
            choice.output.prepare()
        snapshot = self._response("in_progress", [], None)
        self._opening = self._event("response.created", response=snapshot) + self._event(
            "response.in_progress", response=snapshot
        )

    def opening(self) -> bytes:
        return self._opening

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        out: list[bytes] = []
        for event in batch:
            steps = self._blocks.feed(event)
            if event.finish_reason is not None:
                self._finish = event
                steps += self._blocks.finish()
            out.extend(self._step(step) for step in steps)
        return b"".join(out)

    def _step(self, step: BlockStep) -> bytes:
        block = step.block
        index = block.position
        item_id = self._item_id(block)
        if step.action == "delta":
            sequence, self._sequence = self._sequence, self._sequence + 1
            if block.kind == "text":
                return objects.text_delta_event(sequence, item_id, index, step.piece)
            if block.kind == "reasoning":
                return objects.reasoning_delta_event(sequence, item_id, index, step.piece)
            return objects.arguments_delta_event(sequence, item_id, index, step.piece)
        if step.action == "open":
            out = self._event(
                "response.output_item.added", output_index=index, item=self._item(block, "in_progress", opening=True)
            )
            if block.kind != "tool_call":
                part = objects.output_text_part("") if block.kind == "text" else objects.reasoning_text_part("")
                out += self._event(
                    "response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part
                )
            return out
        status = self._closing_status(block)
        self._status[index] = status
        text = block.text
        where = {"item_id": item_id, "output_index": index}
        if block.kind == "text":
            out = self._event("response.output_text.done", **where, content_index=0, text=text, logprobs=[])
            out += self._event(
                "response.content_part.done", **where, content_index=0, part=objects.output_text_part(text)
            )
        elif block.kind == "reasoning":
            out = self._event("response.reasoning_text.done", **where, content_index=0, text=text)
            out += self._event(
                "response.content_part.done", **where, content_index=0, part=objects.reasoning_text_part(text)
            )
        else:
            out = self._event("response.function_call_arguments.done", **where, arguments=text)
        return out + self._event("response.output_item.done", output_index=index, item=self._item(block, status))

    def _closing_status(self, block: OutputBlock) -> str:
        """Output cut by `max_output_tokens` leaves its last item incomplete."""
        last = block.position == len(self._blocks.blocks) - 1
        return (
            "incomplete"
            if last and self._finish is not None and self._finish.finish_reason == "length"
            else "completed"
        )

    def closing(self, usage: Usage) -> bytes:
        tail = b"".join(self._step(step) for step in self._blocks.finish())
        finish = self._finish.finish_reason if self._finish is not None else None
        status = "incomplete" if finish == "length" else "completed"
        blocks = self._blocks.blocks
        response = self._response(status, self._final_output(blocks), usage)
        if self._on_finished is not None:
            self._on_finished(objects.encode(response), blocks)
        self._unsent = (tail, self._sequence)
        return tail + self._event(f"response.{status}", response=response)

    def failure(self, error: ApiError) -> bytes:
        head = b""
        if self._unsent is not None:  # the closing was rendered but not sent: its items still end
            head, self._sequence = self._unsent
            self._unsent = None
        response = self._response("failed", self._final_output(self._blocks.blocks), self._plan.usage(), error)
        return (
            head
            + self._event("error", code=error.code or error.type, message=error.message, param=error.param)
            + self._event("response.failed", response=response)
        )

    # -- one body --

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        (result,) = results
        blocks = blocks_of(result)
        finish = result.finish_reason
        status = "incomplete" if finish == "length" else "completed"
        for block in blocks:
            self._status[block.position] = "completed"
        if blocks and status == "incomplete":
            self._status[blocks[-1].position] = "incomplete"
        body = objects.encode(self._response(status, self._final_output(blocks), usage))
        if self._on_finished is not None:
            self._on_finished(body, blocks)
        return body


def _chat_part(part: Any) -> dict[str, Any]:
    """A message's content part as a chat part: text, or an `input_image` as an `image_url` part
    (planning refuses it for a model that takes no images)."""
    if isinstance(part, InputImage):
        return responses_image_part({"image_url": part.image_url, "file_id": part.file_id})
    return {"type": "text", "text": _part_text(part)}
