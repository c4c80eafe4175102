"""One request to one engine, from dispatch to its end: where a client that goes away becomes an Abort.

Every engine request the frontend starts ends in completion or an `Abort`. The decision is taken in
one place, the ``finally`` of `open_engine_call`, from explicit state (`EngineCall.ended_at_engine`),
never from exception types: cancellation arrives wrapped in exception groups. Leaving the call early
also resets its HTTP/2 stream, which a stock engine already treats as a cancel; the `Abort` is the
belt to those braces (it also reaches requests queued behind a stuck stream, and engines that missed
the reset).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from trio_direct import metrics
from trio_direct.core.deferred import DeferredError
from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable
from trio_direct.engine.types import EngineClient, GenerateChunk, GenerateInput, GenerateStream

log = logging.getLogger(__name__)

#: Errors after which the engine may still be running the request, so an Abort is still owed.
_ENGINE_MAY_STILL_RUN = (EngineUnavailable, EngineDeadlineExceeded)


class CallWatch(Protocol):
    """Where open engine calls are watched for hung engines (`core.watch.StreamWatch`)."""

    def call_opened(self, call: EngineCall) -> None: ...

    def call_closed(self, call: EngineCall) -> None: ...

    def abort_later(self, client: EngineClient, rid: str, timeout: float) -> bool:
        """Send the Abort of a call to a hung engine elsewhere; False: send it in place."""
        ...


class EngineCall:
    """The state of one engine request, read by the cancellation decision."""

    __slots__ = (
        "client", "request", "ended_at_engine", "first_chunk_at", "opened_at", "span", "stalled", "_chunks", "_failure",
    )  # fmt: skip

    def __init__(self, client: EngineClient, request: GenerateInput, chunks: GenerateStream) -> None:
        self.client = client
        self.request = request
        #: True once the engine itself ended the request (finish reason, or an error it reported).
        self.ended_at_engine = False
        self.first_chunk_at: float | None = None
        #: When the call was opened (trio time): a hung engine is judged from here or its last output.
        self.opened_at = trio.current_time()
        #: The call's trace span, when tracing is on.
        self.span: Any = None
        #: Failed because its engine is hung: its Abort need not hold up what the request does next.
        self.stalled = False
        self._chunks = chunks
        #: An engine error that arrived behind chunks of a batch: raised by the next call, so the
        #: chunks before it still reach the client.
        self._failure = DeferredError()

    def stall(self, error: EngineError) -> bool:
        """Fail the call with `error` (its engine is hung); False when that cannot reach its reader."""
        fail = getattr(self._chunks, "fail", None)
        self.stalled = True
        return fail is not None and fail(error)

    def wake(self) -> bool:
        """Interrupt the reader waiting on this call with `StreamWakeup` (for an SSE keep-alive)."""
        wake = getattr(self._chunks, "wake", None)
        return wake is not None and wake()

    async def wait_written(self) -> None:
        """Return once the request is on the wire (or the call ended before it could be)."""
        await self._chunks.wait_written()

    async def next_batch(self) -> list[GenerateChunk]:
        """The next chunk plus any that already arrived behind it; [] once the engine finished.

        Batching what queued up while the consumer was busy keeps a slow client from falling further
        behind, and never delays a chunk that could be sent now.
        """
        self._failure.raise_held()
        if self.ended_at_engine:
            return []
        chunks = self._chunks
        try:
            batch = [await chunks.__anext__()]
        except StopAsyncIteration:
            return []
        except EngineError as error:
            self.ended_at_engine = not isinstance(error, _ENGINE_MAY_STILL_RUN)
            raise
        now = trio.current_time()
        self.client.last_output_at = now
        if self.first_chunk_at is None:
            self.first_chunk_at = now
        while batch[-1].finish_reason is None:
            try:
                more = chunks.next_nowait()
            except (trio.WouldBlock, StopAsyncIteration):
                break
            except EngineError as error:
                self.ended_at_engine = not isinstance(error, _ENGINE_MAY_STILL_RUN)
                self._failure.hold(error)
                break
            batch.append(more)
        if batch[-1].finish_reason is not None:
            self.ended_at_engine = True
        return batch

    def drain_arrived(self) -> None:
        """Read what already arrived unread, so a request the engine just finished is not aborted."""
        while not self.ended_at_engine:
            try:
                chunk = self._chunks.next_nowait()
            except (trio.WouldBlock, StopAsyncIteration):
                return
            except EngineError as error:
                self.ended_at_engine = not isinstance(error, _ENGINE_MAY_STILL_RUN)
                return
            if chunk.finish_reason is not None:
                self.ended_at_engine = True


@asynccontextmanager
async def open_engine_call(
    client: EngineClient,
    request: GenerateInput,
    *,
    abort_timeout: float = 5.0,
    watch: CallWatch | None = None,
    trace: Any = None,
    role: str = "aggregated",
) -> AsyncIterator[EngineCall]:
    """Dispatch `request` to `client`; on leaving before the engine ended it, abort it there.

    `watch`, when given, watches the open call for a hung engine; `trace` (a `tracing.RequestTrace`)
    gives it a span, whose context the engine gets in the request's trace headers.
    """
    call: EngineCall | None = None
    span = None
    if trace is not None:
        span = trace.engine_span(client.name, role, request)
    try:
        async with client.generate(request) as chunks:
            call = EngineCall(client, request, chunks)
            call.span = span
            if watch is not None:
                watch.call_opened(call)
            try:
                yield call
            finally:
                call.drain_arrived()
                if watch is not None:
                    watch.call_closed(call)
    finally:
        if call is None or not call.ended_at_engine:
            # A hung engine will not answer its Abort soon: the request moves on (a retry, a migration)
            # while the watch sends it.
            deferred = call is not None and call.stalled and watch is not None
            if not (deferred and watch.abort_later(client, request.rid, abort_timeout)):  # type: ignore[union-attr]
                await abort_on_engine(client, request.rid, abort_timeout)
        if span is not None:
            trace.end_engine_span(span, ended=call is not None and call.ended_at_engine)


async def abort_on_engine(client: EngineClient, rid: str, timeout: float) -> None:
    """Send `Abort(rid)`, shielded from the cancellation that got us here and bounded by `timeout`."""
    outcome = "sent"
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + timeout
        try:
            await client.abort(rid, timeout=timeout)
        except EngineError as error:
            outcome = "failed"
            log.warning("abort of %s on %s failed: %s", rid, client.name, error)
    if scope.cancelled_caught:
        outcome = "timed_out"
        log.warning("abort of %s on %s timed out after %.1fs", rid, client.name, timeout)
    metrics.ABORTS.labels(outcome).inc()
