"""Where the frontend's share of time to first token goes, step by step (c=1).

One mock engine process at `--speedup 1` (a real-time prefill, so the frontend sits idle and its
caches go cold between requests, as in `frontend_bench.py`'s latency part) and `trio-direct serve`
in this process, its steps timestamped by wrapping the functions that mark them. Sequential
streamed chats with `max_tokens` 1; prints the median time of each step after the ASGI handler was
entered (the HTTP layer's request runner), and the step's own share. The wrappers add a little time to every step: compare steps, not
absolutes with `frontend_bench.py`.

    python benchmarks/ttft_breakdown.py [--requests 80]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import start_mock_engine  # noqa: E402
from trio_direct.config import ServeConfig  # noqa: E402
from trio_direct.engine.transport import client as transport  # noqa: E402
from trio_direct.engine.transport import wire  # noqa: E402
from trio_direct.core import dispatch, engine_call  # noqa: E402
from trio_direct import service as serve_module  # noqa: E402
from trio_direct.http import app as http_app  # noqa: E402
from trio_direct.http import connection  # noqa: E402
from trio_direct.surfaces import chat  # noqa: E402

STEPS = {
    "body": "request body read",
    "planned": "validated, chat template rendered, tokenized",
    "open_stream": "routed, the engine call opening",
    "engine_write": "request frames handed to the socket",
    "engine_data": "first engine bytes received (the engine's prefill)",
    "parsed": "frames cut and the message put on its stream (receive_data returned)",
    "trio_message": "the reading request task has it",
    "batch": "decoded into chunks (EngineCall.next_batch)",
    "events": "detokenized: the request task has the choice event",
    "client_write": "the first SSE chunk written to the client socket",
}
marks: dict[str, float] = {}


def mark(name: str, after: str | None = None) -> None:
    if name not in marks and (after is None or after in marks):
        marks[name] = time.perf_counter()


def instrument() -> None:
    """Wrap each step's function so that its first call of a request records a timestamp."""

    def wrap_async(owner, attribute: str, before: str | None = None, after: str | None = None, needs=None) -> None:
        original = getattr(owner, attribute)

        async def wrapper(*args, **kwargs):
            if before:
                mark(before, needs)
            result = await original(*args, **kwargs)
            if after:
                mark(after, needs)
            return result

        setattr(owner, attribute, wrapper)

    run = http_app._run

    async def run_marked(*args, **kwargs):
        marks.clear()
        marks["asgi"] = time.perf_counter()
        return await run(*args, **kwargs)

    http_app._run = run_marked
    wrap_async(http_app, "_read_body", after="body")
    wrap_async(chat, "plan_chat", after="planned")
    open_stream = transport.EngineChannel.open_stream

    def open_stream_marked(self, *args, **kwargs):
        mark("open_stream")
        return open_stream(self, *args, **kwargs)

    transport.EngineChannel.open_stream = open_stream_marked
    data_to_send = wire.GrpcConnection.data_to_send

    def data_to_send_marked(self):
        data = data_to_send(self)
        if data:
            mark("engine_write", "open_stream")
        return data

    wire.GrpcConnection.data_to_send = data_to_send_marked
    receive_data = wire.GrpcConnection.receive_data

    def receive_data_marked(self, data):
        first = "engine_write" in marks and "engine_data" not in marks
        if first:
            mark("engine_data")
        events = receive_data(self, data)
        if first:
            mark("parsed")
        return events

    wire.GrpcConnection.receive_data = receive_data_marked
    wrap_async(transport.MessageStream, "__anext__", after="trio_message", needs="engine_data")
    wrap_async(engine_call.EngineCall, "next_batch", after="batch", needs="engine_data")
    wrap_async(dispatch.ChoiceEvents, "__anext__", after="events", needs="engine_data")  # n > 1, PD
    wrap_async(dispatch._OneChoiceEvents, "__anext__", after="events", needs="engine_data")
    write = connection.GuardedConnection._write  # every write to a client socket (os.write or send_all)

    async def write_marked(self, data):
        mark("client_write", "events")
        return await write(self, data)

    connection.GuardedConnection._write = write_marked


async def main(requests: int) -> None:
    instrument()
    async with trio.open_nursery() as nursery:
        engine = await start_mock_engine(nursery, "--incremental-streaming-output", "--served-model-name", "tiny")
        config = ServeConfig(port=0, engine_url=[engine.url], log_level="warning")
        binds = await nursery.start(serve_module.serve, config)
        port = int(binds[0].rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = json.dumps(
            {"model": "tiny", "messages": [{"role": "user", "content": "Tell me a long story about routers."}],
             "max_tokens": 1, "stream": True}
        ).encode()  # fmt: skip
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body) + body
        )
        samples: dict[str, list[float]] = {step: [] for step in STEPS}
        own: list[float] = []
        for index in range(requests + 10):
            await stream.send_all(request)  # not marked: "client_write" needs the request's events
            received = b""
            while b"[DONE]" not in received:
                received += await stream.receive_some(65536)
            await trio.sleep(0.02)
            if index >= 10:  # warm-up
                for step in STEPS:
                    samples[step].append((marks[step] - marks["asgi"]) * 1e3)
                engine = marks["engine_data"] - marks["engine_write"]
                own.append((marks["client_write"] - marks["asgi"] - engine) * 1e3)
        previous = 0.0
        print(f"{'step':14s} {'after entry':>11s} {'own':>7s}")
        for step, meaning in STEPS.items():
            median = statistics.median(samples[step])
            print(f"{step:14s} {median:8.3f} ms {median - previous:+7.3f}  {meaning}")
            previous = median
        print(f"the frontend's own time (entry to write, less the engine's): median {statistics.median(own):.3f} ms")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=80)
    trio.run(main, parser.parse_args().requests)
