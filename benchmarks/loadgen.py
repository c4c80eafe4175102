"""Shared pieces of the frontend benchmarks: child processes and a lean SSE load client.

The client speaks HTTP/1.1 with h11 over trio sockets (TCP_NODELAY), with one keep-alive connection
per concurrent slot as OpenAI clients do; trio sockets set TCP_NODELAY, so there is no
keep-alive/Nagle floor (peers.md §6.3), and it costs the same for every target.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h11
import trio

REPO = Path(__file__).resolve().parent.parent


@dataclass(slots=True)
class Sample:
    """One streamed request as the client saw it."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    ok: bool = False


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary_ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 0.5) * 1e3:7.2f} ms  p99 {percentile(values, 0.99) * 1e3:7.2f} ms"


class SseConnection:
    """One keep-alive HTTP/1.1 connection (as OpenAI clients keep theirs), reused request after request."""

    def __init__(self, host: str, port: int, headers: list[tuple[str, str]] | None = None) -> None:
        self.host, self.port = host, port
        #: Sent with every request (an API key).
        self.headers = headers or []
        self._stream: trio.SocketStream | None = None
        self._h11: h11.Connection | None = None

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None

    async def request(self, path: str, body: dict) -> Sample:
        """POST `body`, read the SSE stream to [DONE]; times the first and every later content event."""
        sample = Sample()
        start = time.perf_counter()
        last = None

        def on_status(status: int) -> None:
            if status != 200:
                sample.ok = False

        def on_records(records: list[bytes]) -> None:
            nonlocal last
            now = time.perf_counter()
            for record in records:
                data = record.removeprefix(b"data: ")
                if data == b"[DONE]":
                    sample.ok = True
                    continue
                chunk = json.loads(data)
                if chunk.get("usage"):
                    sample.completion_tokens = chunk["usage"]["completion_tokens"]
                choices = chunk.get("choices") or []
                if choices and (choices[0].get("delta", {}).get("content") or choices[0].get("text")):
                    if sample.ttft is None:
                        sample.ttft = now - start
                    else:
                        sample.gaps.append(now - last)
                    last = now

        await self.exchange(path, json.dumps(body).encode(), on_status, on_records)
        return sample

    async def request_whole(self, path: str, body: dict) -> Sample:
        """POST `body` for one JSON answer (a non-streamed completion): ok when it is a 200 with
        choices, its completion tokens, and the time to the whole answer as its `ttft`."""
        sample = Sample()
        start = time.perf_counter()
        status = 0
        answer: list[bytes] = []

        def on_status(code: int) -> None:
            nonlocal status
            status = code

        await self.exchange(path, json.dumps(body).encode(), on_status, answer.extend)
        if status == 200 and answer:
            payload = json.loads(b"\n\n".join(answer))
            sample.ok = bool(payload.get("choices"))
            sample.completion_tokens = (payload.get("usage") or {}).get("completion_tokens", 0)
            sample.ttft = time.perf_counter() - start
        else:
            sample.ok = False
        return sample

    async def exchange(
        self,
        path: str,
        payload: bytes,
        on_status: Callable[[int], None],
        on_records: Callable[[list[bytes]], None],
    ) -> bool:
        """POST `payload` (JSON) and hand each batch of complete SSE records to `on_records` as it
        arrives; False when the server closed the connection before the response ended."""
        if self._stream is None or self._h11.our_state is not h11.IDLE:
            await self.aclose()
            self._stream = await trio.open_tcp_stream(self.host, self.port)
            self._h11 = h11.Connection(h11.CLIENT)
        stream, connection = self._stream, self._h11
        headers = [("Host", self.host), ("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        headers += self.headers
        await stream.send_all(
            connection.send(h11.Request(method="POST", target=path, headers=headers))
            + connection.send(h11.Data(data=payload))
            + connection.send(h11.EndOfMessage())
        )
        pending = b""
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                on_status(event.status_code)
            elif isinstance(event, h11.Data):
                pending += bytes(event.data)
                if b"\n\n" in pending:
                    *records, pending = pending.split(b"\n\n")
                    on_records(records)
            elif isinstance(event, h11.EndOfMessage):
                if pending:  # a body that is not SSE (a whole JSON answer), or an unterminated last record
                    on_records([pending])
                if connection.our_state is h11.DONE and connection.their_state is h11.DONE:
                    connection.start_next_cycle()
                return True
            elif isinstance(event, h11.ConnectionClosed):
                await self.aclose()
                return False


async def run_load(host: str, port: int, body: dict, *, concurrency: int, requests: int) -> tuple[list[Sample], float]:
    """`requests` requests over `concurrency` keep-alive connections; returns the samples and the wall time."""
    samples: list[Sample] = []
    remaining = iter(range(requests))

    async def worker() -> None:
        connection = SseConnection(host, port)
        try:
            for _ in remaining:
                samples.append(await connection.request("/v1/chat/completions", body))
        finally:
            await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return samples, time.perf_counter() - start


def chat_body(model: str, max_tokens: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story about routers."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class Children:
    """Child processes started by a benchmark, all stopped at exit."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen] = []

    def start(self, command: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(command, start_new_session=True, **kwargs)
        self.processes.append(process)
        return process

    def mock_engine(self, *args: str) -> int:
        """A `trio-direct mock-engine` process; returns its gRPC port."""
        process = self.start(
            [sys.executable, "-m", "trio_direct", "mock-engine", "--port", "0", *args],
            stdout=subprocess.PIPE,
            text=True,
        )
        return json.loads(process.stdout.readline())["port"]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(port: int, path: str = "/health", timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"nothing healthy on port {port}{path} after {timeout}s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc): a noise-robust cost measure."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
