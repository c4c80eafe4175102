"""Reading one choice's engine call, event by event, and handing events to the request's reader.

A `ChoiceReader` runs in whichever task reads the choice: the request's own task when the request
has a single aggregated choice (the common case: no task, no channel), or a task of the request's
nursery otherwise (`dispatch.run_choices`), which hands events over a channel with `offer`.
Failures travel in order: the reader gets every event that came before one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from trio_direct import metrics
from trio_direct.core.engine_call import EngineCall, open_engine_call
from trio_direct.core.output import ChoiceEvent
from trio_direct.core.plan import ChoicePlan
from trio_direct.deferred import DeferredError
from trio_direct.engine.errors import EngineError, EngineUnavailable
from trio_direct.engine.types import EngineClient, GenerateInput

__all__ = [
    "ChoiceFailed",
    "ChoiceReader",
    "ChoiceRun",
    "EngineLeg",
    "RunControl",
    "offer",
    "stream_choice",
]


@dataclass(slots=True)
class EngineLeg:
    """One engine call: the engine and the request it gets."""

    client: EngineClient
    request: GenerateInput


@dataclass(slots=True, eq=False)
class ChoiceRun:
    """A choice as dispatch routed it: its generating engine and, disaggregated, its prefill leg."""

    plan: ChoicePlan
    client: EngineClient
    prefill: EngineLeg | None = None
    #: Times an engine that cannot be reached before the first output may be replaced.
    retries: int = 0


class RunControl(Protocol):
    """What a choice asks its request's dispatch (`dispatch.Dispatcher`) as it runs."""

    def first_output(self) -> None:
        """The request's first output arrived (its prefill no longer loads its engine)."""

    def unreachable(self, client: EngineClient, error: EngineError) -> None:
        """An engine of the request cannot be reached (take it out of routing)."""

    def reroute(self, run: ChoiceRun) -> bool:
        """Point `run` at another engine after a failure before any output; False if none is left."""


class ChoiceFailed(Exception):
    """Carries a choice's engine failure to the reader, in order, after the events before it."""

    def __init__(self, error: EngineError) -> None:
        super().__init__(str(error))
        self.error = error


class ChoiceReader:
    """One choice's generating engine call, read event by event, in the task that enters it.

    The call is dispatched on entering. An engine that cannot be reached before the choice's first
    output is taken out of routing and the call is retried on another engine (`RunControl.reroute`,
    at most `run.retries` times); after the first output nothing is retried: the client has seen
    part of an answer. Leaving ends the call through `open_engine_call`, which aborts it if the
    engine had not ended it.
    """

    __slots__ = (
        "_run", "_control", "_abort_timeout", "_on_first_message", "_call", "_exit", "_failure", "_delivered", "_ended",
    )  # fmt: skip

    def __init__(
        self,
        run: ChoiceRun,
        control: RunControl,
        abort_timeout: float,
        *,
        on_first_message: Callable[[], None] | None = None,
    ) -> None:
        self._run = run
        self._control = control
        self._abort_timeout = abort_timeout
        self._on_first_message = on_first_message
        self._call: EngineCall | None = None
        self._exit: AsyncExitStack | None = None
        #: A failure to dispatch on entering, handled by the first read like any other.
        self._failure = DeferredError()
        self._delivered = False
        self._ended = False

    async def __aenter__(self) -> ChoiceReader:
        try:
            await self._dispatch()
        except EngineError as error:
            self._failure.hold(error)
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        exit_stack, self._exit = self._exit, None
        if exit_stack is not None:
            await exit_stack.__aexit__(*exc_info)  # the engine call sees how its block was left

    async def _dispatch(self) -> EngineCall:
        run = self._run
        exit_stack = AsyncExitStack()
        self._call = await exit_stack.enter_async_context(
            open_engine_call(run.client, run.plan.request, abort_timeout=self._abort_timeout)
        )
        self._exit = exit_stack
        return self._call

    async def wait_written(self) -> None:
        """Return once the engine request is on the wire (or failed before it could be)."""
        if self._call is not None:
            await self._call.wait_written()

    async def next_event(self) -> ChoiceEvent | None:
        """The choice's next output, or None once it ended; raises the engine's failure."""
        run = self._run
        while not self._ended:
            try:
                self._failure.raise_held()
                call = self._call if self._call is not None else await self._dispatch()
                batch = await call.next_batch()
            except EngineError as error:
                self._call = None
                await self.__aexit__(None, None, None)  # the failed call ends (and is aborted) first
                if isinstance(error, EngineUnavailable):
                    self._control.unreachable(run.client, error)
                if self._retry(error):
                    continue
                self._ended = True
                raise
            if not batch:
                break
            if not self._delivered:
                self._delivered = True
                if self._on_first_message is not None:
                    self._on_first_message()
                self._control.first_output()
            event = run.plan.output.push(batch)
            self._ended = event.finish_reason is not None
            return event
        self._ended = True
        return None

    def _retry(self, error: EngineError) -> bool:
        run = self._run
        if not isinstance(error, EngineUnavailable) or self._delivered or run.retries <= 0:
            return False
        run.retries -= 1
        if not self._control.reroute(run):
            return False
        metrics.RETRIES.inc()
        return True


async def stream_choice(
    run: ChoiceRun,
    control: RunControl,
    abort_timeout: float,
    send: trio.MemorySendChannel,
    *,
    written: Callable[[], None],
    on_first_message: Callable[[], None] | None = None,
) -> None:
    """Run the choice's generating engine call, sending its events (or its failure) to `send`;
    `written` is called once its request is on the wire (or could not be sent)."""
    async with ChoiceReader(run, control, abort_timeout, on_first_message=on_first_message) as reader:
        try:
            await reader.wait_written()
        finally:
            written()
        try:
            while (event := await reader.next_event()) is not None:
                offer(send, event)
                if event.finish_reason is not None:
                    return
        except EngineError as error:
            offer(send, ChoiceFailed(error))


def offer(send: trio.MemorySendChannel, item: object) -> None:
    """Hand `item` to the reader, if it is still there (a cancelled decode leg outlives it)."""
    try:
        send.send_nowait(item)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
