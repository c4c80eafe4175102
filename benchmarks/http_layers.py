"""What Quart costs per request against trio-direct's own route table, on the same hypercorn.

Both servers answer the same two requests the same way, each in a child process of its own on
hypercorn's trio worker (configured as `trio-direct serve` configures it):

  GET  /v1/models             a fixed JSON body
  POST /v1/chat/completions   a 1.5 KB JSON body read in full, a fixed JSON body back (no engine)

  quart        a QuartTrio app with those two routes and the error handlers the old HTTP layer had
  route-table  `trio_direct.http.app.create_app` over a stub frontend (the rules every route passes:
               route lookup, API key, admission, body limit, disconnect watch, error envelope)

A keep-alive client on raw trio sockets (in this process) sends requests back to back at
concurrency 1 (latency p50) and in parallel at concurrency 16 (throughput), alternating the two
servers in rounds; the server processes' CPU time (/proc/PID/stat) per request is the main figure.

    pip install -e '.[bench]'   # quart-trio, no longer a dependency of trio-direct itself
    python benchmarks/http_layers.py [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import trio

SERVERS = ("quart", "route-table")
_BODY = json.dumps({
    "model": "m",
    "messages": [{"role": "user", "content": "word " * 300}],
    "max_tokens": 16,
}).encode()  # fmt: skip

_CHILD = r"""
import sys, types
import hypercorn.trio, trio
from trio_direct.config import ServeConfig
from trio_direct.http.server import hypercorn_config

MODELS = b'{"object":"list","data":[{"object":"model","id":"m","created":0,"owned_by":"trio-direct"}]}'
ANSWER = b'{"id":"x","object":"chat.completion","choices":[]}'
kind, port = sys.argv[1], int(sys.argv[2])

if kind == "quart":
    from quart import Response, request
    from quart_trio import QuartTrio
    from werkzeug.exceptions import HTTPException

    app = QuartTrio("bench")
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = 32 * 1024 * 1024

    @app.get("/v1/models")
    async def models():
        return Response(MODELS, content_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat():
        await request.get_data()
        return Response(ANSWER, content_type="application/json")

    @app.errorhandler(HTTPException)
    async def http_error(error):
        return Response(b"{}", status=error.code or 500, content_type="application/json")
else:
    from trio_direct.http.app import create_app
    from trio_direct.http.routing_table import HttpRoute, RouteTable

    async def models(exchange):
        await exchange.json(200, MODELS)

    async def chat(exchange):
        assert exchange.body
        await exchange.json(200, ANSWER)

    routes = RouteTable([
        HttpRoute("GET", "/v1/models", models),
        HttpRoute("POST", "/v1/chat/completions", chat, endpoint="chat"),
    ])
    frontend = types.SimpleNamespace()
    app = create_app(lambda: frontend, ServeConfig(), routes=routes)

config = hypercorn_config("127.0.0.1", port, "warning")
trio.run(hypercorn.trio.serve, app, config)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _request(path: str) -> bytes:
    if path == "/v1/models":
        return b"GET /v1/models HTTP/1.1\r\nHost: b\r\n\r\n"
    head = f"POST {path} HTTP/1.1\r\nHost: b\r\ncontent-type: application/json\r\ncontent-length: {len(_BODY)}\r\n\r\n"
    return head.encode() + _BODY


async def _one_connection(port: int, request: bytes, count: int, latencies: list[float]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    buffer = b""
    try:
        for _ in range(count):
            started = time.perf_counter()
            await stream.send_all(request)
            while b"\r\n\r\n" not in buffer:
                buffer += await stream.receive_some(65536)
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:40]
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            latencies.append(time.perf_counter() - started)
    finally:
        await stream.aclose()


async def _measure(port: int, pid: int, path: str, requests: int, concurrency: int) -> dict:
    latencies: list[float] = []
    cpu_before, wall_before = _cpu_seconds(pid), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(_one_connection, port, _request(path), requests // concurrency, latencies)
    wall = time.perf_counter() - wall_before
    cpu = _cpu_seconds(pid) - cpu_before
    return {
        "cpu_us_per_request": cpu / len(latencies) * 1e6,
        "requests_per_s": len(latencies) / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
    }


async def _wait_listening(port: int) -> None:
    with trio.fail_after(120):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.aclose()
                return
            except OSError:
                await trio.sleep(0.1)


async def main(args: argparse.Namespace) -> None:
    children = {}
    try:
        for kind in SERVERS:
            port = _free_port()
            process = subprocess.Popen([sys.executable, "-c", _CHILD, kind, str(port)])
            children[kind] = (process, port)
            await _wait_listening(port)
        results: dict = {}
        for round_ in range(args.rounds):
            for kind in SERVERS if round_ % 2 == 0 else reversed(SERVERS):
                process, port = children[kind]
                for path in ("/v1/models", "/v1/chat/completions"):
                    for concurrency in (1, 16):
                        await _measure(port, process.pid, path, 200, concurrency)  # warm
                        figures = await _measure(port, process.pid, path, args.requests, concurrency)
                        results.setdefault((path, concurrency), {}).setdefault(kind, []).append(figures)
        print(f"{'request':<28} {'c':>3} {'figure':<20} {'quart':>10} {'route-table':>12} {'ratio':>7}")
        for (path, concurrency), by_kind in results.items():
            for figure in ("cpu_us_per_request", "requests_per_s", "p50_ms"):
                quart = statistics.median(r[figure] for r in by_kind["quart"])
                table = statistics.median(r[figure] for r in by_kind["route-table"])
                # CPU time comes in clock ticks (10 ms): a short run can measure none for a server.
                ratio = f"{table / quart:>7.2f}" if quart else f"{'-':>7}"
                print(f"{path:<28} {concurrency:>3} {figure:<20} {quart:>10.1f} {table:>12.1f} {ratio}")
    finally:
        for process, _port in children.values():
            process.terminate()
            process.wait(10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds per server")
    trio.run(main, parser.parse_args())
