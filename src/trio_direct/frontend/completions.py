"""`/v1/chat/completions` and `/v1/completions`, top to bottom.

The path of one request, in order: decode and validate the body (`openai.requests`), build the
prompt (chat template, tokenizer; on a worker thread when long), check it against the context limit,
plan one engine call per choice; then, when the response runs, choose the engines
(`Frontend.choose_route`: round-robin, or KV-aware; a prefill + decode pair when disaggregated), run
the calls in the request's nursery (`choices.run_choices`) and write the client's output: SSE chunks
as they come, or one body at the end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import msgspec
import trio

from trio_direct import metrics
from trio_direct.engine.errors import (
    EngineError,
    EngineInvalidArgument,
    EngineResourceExhausted,
    EngineUnavailable,
)
from trio_direct.engine.types import Bootstrap, GenerateInput, TokenLogprob
from trio_direct.fleet.card import DEFAULT_BOOTSTRAP_PORT
from trio_direct.frontend.choices import ChoiceEvent, ChoiceOutput, ChoicePlan, EngineLeg, run_choices
from trio_direct.frontend.disaggregation import new_room
from trio_direct.frontend.runtime import Frontend, Route
from trio_direct.logs import REQUEST_ID
from trio_direct.openai import errors, responses
from trio_direct.openai.errors import OpenAIError
from trio_direct.openai.logprobs import chat_logprobs, completion_logprobs
from trio_direct.parsers.reasoning import ReasoningParser, reasoning_parser
from trio_direct.openai.tool_choice import forced_tool_name, tool_choice_schema
from trio_direct.parsers.tools import ToolCallDelta, ToolCallParser, ToolDelta, assemble, tool_call_parser
from trio_direct.parsers.tools.forced import NamedToolCallParser, RequiredToolCallsParser
from trio_direct.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    decode_chat_request,
    decode_completion_request,
    prompt_batch,
)
from trio_direct.openai.sampling import logprob_options, sampling_options, stop_strings
from trio_direct.routing.simple import NoWorkerAvailable
from trio_direct.text.chat_template import ChatTemplateError, render_chat
from trio_direct.text.detokenizer import IncrementalDetokenizer
from trio_direct.text.stop_strings import StopStringMatcher

log = logging.getLogger(__name__)

#: Scheduler rounds a streamed response waits before writing its headers (see open_stream).
_DISPATCH_ROUNDS = 4

#: Prompts longer than this (characters) are rendered and tokenized on a worker thread, so that one
#: long prompt does not stall every other stream on the event loop.
THREAD_THRESHOLD_CHARS = 4096


@dataclass(slots=True)
class Prompt:
    """One prompt as the engine gets it, and as `echo` returns it."""

    token_ids: list[int]
    text: str


@dataclass(slots=True)
class Completion:
    """A planned request: what the handlers need to write the response."""

    id: str
    key: str
    created: int
    model: str
    chat: bool
    plans: list[ChoicePlan]
    prompts: list[Prompt]
    request: ChatCompletionRequest | CompletionRequest
    #: A token's text, for logprobs.
    token_text: Callable[[int], str]
    #: Legacy completions with logprobs: each choice's text offset so far.
    text_offsets: dict[int, int] = field(default_factory=dict)

    @property
    def include_usage(self) -> bool:
        options = self.request.stream_options
        return bool(options and options.include_usage)

    def usage(self) -> responses.Usage:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        outputs = [plan.output for plan in self.plans]
        return responses.Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=sum(o.completion_tokens for o in outputs),
            # the choices of one prompt share its cache hit: count it once per prompt
            cached_tokens=sum(o.usage_cached_tokens for o in outputs[:: self.request.n]),
            reasoning_tokens=sum(o.reasoning_tokens for o in outputs),
        )


# ---- preparing ------------------------------------------------------------------------------------


async def plan_chat(frontend: Frontend, body: bytes) -> Completion:
    request = decode_chat_request(body)
    _check_model(frontend, request.model)
    messages = msgspec.to_builtins(request.messages)
    _check_text_only(messages)
    tools = msgspec.to_builtins(request.tools) if request.tools else None
    size = sum(len(str(m.get("content") or "")) for m in messages)
    prompt = await _maybe_in_thread(size, _chat_prompt, frontend, request, messages, tools)
    return _plan(frontend, request, [prompt], chat=True, id_prefix="chatcmpl-")


async def plan_completion(frontend: Frontend, body: bytes) -> Completion:
    request = decode_completion_request(body)
    _check_model(frontend, request.model)
    if request.suffix:
        raise errors.invalid_request("'suffix' is not supported.", param="suffix", code="unsupported_parameter")
    prompts = []
    for item in prompt_batch(request):
        if isinstance(item, str):
            prompts.append(await _maybe_in_thread(len(item), _text_prompt, frontend, item))
        else:
            _check_vocab(frontend, item)
            text = frontend.tokenizer.decode(item, skip_special_tokens=False) if request.echo else ""
            prompts.append(Prompt(list(item), text))
    return _plan(frontend, request, prompts, chat=False, id_prefix="cmpl-")


def _check_model(frontend: Frontend, model: str) -> None:
    if model != frontend.model_name:
        raise errors.model_not_found(model)


def _check_text_only(messages: list[dict[str, Any]]) -> None:
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.get("type") != "text":
                    raise errors.invalid_request(
                        f"Content parts of type '{part.get('type')}' are not supported: this model takes text only.",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_parameter",
                    )


def _check_vocab(frontend: Frontend, token_ids: Sequence[int]) -> None:
    vocab = frontend.tokenizer.vocab_size
    bad = next((t for t in token_ids if t >= vocab), None)
    if bad is not None:
        raise errors.invalid_request(f"Token id {bad} is out of vocabulary (size {vocab}).", param="prompt")


async def _maybe_in_thread(size: int, fn, *args: Any) -> Prompt:
    if size > THREAD_THRESHOLD_CHARS:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


def _chat_prompt(frontend: Frontend, request: ChatCompletionRequest, messages, tools) -> Prompt:
    try:
        text = render_chat(
            frontend.tokenizer,
            messages,
            tools=tools,
            add_generation_prompt=not request.continue_final_message,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
            chat_template=frontend.chat_template_override,
        )
    except ChatTemplateError as error:
        raise errors.invalid_request(f"Chat template error: {error}", param="messages") from None
    # The template writes the special tokens itself; do not add a second BOS.
    return Prompt(frontend.tokenizer.encode(text, add_special_tokens=False), text)


def _text_prompt(frontend: Frontend, text: str) -> Prompt:
    return Prompt(frontend.tokenizer.encode(text, add_special_tokens=True), text)


def _plan(
    frontend: Frontend,
    request: ChatCompletionRequest | CompletionRequest,
    prompts: list[Prompt],
    *,
    chat: bool,
    id_prefix: str,
) -> Completion:
    if request.n > frontend.config.max_n:
        raise errors.invalid_request(f"n must be at most {frontend.config.max_n}.", param="n")
    limit = frontend.context_length
    sampling = sampling_options(request, eos_token_ids=frontend.tokenizer.eos_token_ids)
    if isinstance(request, ChatCompletionRequest) and (schema := tool_choice_schema(request)) is not None:
        sampling = replace(sampling, json_schema=schema)
    for prompt in prompts:
        if not prompt.token_ids:
            raise errors.invalid_request("The prompt is empty after tokenization.", param="prompt")
        if limit is not None and len(prompt.token_ids) >= limit:
            raise errors.context_length_exceeded(len(prompt.token_ids), limit, sampling.max_new_tokens)
    return_logprob, top_logprobs = logprob_options(request)
    stops = stop_strings(request)
    request_key = os.urandom(16).hex()  # as random as uuid4().hex, without building a UUID
    REQUEST_ID.set(id_prefix + request_key)
    plans = []
    for prompt_index, prompt in enumerate(prompts):
        options = sampling
        if limit is not None and options.max_new_tokens is not None:
            room = limit - len(prompt.token_ids)
            if options.max_new_tokens > room:  # SGLang clips too; say so rather than fail the request
                options = replace(options, max_new_tokens=room)
        for sample in range(request.n):
            index = prompt_index * request.n + sample
            rid = f"{request_key}{index:04x}"  # fixed length: never a prefix of another rid
            engine_request = GenerateInput(
                rid=rid,
                input_ids=prompt.token_ids,
                sampling=options,
                stream=True,
                return_logprob=return_logprob,
                top_logprobs_num=top_logprobs,
                original_text=prompt.text,
            )
            tool_parser = _tool_parser(frontend, request)
            decoder = IncrementalDetokenizer(
                frontend.tokenizer,
                # Tool markup is often special tokens (<|python_tag|>, DeepSeek's): keep them for the
                # parser when it reads the model's own markup, as SGLang does.
                skip_special_tokens=request.skip_special_tokens and not isinstance(tool_parser, ToolCallParser),
                spaces_between_special_tokens=request.spaces_between_special_tokens,
                prompt_ids=prompt.token_ids,
            )
            matcher = StopStringMatcher(stops, request.include_stop_str_in_output) if stops else None
            output = ChoiceOutput(index, decoder, matcher, _reasoning_parser(frontend, request, prompt.text), tool_parser)
            # The engine is chosen when the request runs (`_run`), so routing load is only ever
            # counted for a request that will release it.
            plans.append(ChoicePlan(None, engine_request, output))
    return Completion(
        id=id_prefix + request_key,
        key=request_key,
        created=frontend.created,
        model=frontend.model_name,
        chat=chat,
        plans=plans,
        prompts=prompts,
        request=request,
        token_text=frontend.token_text,
    )


def _reasoning_parser(
    frontend: Frontend, request: ChatCompletionRequest | CompletionRequest, prompt: str
) -> ReasoningParser | None:
    """Chat choices of a reasoning model get their reasoning split into `reasoning_content`.

    A template that opens the reasoning block itself (the prompt ends in ``<think>``) means the
    output starts inside it.
    """
    name = frontend.reasoning_parser
    if name is None or not isinstance(request, ChatCompletionRequest) or not request.separate_reasoning:
        return None
    thinking = (request.chat_template_kwargs or {}).get("enable_thinking")
    return reasoning_parser(
        name,
        enable_thinking=thinking if isinstance(thinking, bool) else None,
        force_reasoning=prompt.rstrip().endswith("<think>"),
    )


def _tool_parser(
    frontend: Frontend, request: ChatCompletionRequest | CompletionRequest
) -> ToolCallParser | NamedToolCallParser | RequiredToolCallsParser | None:
    """Chat choices of a request that offers tools get tool-call markup parsed into `tool_calls`."""
    if not isinstance(request, ChatCompletionRequest) or not request.tools or request.tool_choice == "none":
        return None
    forced = forced_tool_name(request)
    if forced is not None:  # the output is constrained to the arguments JSON (openai.tool_choice)
        return NamedToolCallParser(forced)
    if request.tool_choice == "required":
        return RequiredToolCallsParser()
    name = frontend.tool_call_parser
    return None if name is None else tool_call_parser(name, msgspec.to_builtins(request.tools))


def _assign(frontend: Frontend, completion: Completion, route: Route) -> None:
    """Point every choice at the route's engines (and pair it with its prefill leg)."""
    worker = route.decode
    metrics.ROUTED.labels(worker.engine.id, worker.engine.card.role).inc()
    if route.prefill is not None:
        metrics.ROUTED.labels(route.prefill.engine.id, "prefill").inc()
    for plan in completion.plans:
        plan.client = worker.engine.client
        plan.request.routed_dp_rank = worker.dp_rank
        plan.on_first_chunk = partial(frontend.first_token, completion.key)
        plan.on_unreachable = frontend.engine_unreachable
        if route.prefill is not None:
            plan.prefill = _pair_with_prefill(plan.request, route)
        else:  # a disaggregated pair is not retried: its two legs would need a new rendezvous
            plan.reroute = partial(_reroute, frontend, completion, plan)
            plan.retries = frontend.config.max_retries
    if route.prefill is None:
        log.debug("request %s: %d choice(s) on %s rank %s", completion.key, len(completion.plans), worker.engine.id, worker.dp_rank)
    else:
        log.info(
            "request %s: %d choice(s), prefill on %s rank %s, decode on %s rank %s",
            completion.key, len(completion.plans), route.prefill.engine.id, route.prefill.dp_rank,
            worker.engine.id, worker.dp_rank,
        )  # fmt: skip


def _reroute(frontend: Frontend, completion: Completion, plan: ChoicePlan) -> bool:
    """Another aggregated engine for `plan` (the failed one is already out of routing)."""
    frontend.release(completion.key)
    try:
        route = frontend.choose_route(completion.prompts[0].token_ids, completion.key)
    except NoWorkerAvailable:
        return False
    if route.prefill is not None or route.decode.engine.client is plan.client:
        return False
    log.info("request %s: engine unreachable, retrying on %s", completion.key, route.decode.engine.id)
    plan.client = route.decode.engine.client
    plan.request.routed_dp_rank = route.decode.dp_rank
    return True


def _pair_with_prefill(decode_request: GenerateInput, route: Route) -> EngineLeg:
    """Give the decode request and its prefill twin the same rid and bootstrap triple."""
    prefill_worker = route.prefill
    card = prefill_worker.engine.card
    room = new_room(prefill_worker.engine.client, route.decode.engine.client)
    port = card.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    decode_request.bootstrap = Bootstrap(card.bootstrap_host or card.host, port, room)
    prefill_request = replace(decode_request, routed_dp_rank=prefill_worker.dp_rank)
    return EngineLeg(prefill_worker.engine.client, prefill_request)


# ---- running --------------------------------------------------------------------------------------


def engine_error_response(error: EngineError) -> OpenAIError:
    """What a client hears of an engine failure: a status and a message without engine internals."""
    log.warning("engine request failed: %s", error)
    if isinstance(error, EngineInvalidArgument):
        return errors.invalid_request(f"The engine rejected the request: {error.message}")
    if isinstance(error, EngineResourceExhausted):
        return errors.rate_limited("The engine is at capacity; retry later.")
    if isinstance(error, EngineUnavailable):
        return errors.service_unavailable("The engine serving the request is unavailable.")
    return errors.engine_failure("The engine failed to complete the request.")


def _abort_error(event: ChoiceEvent) -> OpenAIError:
    log.warning("engine aborted choice %d: %s", event.index, event.abort_message)
    return errors.engine_failure(f"The engine aborted the request: {event.abort_message or 'no reason given'}")


@asynccontextmanager
async def _run(frontend: Frontend, completion: Completion) -> AsyncIterator[AsyncIterator[list[ChoiceEvent]]]:
    """Route the request, then run its choices; its routing load is released however it ends."""
    try:
        route = frontend.choose_route(completion.prompts[0].token_ids, completion.key)
    except NoWorkerAvailable:
        raise errors.service_unavailable("No engine is available to serve the request.") from None
    try:
        _assign(frontend, completion, route)
        async with run_choices(
            completion.plans,
            abort_timeout=frontend.config.abort_timeout,
            decode_abort_deadline=frontend.config.decode_abort_deadline,
        ) as batches:
            yield batches
    finally:
        frontend.release(completion.key)
        for plan in completion.plans:  # plan -> reroute -> completion -> plan: let refcounting free them
            plan.reroute = None


@asynccontextmanager
async def open_stream(frontend: Frontend, completion: Completion) -> AsyncIterator[CompletionStream]:
    """Route the request and dispatch its engine calls; read the SSE chunks from the yielded stream.

    The request's nursery lives in this block, which the caller's own task enters, so no chunk is
    ever handed over from inside it by a suspended generator (PEP 789): a client that leaves while a
    chunk is being written cancels the caller's task, and the block tears the engine calls down.
    After the block, `CompletionStream.ending` gives the chunks that close the stream, including a
    failure the choices' nursery raised on its way out.
    """
    stream = CompletionStream(completion)
    dispatched = False
    try:
        async with _run(frontend, completion) as batches:
            # Yielded only once the engine calls are dispatched, so the caller writes the response
            # headers now, and the opening chunks only with the first output: no socket write holds
            # up the dispatch. The few scheduling rounds let the choice tasks get their requests
            # onto the wire (choice task -> the call's asyncio task, run by the trio-asyncio loop).
            for _ in range(_DISPATCH_ROUNDS):
                await trio.lowlevel.checkpoint()
            stream.prepare()  # the engine computes the first token meanwhile
            stream._batches = batches
            dispatched = True
            yield stream
    # Failures the choices' nursery raised on its way out. Before the stream was handed over nothing
    # is written yet, so the caller answers with a status instead.
    except EngineError as error:
        if not dispatched:
            raise engine_error_response(error) from None
        stream._fail(engine_error_response(error))
    except OpenAIError as error:
        if not dispatched:
            raise
        stream._fail(error)
    finally:
        stream._batches = None


class CompletionStream:
    """The SSE chunks of one streamed completion (see `open_stream`).

    Iterating gives one write per batch of choice events (everything that queued up while the
    client was slow goes out at once) until the choices end or one fails; `ending` then gives the
    closing chunks. A plain iterator: it holds no nursery or cancel scope, so it can be abandoned
    at any await.
    """

    __slots__ = ("_completion", "_batches", "_opening", "_failure")

    def __init__(self, completion: Completion) -> None:
        self._completion = completion
        self._batches: AsyncIterator[list[ChoiceEvent]] | None = None
        self._opening: bytes | None = None  # the first chunk(s), made by `prepare`
        self._failure: OpenAIError | None = None

    def __aiter__(self) -> CompletionStream:
        return self

    async def __anext__(self) -> bytes:
        while self._batches is not None:
            try:
                batch = await self._batches.__anext__()
            except StopAsyncIteration:
                break
            except EngineError as error:
                self._fail(engine_error_response(error))
                break
            except OpenAIError as error:
                self._fail(error)
                break
            if data := self._encode(batch):
                return data
        self._batches = None
        raise StopAsyncIteration

    def prepare(self) -> None:
        """What the first write needs and the engine request did not: done while it is computed."""
        if self._opening is None:
            self._opening = _opening(self._completion)
            for plan in self._completion.plans:
                plan.output.prepare()

    def ending(self) -> list[bytes]:
        """The closing chunks: the failure, or the usage when asked for; then ``[DONE]``."""
        completion = self._completion
        if self._failure is not None:
            return [responses.error_chunk(self._failure), responses.DONE]
        if completion.include_usage:
            usage = completion.usage()
            chunk = responses.usage_chunk(completion.id, completion.created, completion.model, usage, chat=completion.chat)
            return [chunk, responses.DONE]
        return [responses.DONE]

    def _encode(self, batch: list[ChoiceEvent]) -> bytes:
        self.prepare()
        out = [self._opening] if self._opening else []
        for event in _merge(batch):
            if event.finish_reason == "abort":
                self._fail(_abort_error(event))
                return b""
            out.append(_chunk(self._completion, event))
        self._opening = b""
        return b"".join(out)

    def _fail(self, error: OpenAIError) -> None:
        """End the stream: no more chunks; `ending` reports `error` (the first failure wins)."""
        self._batches = None
        if self._failure is None:
            self._failure = error


def _opening(completion: Completion) -> bytes:
    """The role delta of every chat choice (OpenAI's first chunk), or the echoed prompts."""
    cid, created, model = completion.id, completion.created, completion.model
    if completion.chat:
        return b"".join(responses.chat_role_chunk(cid, created, model, p.output.index) for p in completion.plans)
    if completion.request.echo:
        n = completion.request.n
        return b"".join(
            responses.completion_chunk(cid, created, model, p.output.index, completion.prompts[p.output.index // n].text)
            for p in completion.plans
        )
    return b""


def _merge(batch: list[ChoiceEvent]) -> list[ChoiceEvent]:
    """One event per choice: the texts of a choice's events concatenated, its last finish kept."""
    merged: dict[int, ChoiceEvent] = {}
    for event in batch:
        seen = merged.get(event.index)
        if seen is None:
            merged[event.index] = event
        else:
            seen.text += event.text
            seen.reasoning += event.reasoning
            seen.tool_calls += event.tool_calls
            seen.token_ids += event.token_ids
            seen.finish_reason, seen.matched_stop, seen.abort_message = (
                event.finish_reason, event.matched_stop, event.abort_message
            )  # fmt: skip
            if event.logprobs is not None:
                seen.logprobs = (seen.logprobs or []) + event.logprobs
    return list(merged.values())


def _chunk(completion: Completion, event: ChoiceEvent) -> bytes:
    cid, created, model = completion.id, completion.created, completion.model
    rows = event.logprobs
    if completion.chat:
        logprobs = chat_logprobs(rows, completion.token_text) if rows else None
        content = b""
        if event.reasoning:
            delta = {"reasoning_content": event.reasoning}
            content = responses.chat_chunk(cid, created, model, event.index, delta)
        if event.text or logprobs:
            delta = {"content": event.text}
            content += responses.chat_chunk(cid, created, model, event.index, delta, logprobs=logprobs)
        if event.tool_calls:
            delta = {"tool_calls": [_tool_call_delta(call) for call in event.tool_calls]}
            content += responses.chat_chunk(cid, created, model, event.index, delta)
        if event.finish_reason is None:
            return content
        return content + responses.chat_chunk(cid, created, model, event.index, {}, event.finish_reason)
    if event.finish_reason is None and not event.text and not rows:
        return b""
    logprobs = None
    if rows:
        offset = completion.text_offsets.get(event.index, 0)
        logprobs, completion.text_offsets[event.index] = completion_logprobs(rows, completion.token_text, offset)
    return responses.completion_chunk(cid, created, model, event.index, event.text, event.finish_reason, logprobs=logprobs)


def _message(content: str, reasoning: str, calls: list[ToolCallDelta]) -> responses.ResponseMessage:
    tool_calls = None
    if calls:
        _, finished = assemble([ToolDelta("", calls)])
        tool_calls = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}
            for call in finished
        ]
    return responses.ResponseMessage(
        content=content if content or not tool_calls else None,
        reasoning_content=reasoning or None,
        tool_calls=tool_calls,
    )


def _tool_call_delta(call: ToolCallDelta) -> dict[str, Any]:
    """OpenAI's streaming shape: id, type and name on a call's first delta, arguments in pieces."""
    function: dict[str, Any] = {"arguments": call.arguments}
    delta: dict[str, Any] = {"index": call.index, "function": function}
    if call.id is not None:
        delta["id"] = call.id
        delta["type"] = "function"
    if call.name is not None:
        function["name"] = call.name
    return delta


async def complete_unary(frontend: Frontend, completion: Completion) -> bytes:
    """The whole response body, once every choice has finished."""
    texts: dict[int, list[str]] = {p.output.index: [] for p in completion.plans}
    reasoning: dict[int, list[str]] = {p.output.index: [] for p in completion.plans}
    calls: dict[int, list[ToolCallDelta]] = {p.output.index: [] for p in completion.plans}
    rows: dict[int, list[TokenLogprob]] = {p.output.index: [] for p in completion.plans}
    finish: dict[int, str | None] = {}
    try:
        async with _run(frontend, completion) as batches:
            async for batch in batches:
                for event in batch:
                    if event.finish_reason == "abort":
                        raise _abort_error(event)
                    texts[event.index].append(event.text)
                    reasoning[event.index].append(event.reasoning)
                    calls[event.index] += event.tool_calls
                    rows[event.index] += event.logprobs or ()
                    if event.finish_reason is not None:
                        finish[event.index] = event.finish_reason
    except EngineError as error:
        raise engine_error_response(error) from None
    cid, created, model = completion.id, completion.created, completion.model
    wants_logprobs = completion.plans[0].request.return_logprob
    if completion.chat:
        choices = [
            responses.ChatChoice(
                index=index,
                message=_message("".join(parts), "".join(reasoning[index]), calls[index]),
                logprobs=chat_logprobs(rows[index], completion.token_text) if wants_logprobs else None,
                finish_reason=finish.get(index),
            )
            for index, parts in texts.items()
        ]
        return responses.chat_completion(cid, created, model, choices, completion.usage())
    n = completion.request.n
    echo = completion.request.echo
    choices = []
    for index, parts in texts.items():
        prefix = completion.prompts[index // n].text if echo else ""
        logprobs = completion_logprobs(rows[index], completion.token_text, len(prefix))[0] if wants_logprobs else None
        choices.append(
            responses.CompletionChoice(
                index=index, text=prefix + "".join(parts), logprobs=logprobs, finish_reason=finish.get(index)
            )
        )
    return responses.completion(cid, created, model, choices, completion.usage())
