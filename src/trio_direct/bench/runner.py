"""The load generator: replays trace requests at their arrival times against an OpenAI endpoint.

Open loop: each request is sent at its (scaled) trace timestamp whether or not earlier ones have
finished, as real users would, and streams `/v1/completions` with a token-id prompt. Per request it
records time to first token, the gaps between token chunks, end-to-end latency and the server's
usage (prompt, completion and cached tokens).

The HTTP client is h11 on plain trio sockets rather than a general-purpose client: trio sets
`TCP_NODELAY` on every connection it opens, which keeps the ~40 ms Nagle/delayed-ACK floor that
keep-alive SSE clients hit against some servers out of the numbers, and
`check_client_latency` measures that the reused connections are no slower than fresh ones.

`open_embedded_fleet` starts mock engines and an in-process frontend, so one command can benchmark
trio-direct's own routing without any other process.
"""

from __future__ import annotations

import contextlib
import io
import math
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import h11
import msgspec
import trio

from trio_direct.bench.trace import (
    DEFAULT_MIN_TOKEN_ID,
    DEFAULT_VOCAB_SIZE,
    PromptSynthesizer,
    TraceRequest,
)

__all__ = [
    "CAPPED_ERROR",
    "PROGRESS_INTERVAL_S",
    "BenchResult",
    "EmbeddedFleet",
    "FleetSpec",
    "HttpClient",
    "HttpError",
    "LoadSample",
    "RequestRecord",
    "SseDecoder",
    "StreamMeter",
    "check_client_latency",
    "check_serve_argv",
    "completion_body",
    "fetch_model",
    "open_embedded_fleet",
    "progress_line",
    "run_bench",
]

_json_decode = msgspec.json.Decoder().decode
_json_encode = msgspec.json.Encoder().encode

#: The error of requests the `duration` cap cancelled.
CAPPED_ERROR = "cancelled at the duration cap"

#: How often engine load is sampled in embedded mode.
LOAD_POLL_INTERVAL_S = 0.25
#: How often the progress line is redrawn on a terminal.
TERMINAL_PROGRESS_S = 0.5
#: Default seconds between progress lines when stderr is not a terminal (a log file, CI).
PROGRESS_INTERVAL_S = 5.0


# --- results ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class RequestRecord:
    """What one request saw. Times are seconds; `*_at_s` are relative to the start of the run."""

    index: int
    #: When the trace says it arrives.
    scheduled_at_s: float
    input_length: int
    max_tokens: int
    #: When it was actually sent (later than scheduled only under a concurrency limit).
    sent_at_s: float | None = None
    #: HTTP status; 0 when no response arrived.
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    #: Gaps between successive chunks that carried text (a chunk may hold several tokens).
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    cached_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first, from the server's token count."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(slots=True, frozen=True)
class LoadSample:
    """One engine's load at one moment (summed over its DP ranks)."""

    at_s: float
    engine: str
    running: int
    waiting: int
    used_tokens: int


@dataclass(slots=True)
class BenchResult:
    """One run: every request's record and, in embedded mode, the engines' load over time."""

    base_url: str
    model: str
    #: Every request that was started, in start order (the duration cap may leave some unstarted).
    records: list[RequestRecord]
    #: Requests the run was given.
    planned: int
    #: From the first send until the last request ended (or the cap).
    elapsed_s: float
    #: Whether the `duration` cap stopped the run.
    capped: bool = False
    engine_load: list[LoadSample] = field(default_factory=list)


# --- SSE and per-request measurement (sans-IO) -----------------------------------------------------


class SseDecoder:
    """Server-sent events from a byte stream: `feed` returns the `data` payload of each complete event."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                self._data.append(value.removeprefix(b" ").decode("utf-8", "replace"))
        return events


class StreamMeter:
    """Turns the SSE payloads of one streamed completion into a `RequestRecord`'s measurements."""

    __slots__ = ("_last_token", "done", "record", "started")

    def __init__(self, record: RequestRecord, started: float) -> None:
        self.record = record
        self.started = started
        self.done = False
        self._last_token: float | None = None

    def on_payload(self, payload: str, now: float) -> None:
        record = self.record
        if payload == "[DONE]":
            self.done = True
            record.e2e_s = now - self.started
            if record.ttft_s is not None and record.output_tokens == 0:
                record.output_tokens = 1 + len(record.itl_s)
            return
        try:
            message = _json_decode(payload)
        except msgspec.DecodeError:
            record.error = f"undecodable SSE payload: {payload[:80]!r}"
            return
        if not isinstance(message, dict):
            return
        error = message.get("error")
        if error is not None:
            record.error = str(error.get("message", error) if isinstance(error, dict) else error)
            return
        for choice in message.get("choices") or ():
            if choice.get("text"):
                if self._last_token is None:
                    record.ttft_s = now - self.started
                else:
                    record.itl_s.append(now - self._last_token)
                self._last_token = now
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]
        usage = message.get("usage")
        if isinstance(usage, dict):
            record.prompt_tokens = usage.get("prompt_tokens")
            record.output_tokens = usage.get("completion_tokens") or 0
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = details.get("cached_tokens") or 0


def progress_line(*, planned: int, started: int, finished: int, failed: int, elapsed_s: float) -> str:
    """The one-line progress display."""
    return f"bench: {finished}/{planned} done, {started - finished} in flight, {failed} failed, {elapsed_s:.1f} s"


# --- HTTP/1.1 client on trio sockets ---------------------------------------------------------------


class HttpError(Exception):
    """The connection failed or the server broke the HTTP protocol."""


@dataclass(slots=True, frozen=True)
class _Endpoint:
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, base_url: str) -> _Endpoint:
        parts = urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parts.scheme != "http":
            raise ValueError(f"only http:// URLs are supported, not {base_url!r}")
        if not parts.hostname:
            raise ValueError(f"no host in {base_url!r}")
        prefix = parts.path.rstrip("/").removesuffix("/v1")
        return cls(parts.hostname, parts.port or 80, prefix)


class _Connection:
    __slots__ = ("h11", "reused", "stream")

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.reused = False

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
                continue
            return event


class HttpResponse:
    """A response whose head has arrived; iterate `body()` for the rest."""

    def __init__(self, connection: _Connection, status: int) -> None:
        self._connection = connection
        self.status = status
        self.complete = False

    async def body(self) -> AsyncIterator[bytes]:
        while not self.complete:
            event = await self._connection.next_event()
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("connection closed before the response ended")

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.body()])


_CONNECTION_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError)


class HttpClient:
    """HTTP/1.1 to one server, with idle keep-alive connections reused (or none, `keep_alive=False`)."""

    def __init__(self, base_url: str, *, keep_alive: bool = True, connect_timeout: float = 10.0) -> None:
        self.endpoint = _Endpoint.parse(base_url)
        self.keep_alive = keep_alive
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await trio.aclose_forcefully(connection.stream)

    async def _connect(self) -> _Connection:
        with trio.move_on_after(self.connect_timeout) as timer:
            try:
                stream = await trio.open_tcp_stream(self.endpoint.host, self.endpoint.port)
            except OSError as exc:
                raise HttpError(f"cannot connect to {self.endpoint.host}:{self.endpoint.port}: {exc}") from exc
        if timer.cancelled_caught:
            raise HttpError(f"connecting to {self.endpoint.host}:{self.endpoint.port} timed out")
        return _Connection(stream)

    async def _start(self, connection: _Connection, method: str, path: str, body: bytes | None) -> HttpResponse:
        headers = [("Host", f"{self.endpoint.host}:{self.endpoint.port}"), ("Accept", "*/*")]
        if body is not None:
            headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        if not self.keep_alive:
            headers.append(("Connection", "close"))
        data = connection.h11.send(h11.Request(method=method, target=self.endpoint.prefix + path, headers=headers))
        if body is not None:
            data += connection.h11.send(h11.Data(data=body))
        data += connection.h11.send(h11.EndOfMessage())
        await connection.stream.send_all(data)
        while True:
            event = await connection.next_event()
            if isinstance(event, h11.Response):
                return HttpResponse(connection, event.status_code)
            if isinstance(event, h11.ConnectionClosed):
                raise HttpError("connection closed before a response")
            # h11.InformationalResponse (1xx): keep reading

    @asynccontextmanager
    async def request(self, method: str, path: str, body: bytes | None = None) -> AsyncIterator[HttpResponse]:
        """Send a request; the response's connection returns to the pool if its body was read fully."""
        connection, response = await self._open(method, path, body)
        try:
            yield response
        except BaseException:
            await trio.aclose_forcefully(connection.stream)
            raise
        h = connection.h11
        if self.keep_alive and response.complete and h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            connection.reused = True
            self._idle.append(connection)
        else:
            await trio.aclose_forcefully(connection.stream)

    async def _open(self, method: str, path: str, body: bytes | None) -> tuple[_Connection, HttpResponse]:
        while True:
            connection = self._idle.pop() if self._idle else await self._connect()
            try:
                return connection, await self._start(connection, method, path, body)
            except BaseException as exc:
                await trio.aclose_forcefully(connection.stream)
                if isinstance(exc, (HttpError, *_CONNECTION_ERRORS)):
                    if connection.reused:
                        continue  # the server closed an idle keep-alive connection: try another
                    if isinstance(exc, HttpError):
                        raise
                    raise HttpError(f"{type(exc).__name__}: {exc}") from exc
                raise

    async def get_json(self, path: str) -> tuple[int, Any]:
        try:
            async with self.request("GET", path) as response:
                payload = await response.read()
        except _CONNECTION_ERRORS as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        try:
            return response.status, _json_decode(payload) if payload else None
        except msgspec.DecodeError:
            return response.status, payload.decode("utf-8", "replace")


async def fetch_model(base_url: str) -> str:
    """The first model `GET /v1/models` lists."""
    client = HttpClient(base_url)
    try:
        status, body = await client.get_json("/v1/models")
    finally:
        await client.aclose()
    if status != 200 or not isinstance(body, dict) or not body.get("data"):
        raise HttpError(f"GET /v1/models answered {status}: {str(body)[:200]}")
    return str(body["data"][0]["id"])


# --- one request -----------------------------------------------------------------------------------


def completion_body(model: str, prompt: list[int], max_tokens: int) -> bytes:
    """A streamed `/v1/completions` request for a token-id prompt that always runs to `max_tokens`."""
    return _json_encode(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    )


async def _stream_completion(client: HttpClient, body: bytes, record: RequestRecord, started: float) -> None:
    meter = StreamMeter(record, started)
    try:
        async with client.request("POST", "/v1/completions", body) as response:
            record.status = response.status
            if response.status != 200:
                text = (await response.read()).decode("utf-8", "replace")
                record.error = f"HTTP {response.status}: {_error_message(text)}"
                return
            decoder = SseDecoder()
            async for chunk in response.body():
                now = trio.current_time()
                for payload in decoder.feed(chunk):
                    meter.on_payload(payload, now)
    except HttpError as exc:
        record.error = str(exc)
        return
    except _CONNECTION_ERRORS as exc:
        record.error = f"{type(exc).__name__}: {exc}"
        return
    if not meter.done and record.error is None:
        record.error = "stream ended without [DONE]"


def _error_message(text: str) -> str:
    try:
        body = _json_decode(text)
        return str(body["error"]["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return text[:200]


# --- the run ---------------------------------------------------------------------------------------


async def run_bench(
    base_url: str,
    model: str,
    requests: Sequence[TraceRequest],
    *,
    concurrency_limit: int | None = None,
    timeout: float,
    progress: bool = True,
    duration: float | None = None,
    prompts: PromptSynthesizer | None = None,
    keep_alive: bool = True,
    load_targets: Sequence[tuple[str, str, int]] = (),
    progress_stream: TextIO | None = None,
    progress_interval: float = PROGRESS_INTERVAL_S,
) -> BenchResult:
    """Replay `requests` open-loop at their `arrival_s` and measure each one.

    `timeout` bounds each request; `duration` bounds the run: at the cap no more requests start and
    those in flight are cancelled (recorded with error "cancelled at the duration cap").
    `load_targets` (name, host, port) are mock engines whose native `GetLoad` is sampled every
    250 ms (needs `open_transport()`, as every gRPC call here). `progress` writes to
    `progress_stream` (default stderr): on a terminal one line, rewritten in place; otherwise (a log
    file, CI) a line every `progress_interval` seconds, so a long run still shows it is alive.
    Either way the final counts end it.
    """
    if concurrency_limit is not None and concurrency_limit < 1:
        raise ValueError("concurrency_limit must be at least 1")
    prompts = prompts or PromptSynthesizer(low=DEFAULT_MIN_TOKEN_ID, high=DEFAULT_VOCAB_SIZE)
    stream = progress_stream if progress_stream is not None else sys.stderr
    terminal = stream.isatty()
    client = HttpClient(base_url, keep_alive=keep_alive)
    limiter = trio.Semaphore(concurrency_limit) if concurrency_limit else None
    records: list[RequestRecord] = []
    load: list[LoadSample] = []
    counts = {"finished": 0, "failed": 0}
    t0 = ended = trio.current_time()

    async def one(request: TraceRequest, record: RequestRecord) -> None:
        nonlocal ended
        try:
            if limiter is not None:
                await limiter.acquire()
            try:
                started = trio.current_time()
                record.sent_at_s = started - t0
                body = completion_body(model, prompts.prompt(request), request.output_length)
                with trio.move_on_after(timeout) as timer:
                    await _stream_completion(client, body, record, started)
                if timer.cancelled_caught:
                    record.error = f"timed out after {timeout:g} s"
            finally:
                if limiter is not None:
                    limiter.release()
        finally:
            if record.e2e_s is None and record.error is None:
                record.error = CAPPED_ERROR
            counts["finished"] += 1
            counts["failed"] += not record.ok
            ended = max(ended, trio.current_time())

    try:
        async with trio.open_nursery() as background:
            for name, host, port in load_targets:  # each reports once it has its first sample
                await background.start(_poll_load, name, host, port, load)
            t0 = ended = trio.current_time()
            if progress:
                show = partial(_show_progress, stream, len(requests), records, counts, t0)
                background.start_soon(show, terminal, TERMINAL_PROGRESS_S if terminal else progress_interval)
            with trio.CancelScope(deadline=t0 + duration if duration is not None else math.inf) as cap:
                async with trio.open_nursery() as in_flight:
                    for request in requests:
                        await trio.sleep_until(t0 + request.arrival_s)
                        record = RequestRecord(
                            index=request.index,
                            scheduled_at_s=request.arrival_s,
                            input_length=request.input_length,
                            max_tokens=request.output_length,
                        )
                        records.append(record)
                        in_flight.start_soon(one, request, record)
            background.cancel_scope.cancel()
    finally:
        await client.aclose()
    if progress:
        line = progress_line(
            planned=len(requests),
            started=len(records),
            finished=counts["finished"],
            failed=counts["failed"],
            elapsed_s=ended - t0,
        )
        stream.write(f"\r{line}\n" if terminal else f"{line}\n")
        stream.flush()
    return BenchResult(
        base_url=base_url,
        model=model,
        records=records,
        planned=len(requests),
        elapsed_s=(trio.current_time() if cap.cancelled_caught else ended) - t0,
        capped=cap.cancelled_caught,
        engine_load=sorted(
            (replace(sample, at_s=max(0.0, sample.at_s - t0)) for sample in load), key=lambda s: (s.at_s, s.engine)
        ),
    )


async def _show_progress(
    stream: TextIO,
    planned: int,
    records: list[RequestRecord],
    counts: dict[str, int],
    t0: float,
    terminal: bool,
    interval: float,
) -> None:
    """The progress line every `interval` seconds: rewritten in place on a terminal, else appended
    from the first interval on (a run shorter than that shows only its final line)."""
    if not terminal:
        await trio.sleep(interval)
    while True:
        line = progress_line(
            planned=planned,
            started=len(records),
            finished=counts["finished"],
            failed=counts["failed"],
            elapsed_s=trio.current_time() - t0,
        )
        stream.write(f"\r{line}\x1b[K" if terminal else f"{line}\n")
        stream.flush()
        await trio.sleep(interval)


async def _poll_load(
    name: str,
    host: str,
    port: int,
    samples: list[LoadSample],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sample one engine's native GetLoad every `LOAD_POLL_INTERVAL_S` (`at_s` on trio's clock).

    Reports started after the first attempt, so even a short run has a sample of every engine; a
    failed poll is skipped.
    """
    from trio_direct.engine.errors import EngineError
    from trio_direct.engine.native import NativeEngineClient
    from trio_direct.engine.transport import EngineChannel

    channel = EngineChannel(host, port, connect_timeout=2.0)
    client = NativeEngineClient(channel, incremental=True)
    reported = False
    try:
        tick = trio.current_time()
        while True:
            at = trio.current_time()
            try:
                ranks = await client.load(timeout=1.0)
            except EngineError:
                ranks = None
            if ranks is not None:
                samples.append(
                    LoadSample(
                        at_s=at,
                        engine=name,
                        running=sum(int(r.get("num_running_reqs", 0)) for r in ranks),
                        waiting=sum(int(r.get("num_waiting_reqs", 0)) for r in ranks),
                        used_tokens=sum(int(r.get("num_used_tokens", 0)) for r in ranks),
                    )
                )
            if not reported:
                task_status.started()
                reported = True
            tick = max(tick + LOAD_POLL_INTERVAL_S, trio.current_time())
            await trio.sleep_until(tick)
    finally:
        channel.close()


# --- is the client adding latency? -----------------------------------------------------------------


async def check_client_latency(
    base_url: str, model: str, *, samples: int = 8, prompts: PromptSynthesizer | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """TTFT of tiny requests over one reused keep-alive connection vs a fresh connection each.

    A reused connection that is much slower than fresh ones is the Nagle/delayed-ACK floor (a
    client without TCP_NODELAY on a keep-alive connection), which would inflate every number of the run; `floor_suspected` flags it. The two
    kinds alternate, after two warm-up requests each, so a fleet still warming up skews neither.
    """
    if samples < 1:
        raise ValueError("samples must be at least 1")
    prompts = prompts or PromptSynthesizer(low=DEFAULT_MIN_TOKEN_ID, high=DEFAULT_VOCAB_SIZE)
    prompt = prompts.prompt(TraceRequest(index=-1, arrival_s=0.0, input_length=16, output_length=2, hash_ids=(-1,)))
    body = completion_body(model, prompt, 2)
    clients = {"keep_alive": HttpClient(base_url), "fresh_connection": HttpClient(base_url, keep_alive=False)}
    ttfts: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for i in range(samples + 2):
            for name, client in clients.items():
                record = RequestRecord(index=-1, scheduled_at_s=0.0, input_length=len(prompt), max_tokens=2)
                with trio.fail_after(timeout):
                    await _stream_completion(client, body, record, trio.current_time())
                if not record.ok or record.ttft_s is None:
                    raise HttpError(f"client check request failed: {record.error or record.status}")
                if i >= 2:
                    ttfts[name].append(record.ttft_s * 1000.0)
    finally:
        for client in clients.values():
            await client.aclose()
    keep = statistics.median(ttfts["keep_alive"])
    fresh = statistics.median(ttfts["fresh_connection"])
    return {
        "samples": samples,
        "keep_alive_ttft_p50_ms": round(keep, 3),
        "fresh_connection_ttft_p50_ms": round(fresh, 3),
        "floor_suspected": keep > fresh + 20.0,
    }


# --- embedded fleet --------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class FleetSpec:
    """Mock engines plus an in-process trio-direct frontend to benchmark."""

    engines: int = 2
    speedup: float = 1.0
    router_mode: str = "round-robin"
    page_size: int = 16
    #: The engines' context length is the model's, raised to this if smaller (long trace prompts).
    min_context_length: int = 0
    model_path: str | None = None
    log_level: str = "warning"

    def serve_argv(self, engine_urls: Sequence[str]) -> list[str]:
        """`trio-direct serve` flags for the in-process frontend (ephemeral loopback port)."""
        argv = ["--host", "127.0.0.1", "--port", "0", "--router-mode", self.router_mode]
        argv += ["--log-level", self.log_level, "--engine-wait-timeout", "60"]
        for url in engine_urls:
            argv += ["--engine-url", url]
        return argv


@dataclass(slots=True, frozen=True)
class EmbeddedFleet:
    """A started fleet: where to send requests, what to poll, and the model's token-id space."""

    base_url: str
    #: (name, host, port) of each engine, for `run_bench(load_targets=...)`.
    engines: list[tuple[str, str, int]]
    vocab_size: int
    special_token_ids: frozenset[int]


@asynccontextmanager
async def open_embedded_fleet(spec: FleetSpec) -> AsyncIterator[EmbeddedFleet]:
    """Start `spec.engines` mock engines (KV events on) and a frontend in front of them.

    Everything runs in this process and stops when the block exits. Raises ValueError for a setting
    `trio-direct serve` rejects (e.g. a router mode it does not have).
    """
    from trio_direct.config import parse_serve_args
    from trio_direct.engine.transport import open_transport
    from trio_direct.mock.server import MockEngineConfig, load_model_files, run_mock_engine
    from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
    from trio_direct.service import serve

    if spec.engines < 1:
        raise ValueError("an embedded fleet needs at least one engine")
    check_serve_argv(spec.serve_argv(["grpc://127.0.0.1:1"]))
    model_path = spec.model_path or str(ensure_tiny_model(default_tiny_model_dir()))
    model = load_model_files(Path(model_path))
    kv_events = _json_encode({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0"}).decode()
    async with open_transport(), trio.open_nursery() as nursery:
        engines = []
        for index in range(spec.engines):
            config = MockEngineConfig(
                host="127.0.0.1",
                port=0,
                api="native",
                page_size=spec.page_size,
                context_length=max(model.context_length, spec.min_context_length),
                speedup=spec.speedup,
                incremental_streaming_output=True,
                kv_events_config=kv_events,
                model_path=model_path,
                seed=index,
                log_level=spec.log_level,
            )
            running = await nursery.start(run_mock_engine, config)
            engines.append((f"engine{index}", running.host, running.port))
        urls = [f"grpc://{host}:{port}" for _, host, port in engines]
        binds = await nursery.start(serve, parse_serve_args(spec.serve_argv(urls), environ={}))
        try:
            yield EmbeddedFleet(binds[0], engines, model.vocab_size, model.special_token_ids)
        finally:
            nursery.cancel_scope.cancel()


def check_serve_argv(argv: Sequence[str]) -> None:
    """Raise ValueError with argparse's message if `trio-direct serve` would reject `argv`."""
    from trio_direct.config import parse_serve_args

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parse_serve_args(argv, environ={})
    except SystemExit as exc:
        message = errors.getvalue().strip().splitlines()
        raise ValueError(message[-1] if message else "invalid frontend settings") from exc
