"""The choices of one OpenAI request, each an engine call, run inside the request's one nursery.

`run_choices` opens the request's nursery: one task per choice, each an engine call, started at
once; a request with a single aggregated choice (the common case) reads its one engine call in its
own task instead (`ChoiceReader`). When the HTTP side stops listening (client gone, server shutting
down) every engine call is left through `open_engine_call`, whose ``finally`` sends the Abort. A
choice whose text hits a stop string ends there too, even if its engine would have gone on. Failures
travel in order, so the reader gets every event that came before one.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import trio

from trio_direct import metrics
from trio_direct.engine.errors import EngineError, EngineUnavailable
from trio_direct.exception_groups import unwrap_single_exception
from trio_direct.engine.types import EngineClient, GenerateChunk, GenerateInput, TokenLogprob
from trio_direct.frontend.engine_call import EngineCall, open_engine_call
from trio_direct.parsers.reasoning import ReasoningDelta, ReasoningParser
from trio_direct.parsers.tools import ToolCallDelta, ToolCallParser, ToolDelta


class TextDecoder(Protocol):
    def prepare(self) -> None: ...

    def push(self, token_ids: list[int]) -> str: ...

    def flush(self) -> str: ...


class StopMatcher(Protocol):
    def push(self, text: str) -> tuple[str, str | None]: ...

    def flush(self) -> str: ...


@dataclass(slots=True)
class ChoiceEvent:
    """New output of one choice: text (already cut at stop strings) and, at its end, why it ended."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    abort_message: str | None = None
    logprobs: list[TokenLogprob] | None = None
    #: Text of the model's reasoning section (`reasoning_content`), already taken out of `text`.
    reasoning: str = ""
    #: Tool-call deltas, already taken out of `text`.
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True)
class ChoiceOutput:
    """Sans-IO text state of one choice: engine chunks in, `ChoiceEvent`s out, usage kept."""

    index: int
    decoder: TextDecoder
    stops: StopMatcher | None = None
    reasoning_parser: ReasoningParser | None = None
    tool_parser: ToolCallParser | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    finish_reason: str | None = None
    #: Disaggregated serving: the prefill leg's cache hit (the decode leg reports the whole prompt).
    prompt_cached_tokens: int | None = None

    @property
    def usage_cached_tokens(self) -> int:
        return self.cached_tokens if self.prompt_cached_tokens is None else self.prompt_cached_tokens

    def prepare(self) -> None:
        """Set up what only the output needs; called once the engine call is on its way."""
        self.decoder.prepare()

    def push(self, batch: list[GenerateChunk]) -> ChoiceEvent:
        token_ids = [token for chunk in batch for token in chunk.token_ids]
        last = batch[-1]
        text_ids = token_ids
        if last.finish_reason == "stop" and isinstance(last.matched_stop, int) and token_ids[-1:] == [last.matched_stop]:
            text_ids = token_ids[:-1]  # the stop token (EOS) ends the text, it is not part of it
        self.prompt_tokens = last.prompt_tokens or self.prompt_tokens
        self.completion_tokens = last.completion_tokens or self.completion_tokens + len(token_ids)
        self.cached_tokens = last.cached_tokens or self.cached_tokens
        self.reasoning_tokens = last.reasoning_tokens or self.reasoning_tokens
        text = self.decoder.push(text_ids)
        finish = last.finish_reason
        if finish is not None:
            text += self.decoder.flush()
        event = ChoiceEvent(self.index, text, token_ids, finish, last.matched_stop, last.abort_message)
        if any(chunk.logprobs is not None for chunk in batch):
            event.logprobs = [row for chunk in batch for row in chunk.logprobs or ()]
        if self.stops is not None:
            event.text, matched = self.stops.push(text)
            if matched is not None:
                event.finish_reason, event.matched_stop = "stop", matched
            elif finish is not None:
                event.text += self.stops.flush()
        if self.reasoning_parser is not None:
            split = self.reasoning_parser.feed(event.text)
            if event.finish_reason is not None:
                split = _joined(split, self.reasoning_parser.finish())
            event.reasoning, event.text = split.reasoning, split.content
        if self.tool_parser is not None:
            tools = self.tool_parser.feed(event.text)
            if event.finish_reason is not None:
                tail = self.tool_parser.finish()
                tools = ToolDelta(tools.content + tail.content, tools.calls + tail.calls)
                if self.tool_parser.call_count and event.finish_reason == "stop":
                    event.finish_reason = "tool_calls"
            event.text, event.tool_calls = tools.content, tools.calls
        self.finish_reason = event.finish_reason
        return event


def _joined(first: ReasoningDelta, second: ReasoningDelta) -> ReasoningDelta:
    return ReasoningDelta(first.reasoning + second.reasoning, first.content + second.content)


@dataclass(slots=True)
class EngineLeg:
    """One engine call: the engine and the request it gets."""

    client: EngineClient
    request: GenerateInput


@dataclass(slots=True)
class ChoicePlan:
    """What to run for one choice: the generating engine and its request, the output state, and,
    when serving disaggregated, the prefill leg."""

    client: EngineClient | None  # set when the request is routed
    request: GenerateInput
    output: ChoiceOutput
    prefill: EngineLeg | None = None
    on_first_chunk: Callable[[], None] | None = field(default=None)
    #: Told when an engine of this choice cannot be reached (to take it out of routing).
    on_unreachable: Callable[[EngineClient, EngineError], None] | None = field(default=None)
    #: Points the plan at another engine after a failure before any output; False if none is left.
    reroute: Callable[[], bool] | None = field(default=None)
    retries: int = 0


class ChoiceFailed(Exception):
    """Carries a choice's engine failure to the reader, in order, after the events before it."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(str(error))
        self.error = error


@asynccontextmanager
async def run_choices(
    plans: list[ChoicePlan], *, abort_timeout: float, decode_abort_deadline: float = 30.0
) -> AsyncIterator[AsyncIterator[list[ChoiceEvent]]]:
    """Start every choice's engine call(s) at once; read batches of their events from what it yields.

    The nursery here is the request's: leaving the block (client gone, error, all done) cancels
    whatever still runs, and each engine call's own ``finally`` sends its Abort. A request with a
    single aggregated choice needs no nursery: its engine call is read in the caller's task.
    """
    if len(plans) == 1 and plans[0].prefill is None:
        async with ChoiceReader(plans[0], abort_timeout) as reader:
            yield _OneChoiceEvents(reader)
        return
    # Imported here: disaggregation builds on this module's choice running (a cycle at import time).
    from trio_direct.frontend.disaggregation import run_disaggregated_choice

    send, receive = trio.open_memory_channel(math.inf)
    # Choice tasks report failures in-band and never raise: what leaves is the reader's own.
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            for plan in plans:
                if plan.prefill is None:
                    nursery.start_soon(_run_choice, plan, abort_timeout, send.clone())
                else:
                    nursery.start_soon(
                        partial(
                            run_disaggregated_choice,
                            plan,
                            abort_timeout=abort_timeout,
                            decode_abort_deadline=decode_abort_deadline,
                            send=send.clone(),
                        )
                    )
            send.close()
            try:
                yield ChoiceEvents(receive)
            finally:
                nursery.cancel_scope.cancel()


class ChoiceEvents:
    """Batches of events as they come; raises a choice's engine failure where it happened.

    A failure that arrived behind events of the same batch is raised on the next call, so the
    events before it still go out.
    """

    __slots__ = ("_receive", "_failure")

    def __init__(self, receive: trio.MemoryReceiveChannel) -> None:
        self._receive = receive
        self._failure: EngineError | None = None

    def __aiter__(self) -> ChoiceEvents:
        return self

    async def __anext__(self) -> list[ChoiceEvent]:
        if self._failure is not None:
            raise self._failure
        try:
            batch = [await self._receive.receive()]
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        while True:  # what else already arrived goes out in the same write
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        for position, item in enumerate(batch):
            if type(item) is ChoiceFailed:
                if position == 0:
                    raise item.error
                self._failure = item.error
                return batch[:position]
        return batch


async def _run_choice(plan: ChoicePlan, abort_timeout: float, send: trio.MemorySendChannel) -> None:
    async with send:
        await stream_choice(plan, abort_timeout, send)


async def stream_choice(
    plan: ChoicePlan,
    abort_timeout: float,
    send: trio.MemorySendChannel,
    *,
    on_first_message: Callable[[], None] | None = None,
) -> None:
    """Run the choice's generating engine call, sending its events (or its failure) to `send`."""
    async with ChoiceReader(plan, abort_timeout, on_first_message=on_first_message) as reader:
        try:
            while (event := await reader.next_event()) is not None:
                offer(send, event)
                if event.finish_reason is not None:
                    return
        except EngineError as error:
            offer(send, ChoiceFailed(error))


class ChoiceReader:
    """One choice's generating engine call, read event by event, in the task that enters it.

    The call is dispatched on entering. An engine that cannot be reached before the choice's first
    output is taken out of routing and the call is retried on another engine (`plan.reroute`, at
    most `plan.retries` times); after the first output nothing is retried: the client has seen part
    of an answer. Leaving ends the call through `open_engine_call`, which aborts it if the engine
    had not ended it.
    """

    __slots__ = (
        "_plan", "_abort_timeout", "_on_first_message", "_retries", "_call", "_exit", "_failure", "_delivered", "_ended",
    )  # fmt: skip

    def __init__(
        self, plan: ChoicePlan, abort_timeout: float, *, on_first_message: Callable[[], None] | None = None
    ) -> None:
        self._plan = plan
        self._abort_timeout = abort_timeout
        self._on_first_message = on_first_message
        self._retries = plan.retries
        self._call: EngineCall | None = None
        self._exit: AsyncExitStack | None = None
        #: A failure to dispatch on entering, handled by the first read like any other.
        self._failure: EngineError | None = None
        self._delivered = False
        self._ended = False

    async def __aenter__(self) -> ChoiceReader:
        try:
            await self._dispatch()
        except EngineError as error:
            self._failure = error
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        exit_stack, self._exit = self._exit, None
        if exit_stack is not None:
            await exit_stack.__aexit__(*exc_info)  # the engine call sees how its block was left

    async def _dispatch(self) -> None:
        plan = self._plan
        exit_stack = AsyncExitStack()
        self._call = await exit_stack.enter_async_context(
            open_engine_call(plan.client, plan.request, abort_timeout=self._abort_timeout)
        )
        self._exit = exit_stack

    async def next_event(self) -> ChoiceEvent | None:
        """The choice's next output, or None once it ended; raises the engine's failure."""
        plan = self._plan
        while not self._ended:
            try:
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                if self._call is None:
                    await self._dispatch()
                batch = await self._call.next_batch()  # type: ignore[union-attr]
            except EngineError as error:
                self._call = None
                await self.__aexit__(None, None, None)  # the failed call ends (and is aborted) first
                report_unreachable(plan, plan.client, error)
                if self._retry(error):
                    continue
                self._ended = True
                raise
            if not batch:
                break
            self._delivered = True
            if self._on_first_message is not None:
                self._on_first_message()
                self._on_first_message = None
            if plan.on_first_chunk is not None:
                plan.on_first_chunk()
                plan.on_first_chunk = None
            event = plan.output.push(batch)
            self._ended = event.finish_reason is not None
            return event
        self._ended = True
        return None

    def _retry(self, error: EngineError) -> bool:
        plan = self._plan
        if not isinstance(error, EngineUnavailable) or self._delivered or self._retries <= 0 or plan.reroute is None:
            return False
        self._retries -= 1
        if not plan.reroute():
            return False
        metrics.RETRIES.inc()
        return True


class _OneChoiceEvents:
    """`ChoiceEvents` of a request with one aggregated choice, read in the request's own task.

    No choice task and no channel between the engine call and the writer: one task switch less per
    batch of tokens, and fewer objects per open stream.
    """

    __slots__ = ("_reader",)

    def __init__(self, reader: ChoiceReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _OneChoiceEvents:
        return self

    async def __anext__(self) -> list[ChoiceEvent]:
        event = await self._reader.next_event()
        if event is None:
            raise StopAsyncIteration
        return [event]


def report_unreachable(plan: ChoicePlan, client: EngineClient | None, error: EngineError) -> None:
    if isinstance(error, EngineUnavailable) and plan.on_unreachable is not None and client is not None:
        plan.on_unreachable(client, error)


def offer(send: trio.MemorySendChannel, item: object) -> None:
    """Hand `item` to the reader, if it is still there (a cancelled decode leg outlives it)."""
    try:
        send.send_nowait(item)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
