"""Rendering: a surface's `Renderer` turns choice events into its wire format; the drivers here run
dispatch and write what the renderer makes, for streamed and unary responses alike.

A surface (OpenAI chat, legacy completions, ...) implements `Renderer` and nothing else of the
response path: no surface writes to the socket, touches metrics or decides when a stream ends.

The first token's path does only what the engine request needs before the request leaves; what only
the output needs (the renderer's opening bytes, the detokenizers' decoding streams, the response
headers) is done once every engine request is on the wire, while the engines compute.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import trio
from prometheus_client import Histogram

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.core.dispatch import abort_error, client_error, dispatch
from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceEvent, ChoiceResult
from trio_direct.core.plan import RequestPlan, Usage
from trio_direct.core.pool import ServingPool
from trio_direct.core.request_context import CURRENT
from trio_direct.core.watch import WatchedStream
from trio_direct.engine.errors import EngineError, StreamWakeup

__all__ = [
    "KEEPALIVE",
    "SSE_HEADERS",
    "Renderer",
    "ResponseWriter",
    "StreamCutter",
    "stream_response",
    "unary_response",
]

#: What a stream that has been quiet for ``--sse-keepalive`` seconds sends: an SSE comment.
KEEPALIVE = b": ping\n\n"

SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Renderer(Protocol):
    """One request's wire format on one API surface."""

    def prepare(self) -> None:
        """Build what the first write needs and the engine request did not (called after dispatch)."""

    def opening(self) -> bytes:
        """Stream: what goes out with the first events (a role chunk, a `response.created` event)."""

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        """Stream: one write's worth of output for a batch of events (may be empty)."""

    def closing(self, usage: Usage) -> bytes:
        """Stream: the end of a stream that finished (usage, `[DONE]`, a stop event)."""

    def failure(self, error: ApiError) -> bytes:
        """Stream: the end of a stream that failed after its headers went out (an error event)."""

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        """The whole body of a unary response."""


class ResponseWriter(Protocol):
    """The HTTP side of one response (`http.exchange.Exchange`).

    A writer may also offer ``async send_last(data)``, `send` and `end` in one (the last bytes of a
    stream go out with its end); `stream_response` uses it where it is there.
    """

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...

    async def send(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


class StreamCutter:
    """Ends every open response early on demand (the drain deadline of a shutdown, a second signal).

    Each response registers its cancel scope for as long as it runs; `cut` cancels them all, and
    each stream then ends with its surface's error event instead of stopping mid-air. A set of
    scopes costs one insert per request where `trio_util.move_on_when` would cost a task.
    """

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self.cut_reason: str | None = None

    @contextmanager
    def guard(self) -> Iterator[trio.CancelScope]:
        scope = trio.CancelScope()
        if self.cut_reason is not None:
            scope.cancel()
        self._scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            self._scopes.discard(scope)

    def cut(self, reason: str) -> None:
        self.cut_reason = reason
        for scope in list(self._scopes):
            scope.cancel()

    def __len__(self) -> int:
        return len(self._scopes)


def _shutdown_error(cutter: StreamCutter) -> ApiError:
    return errors.service_unavailable(f"The server is shutting down: {cutter.cut_reason or 'drain deadline'}.")


async def stream_response(
    pool: ServingPool,
    plan: RequestPlan,
    renderer: Renderer,
    writer: ResponseWriter,
    *,
    started: float,
    cutter: StreamCutter,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Dispatch `plan` and stream what `renderer` makes of its events.

    Failures before the headers went out (no engine, an engine that refused the request) raise
    `ApiError`, for the HTTP layer to answer with a status; after that, the stream ends with the
    renderer's `failure`. `started` is the request's arrival (`time.perf_counter()`), for TTFT.
    `settle` runs after a successful end was rendered and before it is written (a stored response
    is stored before the client is told it completed); an `ApiError` from it ends the stream
    with that failure instead.
    """
    failure: ApiError | None = None
    headers_sent = False
    #: The stream's last events, written with its end.
    held = b""
    # Looked up once the engine calls are dispatched, off the first token's path.
    ttft: Histogram | None = None
    gaps: metrics.HistogramTally | None = None
    last: float | None = None
    watch = getattr(pool, "watch", None)
    watched: WatchedStream | None = None
    send_last: Callable[[bytes], Awaitable[None]] | None = getattr(writer, "send_last", None)

    async def write(data: bytes, *, end: bool = False) -> None:
        # Timed as the data is handed to the server, recorded once it is out: the histograms'
        # bookkeeping never delays a token. `end`: the response ends with these bytes.
        nonlocal last
        now = time.perf_counter()
        if not end:
            await writer.send(data)
        elif send_last is not None:
            await send_last(data)
        else:
            await writer.send(data)
            await writer.end()
        if last is None:
            if ttft is not None:
                ttft.observe(now - started)
        elif gaps is not None:
            gaps.observe(now - last)
        last = now
        if watched is not None:
            watched.last_write = now

    try:
        with cutter.guard() as guard:
            try:
                async with dispatch(pool, plan) as batches:
                    # Every engine request is on the wire: what follows is done while the engines work.
                    renderer.prepare()
                    per_model = _model_metrics(plan.model)
                    ttft, gaps = per_model.ttft, metrics.HistogramTally(per_model.gaps)
                    await writer.start(200, SSE_HEADERS)
                    headers_sent = True
                    # True once the engines ended the stream, so the next read returns its end at once:
                    # the last events then go out with the end, in one write (a system call and a
                    # wake-up of the client each).
                    ended: Callable[[], bool] | None = getattr(batches, "ended", None)
                    if watch is not None:
                        watched = watch.stream_opened(batches.wake)
                    opening = renderer.opening()
                    while True:  # the `async for` resumes after a keep-alive: no extra cost per batch
                        try:
                            async for batch in batches:
                                aborted = next((e for e in batch if e.finish_reason == "abort"), None)
                                if aborted is not None:
                                    batch = batch[: batch.index(aborted)]
                                    failure = abort_error(aborted)
                                data = renderer.events(batch) if batch else b""
                                if opening:
                                    data, opening = opening + data, b""
                                if data:
                                    if failure is not None or (ended is not None and ended()):
                                        held += data
                                    else:
                                        await write(data)
                                if failure is not None:
                                    break
                        except StreamWakeup:  # quiet for --sse-keepalive: a comment keeps proxies patient
                            await writer.send(KEEPALIVE)
                            if watched is not None:
                                watched.last_write = time.perf_counter()
                            continue
                        break
            except EngineError as error:
                if not headers_sent:
                    raise client_error(error) from None
                failure = client_error(error)
            except ApiError as error:
                if not headers_sent:
                    raise
                failure = error
            finally:
                if watch is not None:
                    watch.stream_closed(watched)
                    watched = None
        if guard.cancelled_caught:
            if not headers_sent:
                raise _shutdown_error(cutter)
            failure = failure or _shutdown_error(cutter)
        _count_tokens(plan)
        if failure is not None:
            await write(held + renderer.failure(failure), end=True)
        else:
            closing = renderer.closing(plan.usage())
            if settle is not None:
                try:
                    await settle()
                except ApiError as error:
                    closing = renderer.failure(error)
            await write(held + closing, end=True)
    finally:
        if gaps is not None:
            gaps.flush()  # the stream's last gaps, however it ended


async def unary_response(pool: ServingPool, plan: RequestPlan, renderer: Renderer, *, cutter: StreamCutter) -> bytes:
    """Dispatch `plan`, collect every choice's events, and return the renderer's body."""
    results = {choice.output.index: ChoiceResult(choice.output.index) for choice in plan.choices}
    with cutter.guard() as guard:
        try:
            async with dispatch(pool, plan) as batches:
                async for batch in batches:
                    for event in batch:
                        if event.finish_reason == "abort":
                            raise abort_error(event)
                        results[event.index].add(event)
        except EngineError as error:
            raise client_error(error) from None
    if guard.cancelled_caught:
        raise _shutdown_error(cutter)
    _count_tokens(plan)
    return renderer.unary(list(results.values()), plan.usage())


def _count_tokens(plan: RequestPlan) -> None:
    usage = plan.usage()
    context = CURRENT.get()
    if context is not None:
        context.prompt_tokens, context.completion_tokens = usage.prompt_tokens, usage.completion_tokens
    per_model = _model_metrics(plan.model)
    per_model.input_tokens.inc(usage.prompt_tokens)
    per_model.output_tokens.inc(usage.completion_tokens)
    per_model.cached_tokens.inc(usage.cached_tokens)


class _ModelMetrics:
    """One model's metric series that every request touches, looked up once: prometheus's `labels`
    validates, joins and locks on each call (five per streamed request otherwise)."""

    __slots__ = ("ttft", "gaps", "input_tokens", "output_tokens", "cached_tokens")

    def __init__(self, model: str) -> None:
        self.ttft = metrics.TTFT.labels(model)
        self.gaps = metrics.INTER_TOKEN.labels(model)
        self.input_tokens = metrics.TOKENS.labels(model, "input")
        self.output_tokens = metrics.TOKENS.labels(model, "output")
        self.cached_tokens = metrics.TOKENS.labels(model, "cached")


_MODEL_METRICS: dict[str, _ModelMetrics] = {}
#: Served model names are few; the bound only keeps a misuse from growing the table for ever.
_MODEL_METRICS_LIMIT = 1024


def _model_metrics(model: str) -> _ModelMetrics:
    found = _MODEL_METRICS.get(model)
    if found is None:
        if len(_MODEL_METRICS) >= _MODEL_METRICS_LIMIT:
            _MODEL_METRICS.clear()
        found = _MODEL_METRICS[model] = _ModelMetrics(model)
    return found
