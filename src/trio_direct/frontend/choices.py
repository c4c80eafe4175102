"""The choices of one OpenAI request, each an engine call, run inside the request's one nursery.

`run_choices` is a `trio.as_safe_channel` generator: its task is the request's nursery, so when the
HTTP side stops listening (client gone, server shutting down) every engine call in it is left through
`open_engine_call`, whose ``finally`` sends the Abort. A choice whose text hits a stop string ends
there too, even if its engine would have gone on.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator, Callable
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


@trio.as_safe_channel
async def run_choices(plans: list[ChoicePlan], *, abort_timeout: float) -> AsyncGenerator[list[ChoiceEvent], None]:
    """Yield batches of events until every choice ended; engine failures are raised as they come."""
    if len(plans) == 1:
        plan = plans[0]
        async with open_engine_call(plan.client, plan.request, abort_timeout=abort_timeout) as call:
            while batch := await call.next_batch():
                event = _event(plan, batch)
                yield [event]
                if event.finish_reason is not None:
                    return
        return
    send, receive = trio.open_memory_channel(math.inf)
    try:
        async with trio.open_nursery() as nursery:
            for plan in plans:
                nursery.start_soon(_run_choice, plan, abort_timeout, send.clone())
            send.close()
            async with receive:
                async for event in receive:
                    batch = [event]
                    while True:
                        try:
                            batch.append(receive.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    yield batch
    except BaseExceptionGroup as group:
        # One choice's engine failed and the others were cancelled: report that failure plainly.
        failures = group.subgroup(lambda e: not isinstance(e, trio.Cancelled))
        if failures is not None and len(failures.exceptions) == 1 and isinstance(failures.exceptions[0], EngineError):
            raise failures.exceptions[0] from None
        raise


async def _run_choice(plan: ChoicePlan, abort_timeout: float, send: trio.MemorySendChannel) -> None:
    async with send, open_engine_call(plan.client, plan.request, abort_timeout=abort_timeout) as call:
        while batch := await call.next_batch():
            event = _event(plan, batch)
            send.send_nowait(event)
            if event.finish_reason is not None:
                return


def _event(plan: ChoicePlan, batch: list[GenerateChunk]) -> ChoiceEvent:
    if plan.on_first_chunk is not None:
        plan.on_first_chunk()
        plan.on_first_chunk = None
    return plan.output.push(batch)
