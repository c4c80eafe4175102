"""The choices of one OpenAI request, each an engine call, run inside the request's one nursery.

`run_choices` opens the request's nursery: one task per choice, each an engine call, started at
once. When the HTTP side stops listening (client gone, server shutting down) every engine call in it
is left through `open_engine_call`, whose ``finally`` sends the Abort. A choice whose text hits a
stop string ends there too, even if its engine would have gone on. Failures travel in-band, in order,
so the reader gets every event that came before one.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import trio

from trio_direct.engine.errors import EngineError
from trio_direct.engine.types import EngineClient, GenerateChunk, GenerateInput
from trio_direct.frontend.engine_call import open_engine_call


class TextDecoder(Protocol):
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


@dataclass(slots=True)
class ChoiceOutput:
    """Sans-IO text state of one choice: engine chunks in, `ChoiceEvent`s out, usage kept."""

    index: int
    decoder: TextDecoder
    stops: StopMatcher | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    finish_reason: str | None = None

    def push(self, batch: list[GenerateChunk]) -> ChoiceEvent:
        token_ids = [token for chunk in batch for token in chunk.token_ids]
        last = batch[-1]
        self.prompt_tokens = last.prompt_tokens or self.prompt_tokens
        self.completion_tokens = last.completion_tokens or self.completion_tokens + len(token_ids)
        self.cached_tokens = last.cached_tokens or self.cached_tokens
        self.reasoning_tokens = last.reasoning_tokens or self.reasoning_tokens
        text = self.decoder.push(token_ids)
        finish = last.finish_reason
        if finish is not None:
            text += self.decoder.flush()
        event = ChoiceEvent(self.index, text, token_ids, finish, last.matched_stop, last.abort_message)
        if self.stops is not None:
            event.text, matched = self.stops.push(text)
            if matched is not None:
                event.finish_reason, event.matched_stop = "stop", matched
            elif finish is not None:
                event.text += self.stops.flush()
        self.finish_reason = event.finish_reason
        return event


@dataclass(slots=True)
class ChoicePlan:
    """What to run for one choice: the engine, the request for it, and its output state."""

    client: EngineClient
    request: GenerateInput
    output: ChoiceOutput
    on_first_chunk: Callable[[], None] | None = field(default=None)


class ChoiceFailed(Exception):
    """Carries a choice's engine failure to the reader, in order, after the events before it."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(str(error))
        self.error = error


@asynccontextmanager
async def run_choices(plans: list[ChoicePlan], *, abort_timeout: float) -> AsyncIterator[ChoiceEvents]:
    """Start every choice's engine call at once; read their events from the yielded `ChoiceEvents`.

    The nursery here is the request's: leaving the block (client gone, error, all done) cancels
    whatever still runs, and each engine call's own ``finally`` sends its Abort.
    """
    send, receive = trio.open_memory_channel(math.inf)
    async with trio.open_nursery() as nursery:
        for plan in plans:
            nursery.start_soon(_run_choice, plan, abort_timeout, send.clone())
        send.close()
        try:
            yield ChoiceEvents(receive)
        finally:
            nursery.cancel_scope.cancel()


class ChoiceEvents:
    """Batches of events as they come; raises a choice's engine failure where it happened."""

    __slots__ = ("_receive",)

    def __init__(self, receive: trio.MemoryReceiveChannel) -> None:
        self._receive = receive

    def __aiter__(self) -> ChoiceEvents:
        return self

    async def __anext__(self) -> list[ChoiceEvent]:
        try:
            batch = [await self._receive.receive()]
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        while True:  # what else already arrived goes out in the same write
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        for item in batch:
            if type(item) is ChoiceFailed:
                raise item.error
        return batch


async def _run_choice(plan: ChoicePlan, abort_timeout: float, send: trio.MemorySendChannel) -> None:
    async with send:
        try:
            async with open_engine_call(plan.client, plan.request, abort_timeout=abort_timeout) as call:
                while batch := await call.next_batch():
                    if plan.on_first_chunk is not None:
                        plan.on_first_chunk()
                        plan.on_first_chunk = None
                    event = plan.output.push(batch)
                    send.send_nowait(event)
                    if event.finish_reason is not None:
                        return
        except EngineError as error:
            send.send_nowait(ChoiceFailed(error))
