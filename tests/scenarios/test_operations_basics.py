"""What an operator expects of a service on day one: an access log, standard process metrics, and a
Grafana dashboard whose every query names a metric the frontend exports."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import trio
from support import start_frontend, wait_until

pytestmark = pytest.mark.slow

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "trio-direct.json"
KV_EVENTS = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "", "format": "map"})


def chat(base: str, request_id: str) -> None:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(
        model="trio-direct-mock",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=3,
        extra_headers={"X-Request-Id": request_id},
    )


async def test_every_request_gets_one_access_log_line(mock_engine_factory, nursery, caplog):
    caplog.set_level(logging.INFO, logger="trio_direct.access")
    engine = await mock_engine_factory()
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}")
    await trio.to_thread.run_sync(chat, base, "order-42")
    async with httpx.AsyncClient(base_url=base) as client:
        await client.get("/v1/models")
        await client.get("/no/such/path")
    # The line is written as the response ends, just after the client has read it.
    await wait_until(lambda: len([r for r in caplog.records if r.name == "trio_direct.access"]) >= 3)
    lines = [r for r in caplog.records if r.name == "trio_direct.access"]
    by_path = {r.access["path"]: r for r in lines}
    generation = by_path["/v1/chat/completions"].access
    assert generation["method"] == "POST" and generation["status"] == 200 and generation["duration_ms"] > 0
    assert generation["request_id"] == "order-42" and generation["model"] == "trio-direct-mock"
    assert generation["engine"] == "e0" and generation["completion_tokens"] == 3 and generation["prompt_tokens"] > 0
    text = by_path["/v1/chat/completions"].getMessage()
    assert text.startswith("POST /v1/chat/completions 200 ") and "request_id=order-42" in text and "engine=e0" in text
    assert by_path["/v1/models"].access["status"] == 200 and by_path["/no/such/path"].access["status"] == 404


async def test_no_access_log_and_json_lines_from_the_command_line(nursery, tiny_model):
    port_line = re.compile(rb"listening on http://127\.0\.0\.1:(\d+)")

    async def run(*flags: str) -> list[str]:
        command = [sys.executable, "-m", "trio_direct", "serve", "--port", "0", "--mock-engines", "1",
                   "--mock-speedup", "inf", *flags]  # fmt: skip
        process = await nursery.start(partial(trio.run_process, command, stderr=subprocess.PIPE, check=False))
        seen = b""
        with trio.fail_after(60):
            while not (match := port_line.search(seen)) or b"OpenAI API" not in seen:
                seen += await process.stderr.receive_some()
        base = f"http://127.0.0.1:{int(match.group(1))}"
        async with httpx.AsyncClient(base_url=base) as client:
            body = {"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        process.terminate()
        with trio.fail_after(30):
            while chunk := await process.stderr.receive_some():
                seen += chunk
        return seen.decode().splitlines()

    json_lines = [json.loads(line) for line in await run("--log-format", "json")]
    access = [line for line in json_lines if line["logger"] == "trio_direct.access"]
    assert len(access) == 1 and access[0]["path"] == "/v1/chat/completions" and access[0]["status"] == 200
    assert access[0]["completion_tokens"] == 2
    quiet = await run("--no-access-log")
    assert not [line for line in quiet if "trio_direct.access" in line]


async def test_metrics_has_process_series_and_every_dashboard_query_exists(aio_loop, nursery):
    from trio_direct.mock.server import MockEngineConfig, run_mock_engine

    engine = await nursery.start(
        run_mock_engine,
        MockEngineConfig(speedup=float("inf"), incremental_streaming_output=True, kv_events_config=KV_EVENTS),
    )
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--router-mode", "kv")
    await trio.to_thread.run_sync(chat, base, "metrics")
    async with httpx.AsyncClient(base_url=base) as client:
        text = (await client.get("/metrics")).text
    assert re.search(r"^process_resident_memory_bytes \d", text, re.M) and "python_info{" in text
    exported = set()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        exported.add(name)
        exported.update(name + suffix for suffix in suffixes.get(kind, ()))
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:trio_direct|process|python)_[a-z_]+)\b", target["expr"])
    }
    assert queried and queried <= exported, sorted(queried - exported)
    assert {"trio_direct_requests_total", "trio_direct_engine_healthy", "trio_direct_kv_events_total"} <= queried
