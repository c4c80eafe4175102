"""The `trio-direct` command line as a user runs it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from functools import partial

import httpx
import pytest
import trio
from support import start_mock_engine

pytestmark = pytest.mark.slow


async def wait_healthy(client: httpx.AsyncClient) -> None:
    """Poll `GET /health` until the serve process answers 200 (it may not listen yet)."""
    with trio.fail_after(60):
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.2)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_serve_without_engines_runs_built_in_mocks_and_stops_on_sigterm(nursery):
    port = free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--mock-speedup", "inf"]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["trio-direct-mock"]
        reply = await client.post(
            "/v1/chat/completions",
            json={"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4},
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        assert await process.wait() == 0


async def test_serve_stops_with_one_clear_message_when_no_engine_comes_up():
    port = free_port()
    dead = free_port()
    result = await trio.run_process(
        [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--engine-url", f"127.0.0.1:{dead}",
         "--engine-wait-timeout", "0.5"],
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    last_line = result.stderr.decode().strip().splitlines()[-1]
    assert f"127.0.0.1:{dead}" in last_line and "Traceback" not in result.stderr.decode()


async def test_probe_prints_the_engine_card(nursery):
    engine = await start_mock_engine(nursery, "--page-size", "16", "--dp-size", "2", "--incremental-streaming-output")
    result = await trio.run_process(
        [sys.executable, "-m", "trio_direct", "probe", engine.url], capture_stdout=True, check=False
    )
    assert result.returncode == 0
    [card] = json.loads(result.stdout)  # always one JSON array
    assert (card["api"], card["role"], card["block_size"], card["dp_size"]) == ("native", "aggregated", 16, 2)
    assert card["incremental_streaming"] is True


async def test_sigterm_lets_an_in_flight_stream_finish_then_exits(nursery):
    engine = await start_mock_engine(nursery, "--incremental-streaming-output")  # real-time: ~6 ms a token
    port = free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--engine-url", engine.url]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 150, "stream": True}
        lines = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                lines.append(line)
                if len(lines) == 3:
                    process.send_signal(signal.SIGTERM)  # mid-stream
        assert lines[-2:] == ["", "data: [DONE]"] or "data: [DONE]" in lines
        assert not any('"error"' in line for line in lines)
    with trio.fail_after(10):  # the client's idle keep-alive connection does not hold the drain
        assert await process.wait() == 0


@pytest.mark.parametrize("path", ["/live", "/v1/models"])
async def test_idle_keep_alive_connections_do_not_hold_shutdown(nursery, path):
    port = free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--graceful-shutdown-timeout", "30"]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
        assert (await client.get(path)).status_code == 200  # the connection stays open, idle
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):  # nothing in flight: no reason to wait out the 30 s
            assert await process.wait() == 0


_SERVE_REPORTING_MODULES = """
import atexit, json, sys
from trio_direct.cli import main

def report():
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("asyncio", "trio_asyncio", "grpclib"))
    print("MODULES " + json.dumps(loaded), file=sys.stderr, flush=True)

atexit.register(report)
sys.argv = ["trio-direct", *sys.argv[1:]]
sys.exit(main())
"""


async def test_serve_streams_with_no_asyncio_trio_asyncio_or_grpclib_loaded(nursery):
    """The frontend's engine client is trio alone: after streaming and a SIGTERM, neither
    trio-asyncio nor grpclib (nor asyncio itself) was ever imported by `serve`."""
    engine = await start_mock_engine(nursery, "--incremental-streaming-output", "--speedup", "inf")
    port = free_port()
    command = [sys.executable, "-c", _SERVE_REPORTING_MODULES, "serve", "--port", str(port), "--engine-url", engine.url]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.PIPE))
    stderr = bytearray()

    async def collect() -> None:
        async for data in process.stderr:
            stderr.extend(data)

    nursery.start_soon(collect)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = [line async for line in response.aiter_lines()]
        assert "data: [DONE]" in lines and any(line.startswith("data: {") for line in lines)
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        assert await process.wait() == 0
    await trio.sleep(0.1)
    [report] = [line for line in stderr.decode().splitlines() if line.startswith("MODULES ")]
    assert json.loads(report.removeprefix("MODULES ")) == []
