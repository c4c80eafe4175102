"""`POST /v1/chat/completions`: OpenAI chat, planned on the request core and rendered as OpenAI does.

`plan_conversation` is the planning every conversational surface shares: chat, Responses and
Messages each turn their own typed request into a `surfaces.conversation.ConversationRequest`
(chat's is `chat_conversation`) and plan it here. `chat_prompt` renders the chat template and
tokenizes (on a worker thread when long), `chat_output` sets up the reasoning and tool-call
parsers per choice. Image parts go through `surfaces.images.prepare_chat_images` first: the
template gets `{"type": "image"}` placeholders, the prompt the images as `image_data`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from trio_direct.core import errors
from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceEvent, ChoiceResult, ReasoningSplitter, merge_events
from trio_direct.core.plan import OutputOptions, Prompt, RequestPlan, Usage, plan_request
from trio_direct.openai import chat_bodies
from trio_direct.openai.logprobs import TokenText, chat_logprobs
from trio_direct.openai.requests import ChatCompletionRequest, NamedToolChoice, decode_chat_request
from trio_direct.openai.sampling import logprob_options, sampling_options
from trio_direct.openai.tool_choice import forced_tool_name, forced_tools_schema
from trio_direct.parsers.reasoning import reasoning_parser
from trio_direct.parsers.tools import ToolCall, ToolCallDelta, ToolParser, tool_call_parser
from trio_direct.parsers.tools.forced import NamedToolCallParser, RequiredToolCallsParser
from trio_direct.surfaces.conversation import ConversationRequest
from trio_direct.surfaces.images import prepare_chat_images
from trio_direct.surfaces.prompting import (
    LOOP_RENDER_CHARS,
    LOOP_RENDER_MESSAGES,
    LOOP_RENDER_TOOL_CHARS,
    content_chars,
    counted_and_encoded,
    encode_rendered,
    in_thread_if_long,
    refuse_if_too_long,
)
from trio_direct.text.chat_template import ChatTemplateError, render_chat
from trio_direct.text.harmony import HarmonyRenderError, render_harmony_chat

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = [
    "ChatRenderer",
    "chat_conversation",
    "chat_output",
    "chat_prompt",
    "conversation_prompt",
    "handle",
    "plan_chat",
    "plan_conversation",
]


async def handle(exchange: Exchange) -> None:
    request = decode_chat_request(exchange.body)
    pool = exchange.frontend.pool(request.model)
    exchange.label(pool.name, request.stream)
    plan = await plan_chat(pool, request, session_key=exchange.session_key(request.user))
    await exchange.respond(pool, plan, ChatRenderer(plan, pool.token_text, logprobs=request.logprobs))


async def plan_chat(
    pool: PoolView,
    request: ChatCompletionRequest,
    *,
    session_key: str | None = None,
) -> RequestPlan:
    """Plan a chat request: its conversation (`chat_conversation`), planned as every conversational
    surface's is."""
    conversation = chat_conversation(request, eos_token_ids=pool.tokenizer.eos_token_ids)
    return await plan_conversation(pool, conversation, session_key=session_key)


def chat_conversation(request: ChatCompletionRequest, *, eos_token_ids: Collection[int] = ()) -> ConversationRequest:
    """The conversation a (validated) chat request asks for; `eos_token_ids` (the tokenizer's) end
    it unless it ignores EOS."""
    choice = request.tool_choice
    return_logprob, top_logprobs = logprob_options(request)
    options = request.stream_options
    return ConversationRequest(
        messages=msgspec.to_builtins(request.messages),
        tools=msgspec.to_builtins(request.tools) if request.tools else None,
        tool_choice=None if isinstance(choice, NamedToolChoice) else choice,
        forced_tool=forced_tool_name(request),
        constrained=request.response_format is not None or request.regex is not None or request.ebnf is not None,
        continue_final_message=request.continue_final_message,
        chat_template_kwargs=request.chat_template_kwargs,
        reasoning_effort=request.reasoning_effort,
        separate_reasoning=request.separate_reasoning,
        sampling=sampling_options(request, eos_token_ids=eos_token_ids),
        include_stop_str=request.include_stop_str_in_output,
        n=request.n,
        stream=request.stream,
        include_usage=bool(options and options.include_usage),
        return_logprob=return_logprob,
        top_logprobs=top_logprobs,
    )


async def plan_conversation(
    pool: PoolView,
    request: ConversationRequest,
    *,
    session_key: str | None = None,
    id_prefix: str = "chatcmpl-",
    prompt_param: str = "messages",
) -> RequestPlan:
    """Plan a conversation, whichever surface it came from (with that surface's id prefix and the
    name of its prompt field), so every parser and sampling rule is chat's."""
    prompt = await conversation_prompt(pool, request, prompt_param)
    sampling = request.sampling
    tools = request.tools
    schema = forced_tools_schema(
        tools, required=request.tool_choice == "required", forced=request.forced_tool, constrained=request.constrained
    )
    if schema is not None:
        sampling = replace(sampling, json_schema=schema)
    output = chat_output(
        pool,
        stop=tuple(sampling.stop),
        include_stop_str=request.include_stop_str,
        skip_special_tokens=sampling.skip_special_tokens,
        spaces_between_special_tokens=sampling.spaces_between_special_tokens,
        separate_reasoning=request.separate_reasoning,
        chat_template_kwargs=request.chat_template_kwargs,
        tools=tools if request.tool_choice != "none" else None,
        forced_tool=request.forced_tool,
        tools_required=request.tool_choice == "required",
    )
    return plan_request(
        pool,
        [prompt],
        sampling,
        id_prefix=id_prefix,
        n=request.n,
        output=output,
        return_logprob=request.return_logprob,
        top_logprobs=request.top_logprobs,
        stream=request.stream,
        include_usage=request.include_usage,
        prompt_param=prompt_param,
        session_key=session_key,
    )


async def conversation_prompt(pool: PoolView, request: ConversationRequest, param: str = "messages") -> Prompt:
    """The prompt `plan_conversation` sends for `request` (also what token counting counts), with
    its images."""
    _check_parts(request.messages)
    messages, image_data = await prepare_chat_images(pool, request.messages, request.tools)
    prompt = await chat_prompt(
        pool,
        messages,
        request.tools,
        continue_final_message=request.continue_final_message,
        chat_template_kwargs=request.chat_template_kwargs,
        reasoning_effort=request.reasoning_effort,
        param=param,
    )
    prompt.image_data = image_data
    return prompt


def _check_parts(messages: list[dict[str, Any]]) -> None:
    """Text and images (`surfaces.images`); video and audio parts are not supported."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.get("type") not in ("text", "image_url"):
                    raise errors.invalid_request(
                        f"Content parts of type '{part.get('type')}' are not supported: this server takes text "
                        "and images.",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_parameter",
                    )


async def chat_prompt(
    pool: PoolView,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
    add_generation_prompt: bool | None = None,
    param: str = "messages",
) -> Prompt:
    """The chat template rendered over `messages` and tokenized; a prompt that cannot fit the
    context is refused first, naming `param` (the surface's prompt field). Rendered on the event
    loop unless the messages or the tools are long or many (`prompting.LOOP_RENDER_CHARS`,
    `LOOP_RENDER_MESSAGES`, `LOOP_RENDER_TOOL_CHARS`), and encoded there unless what the prompt prefix cache leaves to
    encode is costly (`prompting.encode_rendered`); on a worker thread otherwise.

    A gpt-oss model's prompt is written in harmony by openai-harmony's own encoder, as upstream
    gateways do, rather than through its Jinja template. `add_generation_prompt` defaults to
    opening the assistant's turn unless the final message is continued.
    """
    size = content_chars(messages)
    refuse_if_too_long(pool, size, len(messages), param=param)
    if pool.harmony:
        return await in_thread_if_long(size, _render_harmony, messages, tools, reasoning_effort)
    if add_generation_prompt is None:
        add_generation_prompt = not continue_final_message
    render = (pool, messages, tools, continue_final_message, chat_template_kwargs, add_generation_prompt)
    if (
        size > LOOP_RENDER_CHARS
        or len(messages) > LOOP_RENDER_MESSAGES
        or (tools and len(msgspec.json.encode(tools)) > LOOP_RENDER_TOOL_CHARS)
    ):
        return await trio.to_thread.run_sync(_render_and_tokenize, *render, param)
    started = time.thread_time_ns()
    text = _render(*render)
    packed = await encode_rendered(pool, text, param=param, started_ns=started)
    return Prompt(packed.ids, text, packed=packed)


def _render_harmony(
    messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None, reasoning_effort: str | None
) -> Prompt:
    try:
        rendered = render_harmony_chat(messages, tools=tools, reasoning_effort=reasoning_effort)
    except HarmonyRenderError as error:
        raise errors.invalid_request(f"Cannot write this conversation for gpt-oss: {error}", param="messages") from None
    return Prompt(rendered.token_ids, rendered.text, tuple(rendered.stop_token_ids))


def _render_and_tokenize(
    pool: PoolView,
    messages: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None,
    continue_final_message: bool,
    chat_template_kwargs: Mapping[str, Any] | None,
    add_generation_prompt: bool = True,
    param: str = "messages",
) -> Prompt:
    text = _render(pool, messages, tools, continue_final_message, chat_template_kwargs, add_generation_prompt)
    # The template writes the special tokens itself; do not add a second BOS.
    packed = counted_and_encoded(pool, text, param)
    return Prompt(packed.ids, text, packed=packed)


def _render(
    pool: PoolView,
    messages: Sequence[Mapping[str, Any]],
    tools: list[dict[str, Any]] | None,
    continue_final_message: bool,
    chat_template_kwargs: Mapping[str, Any] | None,
    add_generation_prompt: bool,
) -> str:
    try:
        return render_chat(
            pool.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
            chat_template=pool.chat_template_override,
        )
    except ChatTemplateError as error:
        raise errors.invalid_request(f"Chat template error: {error}", param="messages") from None


def chat_output(
    pool: PoolView,
    *,
    stop: tuple[str, ...] = (),
    include_stop_str: bool = False,
    skip_special_tokens: bool = True,
    spaces_between_special_tokens: bool = True,
    separate_reasoning: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    forced_tool: str | None = None,
    tools_required: bool = False,
) -> OutputOptions:
    """Per-choice output of a chat turn: reasoning split out when the model has a reasoning parser,
    tool calls parsed when tools are offered (or forced: then the output is constrained JSON)."""
    reasoning_name = pool.reasoning_parser if separate_reasoning else None
    thinking = (chat_template_kwargs or {}).get("enable_thinking")
    reasoning = None
    if reasoning_name is not None:
        name = reasoning_name

        def reasoning(prompt: Prompt) -> ReasoningSplitter | None:
            # A template that opens the reasoning block itself (the prompt ends in the format's
            # start tag) means the output starts inside it.
            return reasoning_parser(
                name, enable_thinking=thinking if isinstance(thinking, bool) else None, prompt=prompt.text
            )

    tool_factory = None
    if tools:
        if forced_tool is not None:  # the output is constrained to the arguments JSON (openai.tool_choice)

            def tool_factory() -> ToolParser | None:
                return NamedToolCallParser(forced_tool)

        elif tools_required:

            def tool_factory() -> ToolParser | None:
                return RequiredToolCallsParser()

        elif pool.tool_call_parser is not None:
            parser_name = pool.tool_call_parser

            def tool_factory() -> ToolParser | None:
                return tool_call_parser(parser_name, tools)

    return OutputOptions(
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
        stop_strings=stop,
        include_stop_str=include_stop_str,
        reasoning_parser=reasoning,
        tool_parser=tool_factory,
    )


class ChatRenderer:
    """`chat.completion.chunk` events, or one `chat.completion` body."""

    __slots__ = ("_logprobs", "_opening", "_plan", "_token_text")

    def __init__(self, plan: RequestPlan, token_text: TokenText, *, logprobs: bool = False) -> None:
        self._plan = plan
        self._token_text = token_text
        self._logprobs = logprobs
        self._opening = b""

    def prepare(self) -> None:
        plan = self._plan
        # OpenAI's first chunk of each choice announces the assistant role.
        self._opening = b"".join(
            chat_bodies.chat_role_chunk(plan.id, plan.created, plan.model, choice.output.index)
            for choice in plan.choices
        )
        for choice in plan.choices:
            choice.output.prepare()

    def opening(self) -> bytes:
        return self._opening

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        plan = self._plan
        cid, created, model = plan.id, plan.created, plan.model
        out = []
        for event in merge_events(batch):
            rows = event.logprobs
            logprobs = chat_logprobs(rows, self._token_text) if rows else None
            if event.reasoning:
                out.append(
                    chat_bodies.chat_chunk(cid, created, model, event.index, {"reasoning_content": event.reasoning})
                )
            if event.text or logprobs:
                content = {"content": event.text}
                out.append(chat_bodies.chat_chunk(cid, created, model, event.index, content, logprobs=logprobs))
            if event.tool_calls:
                calls = {"tool_calls": [tool_call_delta(call) for call in event.tool_calls]}
                out.append(chat_bodies.chat_chunk(cid, created, model, event.index, calls))
            if event.finish_reason is not None:
                out.append(chat_bodies.chat_chunk(cid, created, model, event.index, {}, event.finish_reason))
        return b"".join(out)

    def closing(self, usage: Usage) -> bytes:
        plan = self._plan
        if plan.include_usage:
            return chat_bodies.usage_chunk(plan.id, plan.created, plan.model, usage, chat=True) + chat_bodies.DONE
        return chat_bodies.DONE

    def failure(self, error: ApiError) -> bytes:
        return chat_bodies.error_chunk(error) + chat_bodies.DONE

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        plan = self._plan
        choices = [
            chat_bodies.ChatChoice(
                index=result.index,
                message=_message(result.text, result.reasoning, result.tool_calls()),
                logprobs=chat_logprobs(result.logprobs, self._token_text) if self._logprobs else None,
                finish_reason=result.finish_reason,
            )
            for result in results
        ]
        return chat_bodies.chat_completion(plan.id, plan.created, plan.model, choices, usage)


def _message(content: str, reasoning: str, calls: list[ToolCall]) -> chat_bodies.ResponseMessage:
    tool_calls = [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}
        for call in calls
    ] or None
    return chat_bodies.ResponseMessage(
        content=content if content or not tool_calls else None,
        reasoning_content=reasoning or None,
        tool_calls=tool_calls,
    )


def tool_call_delta(call: ToolCallDelta) -> dict[str, Any]:
    """OpenAI's streaming shape: id, type and name on a call's first delta, arguments in pieces."""
    function: dict[str, Any] = {"arguments": call.arguments}
    delta: dict[str, Any] = {"index": call.index, "function": function}
    if call.id is not None:
        delta["id"] = call.id
        delta["type"] = "function"
    if call.name is not None:
        function["name"] = call.name
    return delta
