"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API on the request core.

The request becomes a `ConversationRequest` (`surfaces.conversation`) directly, planned as chat
plans its own (`surfaces.chat.plan_conversation`), and held to chat's rules for the fields it
shares with chat (SGLang's extensions, `stop_sequences` as chat's `stop`), with chat's words:
`system` is a system message; text blocks are message text; an assistant's `tool_use` blocks are
its `tool_calls` and its `thinking` blocks its `reasoning_content`; each `tool_result` block is a
`tool` message answering its `tool_use_id`; `tools` are function tools, `tool_choice` any/tool/none
are chat's required/named/none (enforced with guided decoding the same way); `thinking`
enabled/adaptive/disabled is the template's `enable_thinking`; `stop_sequences` are stop strings;
`output_config.format` is guided JSON; a last message from the assistant is continued (prefill),
as chat's `continue_final_message`. These are SGLang's gateway's mapping decisions.

The output is rendered as Messages content blocks: the reasoning parser's output as `thinking`
blocks, text as `text`, tool calls as `tool_use`, with `stop_reason` end_turn / max_tokens /
stop_sequence / tool_use. Errors on these routes use Anthropic's envelope (`anthropic.errors`).
`count_tokens` renders and tokenizes the prompt exactly as the same Messages request would be.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Literal

from trio_direct.anthropic import responses as anthropic
from trio_direct.anthropic.errors import anthropic_error_event
from trio_direct.anthropic.requests import (
    CountTokensRequest,
    ImageBlock,
    MessageParam,
    MessagesRequest,
    TextBlock,
    ThinkingAdaptive,
    ThinkingBlock,
    ThinkingEnabled,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
    decode_count_tokens_request,
    decode_messages_request,
)
from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceEvent, ChoiceResult
from trio_direct.core.plan import RequestPlan, Usage
from trio_direct.openai.sampling import extension_sampling, json_schema_text
from trio_direct.surfaces.chat import conversation_prompt, plan_conversation
from trio_direct.surfaces.conversation import (
    ConversationRequest,
    chat_tool,
    chat_tool_call,
    check_as_chat,
    template_message,
)
from trio_direct.surfaces.images import anthropic_image_part, require_image_support
from trio_direct.surfaces.output_blocks import BlockSequencer, BlockStep, OutputBlock, blocks_of

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = [
    "MessagesRenderer",
    "chat_messages",
    "conversation_request",
    "count_tokens",
    "handle",
    "plan_message",
]


async def handle(exchange: Exchange) -> None:
    request = decode_messages_request(exchange.body)
    pool = exchange.frontend.pool(request.model)
    exchange.label(pool.name, request.stream)
    user = request.metadata.user_id if request.metadata is not None else None
    plan = await plan_message(pool, request, session_key=exchange.session_key(user))
    await exchange.respond(pool, plan, MessagesRenderer(plan))


async def count_tokens(exchange: Exchange) -> None:
    request = decode_count_tokens_request(exchange.body)
    pool = exchange.frontend.pool(request.model)
    prompt = await conversation_prompt(pool, conversation_request(request))
    await exchange.json(200, anthropic.encode({"input_tokens": len(prompt.token_ids)}))


async def plan_message(pool: PoolView, request: MessagesRequest, *, session_key: str | None = None) -> RequestPlan:
    images = [
        f"messages[{i}].content[{j}]"
        for i, message in enumerate(request.messages)
        if not isinstance(message.content, str)
        for j, block in enumerate(message.content)
        if isinstance(block, ImageBlock)
    ]
    if images:
        require_image_support(pool, images)  # named as the client sent them
    conversation = conversation_request(request, eos_token_ids=pool.tokenizer.eos_token_ids)
    return await plan_conversation(pool, conversation, session_key=session_key, id_prefix="msg_")


def conversation_request(request: CountTokensRequest, *, eos_token_ids: Collection[int] = ()) -> ConversationRequest:
    """The conversation `request` asks for (for count_tokens: the one whose prompt it counts),
    held to chat's rules for the fields it shares with chat; `eos_token_ids` (the tokenizer's) end
    it unless it ignores EOS."""
    messages = chat_messages(request.messages)
    if request.system:
        system = request.system if isinstance(request.system, str) else "\n".join(b.text for b in request.system)
        messages.insert(0, template_message("system", system))
    tools = [chat_tool(t.name, t.description, t.input_schema, t.strict) for t in request.tools or ()] or None
    tool_choice, forced_tool = _tool_choice(request.tool_choice)
    template_kwargs = request.chat_template_kwargs
    if request.thinking is not None:
        template_kwargs = dict(template_kwargs or {})
        template_kwargs.setdefault("enable_thinking", isinstance(request.thinking, ThinkingEnabled | ThinkingAdaptive))
    last = messages[-1]
    # Anthropic's prefill: the reply continues this text
    prefill = last["role"] == "assistant" and isinstance(last.get("content"), str) and bool(last["content"].strip())
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    schema: str | None = None
    stream = False
    if isinstance(request, MessagesRequest):  # count_tokens has no sampling fields
        temperature, top_p, max_tokens, stream = request.temperature, request.top_p, request.max_tokens, request.stream
        stop = request.stop_sequences or None
        output_format = request.output_config.format if request.output_config is not None else None
        if output_format is not None:
            schema = json_schema_text(output_format.schema)
    check_as_chat(
        request,
        temperature=temperature,
        top_p=top_p,
        stop=stop,
        max_tokens=max_tokens,
        json_format=schema is not None,
        regex=request.regex,
        ebnf=request.ebnf,
        tool_choice=tool_choice,
        forced_tool=forced_tool,
        tools=[t.name for t in request.tools or ()],
    )
    sampling = extension_sampling(
        request,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_tokens,
        stop=tuple(stop or ()),
        json_schema=schema,
        eos_token_ids=eos_token_ids,
    )
    return ConversationRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        forced_tool=forced_tool,
        constrained=schema is not None or request.regex is not None or request.ebnf is not None,
        continue_final_message=prefill,
        chat_template_kwargs=template_kwargs,
        separate_reasoning=request.separate_reasoning is not False,
        sampling=sampling,
        include_stop_str=bool(request.include_stop_str_in_output),
        stream=stream,
    )


def _tool_choice(choice: ToolChoice | None) -> tuple[Literal["none", "auto", "required"] | None, str | None]:
    """Anthropic's tool choice as chat's, and the tool it forces: any is "required", tool a named
    function, none and auto the same."""
    if isinstance(choice, ToolChoiceAny):
        return "required", None
    if isinstance(choice, ToolChoiceTool):
        return None, choice.name
    if isinstance(choice, ToolChoiceNone):
        return "none", None
    return ("auto" if choice is not None else None), None


def chat_messages(messages: list[MessageParam]) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages (see the module docstring for the mapping)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        content = message.content
        if isinstance(content, str):
            out.append(template_message(message.role, content))
        elif message.role == "user":
            _user_blocks(content, out)
        else:
            out.append(_assistant_blocks(content))
    return out


def _user_blocks(blocks: list[Any], out: list[dict[str, Any]]) -> None:
    """Text blocks stay the user's message; each tool_result is a tool message, in order."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            if parts:
                out.append(template_message("user", parts))
                parts = []
            result = block.content
            text = (
                result
                if isinstance(result, str)
                else "\n".join(p.text for p in result or () if isinstance(p, TextBlock))
            )
            out.append(template_message("tool", text, tool_call_id=block.tool_use_id))
        elif isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):  # planning refuses it for a model that takes no images
            parts.append(anthropic_image_part(block.source))
    if parts or not blocks:
        out.append(template_message("user", parts))


def _assistant_blocks(blocks: list[Any]) -> dict[str, Any]:
    texts = [block.text for block in blocks if isinstance(block, TextBlock)]
    thinking = [block.thinking for block in blocks if isinstance(block, ThinkingBlock)]
    calls = [
        chat_tool_call(block.id, block.name, json.dumps(block.input, ensure_ascii=False))
        for block in blocks
        if isinstance(block, ToolUseBlock)
    ]
    return template_message(
        "assistant",
        "".join(texts) if texts or not calls else None,
        tool_calls=calls or None,
        reasoning_content="\n".join(thinking) if thinking else None,
    )


# ---- rendering ------------------------------------------------------------------------------------


class MessagesRenderer:
    """Messages events (message_start, ping, content blocks, message_delta, message_stop), or one
    `message` object."""

    __slots__ = ("_blocks", "_finish", "_plan", "_started")

    def __init__(self, plan: RequestPlan) -> None:
        self._plan = plan
        self._blocks = BlockSequencer()
        self._started = False
        self._finish: ChoiceEvent | None = None

    def _message(self, content: list[dict[str, Any]], reason: str | None, sequence: str | None, usage: Usage) -> dict:
        plan = self._plan
        return {
            "id": plan.id,
            "type": "message",
            "role": "assistant",
            "model": plan.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": anthropic.message_usage(usage),
        }

    def prepare(self) -> None:
        for choice in self._plan.choices:
            choice.output.prepare()

    def opening(self) -> bytes:
        # message_start goes out with the first tokens (`events`): by then its usage has the
        # engine's cache hit.
        return b""

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        start = anthropic.sse_event(
            {"type": "message_start", "message": self._message([], None, None, self._plan.usage())}
        )
        return start + anthropic.PING

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        out = [self._start()]
        for event in batch:
            steps = self._blocks.feed(event)
            if event.finish_reason is not None:
                self._finish = event
                steps += self._blocks.finish()
            out.extend(self._step(step) for step in steps)
        return b"".join(out)

    def _step(self, step: BlockStep) -> bytes:
        block = step.block
        if step.action == "delta":
            return anthropic.content_block_delta(block.position, block.kind, step.piece)
        if step.action == "open":
            return anthropic.sse_event(
                {"type": "content_block_start", "index": block.position, "content_block": _opened(block)}
            )
        return anthropic.sse_event({"type": "content_block_stop", "index": block.position})

    def closing(self, usage: Usage) -> bytes:
        out = [self._start()]
        out.extend(self._step(step) for step in self._blocks.finish())
        finish = self._finish
        reason, sequence = (
            anthropic.stop_reason(finish.finish_reason, finish.matched_stop) if finish else ("end_turn", None)
        )
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": anthropic.message_usage(usage),
        }
        out.append(anthropic.sse_event(delta))
        out.append(anthropic.sse_event({"type": "message_stop"}))
        return b"".join(out)

    def failure(self, error: ApiError) -> bytes:
        return anthropic_error_event(error)

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        (result,) = results
        content = [_finished(block) for block in blocks_of(result)]
        reason, sequence = anthropic.stop_reason(result.finish_reason, result.matched_stop)
        return anthropic.encode(self._message(content, reason, sequence, usage))


def _opened(block: OutputBlock) -> dict[str, Any]:
    if block.kind == "text":
        return anthropic.text_block("")
    if block.kind == "reasoning":
        return anthropic.thinking_block("")
    return anthropic.tool_use_block(block.call_id, block.name, {})


def _finished(block: OutputBlock) -> dict[str, Any]:
    if block.kind == "text":
        return anthropic.text_block(block.text)
    if block.kind == "reasoning":
        return anthropic.thinking_block(block.text)
    return anthropic.tool_use_block(block.call_id, block.name, anthropic.tool_use_input(block.text))
