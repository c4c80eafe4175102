"""A real peer gateway, smg 1.13 (SMG gRPC API), drives the mock engines as if they were SGLang.

smg comes from the `smg_executable` fixture (tests/conftest.py): installed from PyPI into a side
virtualenv on first use, or `$TRIO_DIRECT_SMG`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from functools import partial

import httpx
import pytest
import trio
from support import engine_accounting, start_mock_engine

from trio_direct.mock import MOCK_MODEL_NAME
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.interop]


async def kill(process: trio.Process) -> None:
    process.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_smg(nursery: trio.Nursery, smg: str, *worker_args: str) -> str:
    port = free_port()
    model = ensure_tiny_model(default_tiny_model_dir())
    command = [
        smg, "launch", "--host", "127.0.0.1", "--port", str(port), *worker_args,
        "--model-path", str(model), "--log-level", "warn",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = partial(
        trio.run_process, command, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        deliver_cancel=kill,  # smg takes seconds to honour SIGTERM; the test is done with it
    )  # fmt: skip
    await nursery.start(run)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        with trio.fail_after(60):
            while True:
                try:
                    if (await client.get("/v1/models")).status_code == 200:
                        return base
                except httpx.TransportError:
                    pass
                await trio.sleep(0.25)


async def ask(base: str, *, stream: bool) -> str:
    body = {
        "model": MOCK_MODEL_NAME,  # smg routes by the name its workers serve
        "messages": [{"role": "user", "content": "Hello world, what is the capital of France?"}],
        "max_tokens": 12,
        "ignore_eos": True,
        "stream": stream,
    }
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        if not stream:
            reply = await client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            data = reply.json()
            assert data["choices"][0]["finish_reason"] == "length"
            assert data["usage"]["completion_tokens"] == 12
            return data["choices"][0]["message"]["content"]
        text = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            assert reply.status_code == 200
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"]
                    if choice:
                        text.append(choice[0]["delta"].get("content") or "")
        return "".join(text)


async def test_smg_routes_chat_through_two_mock_engines(aio_loop, nursery, smg_executable):
    engines = [await start_mock_engine(nursery, "--incremental-streaming-output") for _ in range(2)]
    base = await start_smg(
        nursery, smg_executable, "--worker-urls", *(e.url for e in engines), "--policy", "round_robin"
    )
    answers = [await ask(base, stream=False) for _ in range(2)] + [await ask(base, stream=True) for _ in range(2)]
    assert all(answers)
    accounts = [await engine_accounting(e.url) for e in engines]
    chats = [[rid for rid in a["first_output_at"] if not rid.startswith("HEALTH_CHECK")] for a in accounts]
    assert [len(c) for c in chats] == [2, 2], "round robin sent two chats to each engine"
    assert all(a["finished"] == a["started"] and not a["live"] for a in accounts)


async def test_smg_runs_prefill_decode_through_mock_engines(aio_loop, nursery, smg_executable):
    bootstrap_port = free_port()
    prefill = await start_mock_engine(
        nursery,
        "--role",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(bootstrap_port),
        "--incremental-streaming-output",
    )
    decode = await start_mock_engine(nursery, "--role", "decode", "--incremental-streaming-output")
    base = await start_smg(
        nursery, smg_executable, "--pd-disaggregation", "--prefill", prefill.url, str(bootstrap_port),
        "--decode", decode.url, "--policy", "round_robin",
    )  # fmt: skip
    assert await ask(base, stream=False)
    assert await ask(base, stream=True)

    async def settled() -> tuple[dict, dict]:
        return await engine_accounting(prefill.url), await engine_accounting(decode.url)

    accounts: list = []

    async def poll() -> bool:
        accounts[:] = await settled()
        return not accounts[0]["live"] and not accounts[1]["live"]

    with trio.fail_after(10):
        while not await poll():
            await trio.sleep(0.1)
    for account in accounts:  # smg's health probes (HEALTH_CHECK_*) also reach the engines
        chats = [rid for rid in account["first_output_at"] if not rid.startswith("HEALTH_CHECK")]
        assert len(chats) == 2, account
        assert account["failed"] == 0 and account["finished"] == account["started"]
