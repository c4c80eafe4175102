"""One task that watches every open response and engine call of a frontend, so that no stream pays a
timer per token: SSE keep-alives for streams gone quiet, and engines that hang.

- **Keep-alive** (``--sse-keepalive``): a stream that wrote nothing for that long gets a ``: ping``
  comment, so that a proxy with an idle timeout does not cut a long prefill. Its writer notes when
  it last wrote (a value it has anyway, for the inter-token histogram); the watch wakes the stream's
  reader (`StreamWakeup`), which writes the comment and reads on.
- **Hung engines** (``--stream-idle-timeout``): an engine call that got nothing for that long while
  its engine delivered nothing on any other call either (`EngineClient.last_output_at`) is failed
  with `EngineStalled`: its choice then migrates to another engine, and the engine is marked down
  until a health check passes. An engine that is merely slow on one request (queued behind others
  that stream) is not hung. Disaggregated legs are judged from their first message on: before it,
  a decode leg waits for its prefill by design, and a prefill leg sends only that message.
- **Quiet calls asked whole** (a non-streamed answer, `core.plan`): their one message is their last,
  so silence says nothing. When such calls have been open for ``--stream-idle-timeout`` on an
  engine that delivered nothing on any call meanwhile, the engine's health is checked at once
  (`on_quiet`, at most once per timeout): unanswered, the engine is hung and its calls fail
  (`fleet.health`); answered, it is busy generating, and they wait.
- **Hung engines, found by a health probe** (`fail_calls`): the health checks ask the watch whether
  an engine whose probe went unanswered has open calls and produced nothing during the probe; such
  an engine is hung, whatever ``--stream-idle-timeout`` says, and its calls are failed the same way.
- **Aborts owed to a hung engine** (`abort_later`): a failed call's Abort is sent from the watch's
  own nursery, bounded by ``--abort-timeout``, so that its request moves to another engine at once
  instead of waiting for an Abort that a stopped engine will not answer.

The decisions are `StreamWatch.check` (sans-IO, given the time); `run` ticks it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from trio_direct import metrics
from trio_direct.core.engine_call import EngineCall, abort_on_engine
from trio_direct.engine.errors import EngineStalled

__all__ = ["StreamWatch", "WatchedStream"]

log = logging.getLogger(__name__)

#: The longest pause between two checks (a check is cheap: a few comparisons per open stream).
_MAX_TICK = 1.0


@dataclass(eq=False, slots=True)
class WatchedStream:
    """An open streamed response, as the watch sees it."""

    #: Wakes the stream's reader; False when nothing could be woken (between engine calls).
    wake: Callable[[], bool]
    #: When the stream last wrote (`time.perf_counter()`), set by its writer.
    last_write: float = field(default_factory=time.perf_counter)
    #: The `last_write` a keep-alive was already asked for (one per quiet period).
    woken_for: float = -1.0


class StreamWatch:
    """The open responses and engine calls of one frontend, and the task that watches them."""

    def __init__(self, *, keepalive: float = 0.0, stall_timeout: float = 0.0) -> None:
        self.keepalive = keepalive
        self.stall_timeout = stall_timeout
        self._streams: set[WatchedStream] = set()
        #: Open engine calls by engine.
        self._calls: dict[Any, set[EngineCall]] = {}
        #: `run`'s nursery while it runs: where Aborts to hung engines are sent (`abort_later`).
        self._aborts: trio.Nursery | None = None
        #: Told of an engine whose calls asked whole went quiet for the idle timeout (its pool's
        #: health checks it now: `fleet.health.EngineHealth.check_soon`).
        self.on_quiet: list[Callable[[Any], None]] = []
        #: When each engine was last reported to `on_quiet` (trio time): once per idle timeout.
        self._reported: dict[Any, float] = {}

    @property
    def tick(self) -> float:
        """Seconds between checks: a quarter of the shortest period watched, at most a second."""
        periods = [p for p in (self.keepalive, self.stall_timeout) if p > 0]
        return min([_MAX_TICK, *(p / 4 for p in periods)])

    # ---- registration (per request and per engine call, never per token) ------------------------

    def stream_opened(self, wake: Callable[[], bool]) -> WatchedStream | None:
        if self.keepalive <= 0:
            return None
        stream = WatchedStream(wake)
        self._streams.add(stream)
        return stream

    def stream_closed(self, stream: WatchedStream | None) -> None:
        if stream is not None:
            self._streams.discard(stream)

    def call_opened(self, call: EngineCall) -> None:
        self._calls.setdefault(call.client, set()).add(call)

    def call_closed(self, call: EngineCall) -> None:
        calls = self._calls.get(call.client)
        if calls is not None:
            calls.discard(call)
            if not calls:
                del self._calls[call.client]

    # ---- decisions ------------------------------------------------------------------------------

    def check(self, now: float, trio_now: float) -> None:
        """Wake quiet streams and fail calls on hung engines (`now`: perf_counter, `trio_now`: trio time)."""
        keepalive = self.keepalive
        if keepalive > 0:
            for stream in list(self._streams):
                quiet = now - stream.last_write >= keepalive and stream.woken_for != stream.last_write
                if quiet and stream.wake():
                    stream.woken_for = stream.last_write
        timeout = self.stall_timeout
        if timeout > 0:
            for client, at in list(self._reported.items()):
                if trio_now - at >= timeout:
                    del self._reported[client]  # reported again after another idle timeout
            for client, calls in list(self._calls.items()):
                if trio_now - client.last_output_at < timeout:
                    continue  # the engine delivered output lately: busy, not hung
                long_open = [call for call in calls if trio_now - call.opened_at >= timeout]
                stalled = [
                    call for call in long_open
                    if (call.request.bootstrap is None or call.first_chunk_at is not None)
                    and (call.request.stream or call.first_chunk_at is not None)
                ]  # fmt: skip
                if stalled:
                    self._fail(client, stalled, timeout)
                if any(not call.request.stream and call.first_chunk_at is None for call in long_open):
                    self._report_quiet(client, trio_now)

    def _report_quiet(self, client: Any, now: float) -> None:
        if client in self._reported:
            return
        self._reported[client] = now
        for listener in self.on_quiet:
            listener(client)

    def _fail(self, client: Any, stalled: list[EngineCall], timeout: float) -> None:
        log.warning(
            "engine %s sent nothing for %gs on %d open call(s) or any other: treating it as hung",
            client.name, timeout, len(stalled),
        )  # fmt: skip
        for call in stalled:
            self.call_closed(call)  # failed once: its reader ends it
            error = EngineStalled(f"no output for {timeout:g}s (--stream-idle-timeout)", engine=client.name)
            if call.stall(error):
                metrics.STALLED_ENGINES.labels(client.name).inc()

    def quiet_calls(self, client: Any, since: float) -> int:
        """How many calls to `client` were open before `since` (trio time), if it delivered nothing
        on any call since then (0 otherwise)."""
        if client.last_output_at >= since:
            return 0
        return sum(1 for call in self._calls.get(client, ()) if call.opened_at < since)

    def fail_calls(self, client: Any, since: float, reason: str) -> int:
        """Fail the calls to `client` open before `since` with `EngineStalled` (it is hung: their
        choices retry or migrate); returns how many were failed."""
        stalled = [call for call in self._calls.get(client, ()) if call.opened_at < since]
        for call in stalled:
            self.call_closed(call)
            if call.stall(EngineStalled(reason, engine=client.name)):
                metrics.STALLED_ENGINES.labels(client.name).inc()
        return len(stalled)

    def abort_later(self, client: Any, rid: str, timeout: float) -> bool:
        """Send `Abort(rid)` to a hung `client` from the watch's nursery (bounded by `timeout`), so
        its request need not wait for it; False when the watch is not running (abort in place)."""
        if self._aborts is None:
            return False
        self._aborts.start_soon(abort_on_engine, client, rid, timeout)
        return True

    async def run(self) -> None:
        """Check every `tick` seconds until cancelled; Aborts handed over meanwhile run here too."""
        try:
            async with trio.open_nursery() as aborts:
                self._aborts = aborts
                if self.keepalive <= 0 and self.stall_timeout <= 0:
                    await trio.sleep_forever()
                tick = self.tick
                while True:
                    await trio.sleep(tick)
                    self.check(time.perf_counter(), trio.current_time())
        finally:
            self._aborts = None
