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
from trio_direct.core.deferred import DeferredError
from trio_direct.core.engine_call import CallWatch, EngineCall, open_engine_call
from trio_direct.core.migration import migration_refusal
from trio_direct.core.output import ChoiceEvent
from trio_direct.core.plan import ChoicePlan
from trio_direct.engine.errors import EngineError, EngineStalled, EngineUnavailable, StreamWakeup
from trio_direct.engine.types import EngineClient, GenerateChunk, GenerateInput

__all__ = [
    "BUDGET_SPENT",
    "ChoiceFailed",
    "ChoiceReader",
    "ChoiceRun",
    "Continuation",
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
    #: Times the choice may continue on another engine after its engine failed mid-stream.
    migrations: int = 0
    #: Where the current call's load is counted in routing (a continuation's own id; None: the request's).
    route_key: str | None = None


@dataclass(slots=True)
class Continuation:
    """Where a migrated choice goes on: `run.client` and `run.plan.request` are already updated; a
    disaggregated continuation also needs its fresh prefill leg started."""

    prefill: EngineLeg | None = None


#: A migration that found the choice's token budget spent: it ends with finish reason "length".
BUDGET_SPENT = Continuation()


class RunControl(Protocol):
    """What a choice asks its request's dispatch (`dispatch.Dispatcher`) as it runs."""

    #: Where open engine calls are watched for hung engines (None: not watched).
    watch: CallWatch | None
    #: The request's trace (`tracing.RequestTrace`), when tracing is on.
    trace: Any

    def first_output(self, run: ChoiceRun) -> None:
        """The choice's current engine call delivered its first output (its prefill no longer loads
        its engine)."""

    def unreachable(self, client: EngineClient, error: EngineError) -> None:
        """An engine of the request cannot be reached or hangs (take it out of routing)."""

    def reroute(self, run: ChoiceRun) -> bool:
        """Point `run` at another engine after a failure before any output; False if none is left."""

    def migrate(
        self, run: ChoiceRun, error: EngineError, failed: EngineClient, *, can_pair: bool = True
    ) -> Continuation | None:
        """Continue `run` on another engine after `failed` broke it mid-stream; None when it cannot.
        `can_pair`: whether a disaggregated continuation can be started (else aggregated only)."""


class ChoiceFailed(Exception):
    """Carries a choice's engine failure to the reader, in order, after the events before it.

    With `error` None it is a wake-up (an SSE keep-alive), not a failure."""

    def __init__(self, error: EngineError | None) -> None:
        super().__init__(str(error))
        self.error = error


class ChoiceReader:
    """One choice's generating engine call, read event by event, in the task that enters it.

    The call is dispatched on entering. An engine that cannot be reached, or hangs, before the
    choice's first output is taken out of routing and the call is retried on another engine (`RunControl.reroute`,
    at most `run.retries` times). After the first output, an engine failure moves the choice to
    another engine (`RunControl.migrate`, at most `run.migrations` times; `core.migration`): the
    continuation's tokens go through the same output pipeline, so the client reads one stream.
    Leaving ends the call through `open_engine_call`, which aborts it if the engine had not ended it;
    a failed call is left (and aborted) before its continuation starts.

    `on_first_message` is called on the first message of each engine call; `on_migrate` when the
    choice moves (with the continuation's prefill leg to start, if it is disaggregated). A reader
    without `on_migrate` cannot start a prefill leg, so it only moves to aggregated engines.
    """

    __slots__ = (
        "_run", "_control", "_abort_timeout", "_on_first_message", "_on_migrate", "_call", "_exit", "_failure",
        "_delivered", "_call_delivered", "_ended",
    )  # fmt: skip

    def __init__(
        self,
        run: ChoiceRun,
        control: RunControl,
        abort_timeout: float,
        *,
        on_first_message: Callable[[], None] | None = None,
        on_migrate: Callable[[EngineLeg | None], None] | None = None,
    ) -> None:
        self._run = run
        self._control = control
        self._abort_timeout = abort_timeout
        self._on_first_message = on_first_message
        self._on_migrate = on_migrate
        self._call: EngineCall | None = None
        self._exit: AsyncExitStack | None = None
        #: A failure to dispatch on entering, handled by the first read like any other.
        self._failure = DeferredError()
        self._delivered = False
        self._call_delivered = False
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
        run, control = self._run, self._control
        exit_stack = AsyncExitStack()
        self._call_delivered = False
        self._call = await exit_stack.enter_async_context(
            open_engine_call(
                run.client,
                run.plan.request,
                abort_timeout=self._abort_timeout,
                watch=control.watch,
                trace=control.trace,
                role="decode" if run.plan.request.bootstrap is not None else "aggregated",
            )
        )
        self._exit = exit_stack
        return self._call

    async def wait_written(self) -> None:
        """Return once the engine request is on the wire (or failed before it could be)."""
        if self._call is not None:
            await self._call.wait_written()

    @property
    def ended(self) -> bool:
        """The choice's last output was read: `next_event` returns None without waiting."""
        return self._ended

    def wake(self) -> bool:
        """Interrupt a wait for the next output with `StreamWakeup` (False: no call to wake)."""
        call = self._call
        return call is not None and call.wake()

    async def next_event(self) -> ChoiceEvent | None:
        """The choice's next output, or None once it ended; raises the engine's failure (and
        `StreamWakeup` when woken, after which it reads on)."""
        run = self._run
        while not self._ended:
            try:
                self._failure.raise_held()
                call = self._call if self._call is not None else await self._dispatch()
                batch = await call.next_batch()
            except EngineError as error:
                failed = run.client
                self._note_tokens()
                self._call = None
                if isinstance(error, (EngineUnavailable, EngineStalled)):
                    # Out of routing now, before its Abort (which a hung engine may never answer).
                    self._control.unreachable(failed, error)
                await self.__aexit__(None, None, None)  # the failed call ends (and is aborted) first
                if self._retry(error):
                    continue
                # A disaggregated choice whose engine could not be reached before its first output
                # gets a fresh prefill + decode pair the way a migration does (a retry on the same
                # pair would need the rendezvous the failed leg held).
                fresh_pair = run.prefill is not None and isinstance(error, (EngineUnavailable, EngineStalled))
                if self._delivered or fresh_pair:
                    continuation = self._migrate(error, failed)
                    if continuation is BUDGET_SPENT:
                        self._ended = True
                        return run.plan.output.push([GenerateChunk([], finish_reason="length")])
                    if continuation is not None:
                        continue
                self._ended = True
                raise
            if not batch:
                break
            if not self._call_delivered:
                self._call_delivered = True
                if self._on_first_message is not None:
                    self._on_first_message()
                self._control.first_output(run)
            self._delivered = True
            event = run.plan.output.push(batch)
            self._ended = event.finish_reason is not None
            return event
        self._ended = True
        return None

    def _note_tokens(self) -> None:
        call = self._call
        if call is not None and call.span is not None:
            call.span.set_attribute("trio_direct.generated_tokens", len(self._run.plan.output.generated))

    def _retry(self, error: EngineError) -> bool:
        run = self._run
        # An engine that hangs before the first output is retried like one that cannot be reached (a
        # disaggregated choice gets a fresh pair instead, in `next_event`).
        retriable = isinstance(error, EngineUnavailable) or (isinstance(error, EngineStalled) and run.prefill is None)
        if not retriable or self._delivered or run.retries <= 0:
            return False
        run.retries -= 1
        if not self._control.reroute(run):
            return False
        metrics.RETRIES.inc()
        return True

    def _migrate(self, error: EngineError, failed: EngineClient) -> Continuation | None:
        run = self._run
        if run.migrations <= 0:
            metrics.MIGRATIONS.labels(
                "exhausted" if migration_refusal(run.plan.request, error) is None else "refused"
            ).inc()
            return None
        continuation = self._control.migrate(run, error, failed, can_pair=self._on_migrate is not None)
        if continuation is None or continuation is BUDGET_SPENT:
            return continuation
        run.migrations -= 1
        if self._on_migrate is not None:
            self._on_migrate(continuation.prefill)
        return continuation


async def stream_choice(
    run: ChoiceRun,
    control: RunControl,
    abort_timeout: float,
    send: trio.MemorySendChannel,
    *,
    written: Callable[[], None],
    on_first_message: Callable[[], None] | None = None,
    on_migrate: Callable[[EngineLeg | None], None] | None = None,
    readers: list[ChoiceReader] | None = None,
) -> None:
    """Run the choice's generating engine call, sending its events (or its failure) to `send`;
    `written` is called once its request is on the wire (or could not be sent). The reader is
    listed in `readers` while it runs (so that the request's stream can wake it)."""
    reader = ChoiceReader(run, control, abort_timeout, on_first_message=on_first_message, on_migrate=on_migrate)
    async with reader:
        if readers is not None:
            readers.append(reader)
        try:
            try:
                await reader.wait_written()
            finally:
                written()
            while True:
                try:
                    event = await reader.next_event()
                except StreamWakeup:
                    offer(send, ChoiceFailed(None))  # the request's stream writes a keep-alive
                    continue
                if event is None:
                    return
                offer(send, event)
                if event.finish_reason is not None:
                    return
        except EngineError as error:
            offer(send, ChoiceFailed(error))
        finally:
            if readers is not None:
                readers.remove(reader)


def offer(send: trio.MemorySendChannel, item: object) -> None:
    """Hand `item` to the reader, if it is still there (a cancelled decode leg outlives it)."""
    try:
        send.send_nowait(item)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
