"""A new user pointing the frontend at engines launched the way SGLang's guides launch them.

The engines report a Hugging Face model id (``--model-path ORG/NAME``); the frontend finds that
model's tokenizer in the Hugging Face cache, else fetches it from an SMG engine, else says in one
line the three ways to give one. Start-up never keeps the port closed, and the errors a user makes
on the command line end `serve` with one line and exit status 2.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import trio
from support import start_frontend

pytestmark = pytest.mark.slow

MODEL_ID = "acme/tiny-chat"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hf_cache(root: Path, tiny_model: Path, model_id: str = MODEL_ID) -> Path:
    """A Hugging Face home as ``huggingface_hub`` lays it out offline: hub/models--ORG--NAME with
    a snapshot and ``refs/main`` naming it."""
    repo = root / "hub" / ("models--" + model_id.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(tiny_model, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return root


@pytest.fixture
def hf_home(tmp_path, tiny_model, monkeypatch) -> Path:
    """HF_HOME with the tiny model cached as acme/tiny-chat; offline, as a host without network is."""
    home = hf_cache(tmp_path / "hf", tiny_model)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chat(base: str) -> str:
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Hello"}], max_tokens=3
    )
    return reply.choices[0].finish_reason


async def test_a_model_id_is_found_in_the_hugging_face_cache(mock_engine_factory, nursery, hf_home, caplog):
    caplog.set_level(logging.INFO, logger="trio_direct")
    engine = await mock_engine_factory(model_path=MODEL_ID, served_model_name=MODEL_ID, api="native")
    assert engine.info.model_path == MODEL_ID  # reported as given, like SGLang
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}")
    assert await trio.to_thread.run_sync(chat, base) in ("stop", "length")
    [line] = [r.getMessage() for r in caplog.records if "tokenizer from" in r.getMessage()]
    assert "Hugging Face cache" in line and str(hf_home) in line


async def test_without_a_cached_copy_the_tokenizer_comes_from_an_smg_engine(
    mock_engine_factory, nursery, hf_home, tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="trio_direct")
    engine = await mock_engine_factory(model_path=MODEL_ID, served_model_name=MODEL_ID, api="smg")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # the frontend's host has no copy
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--engine-api", "smg")
    assert await trio.to_thread.run_sync(chat, base) in ("stop", "length")
    [line] = [r.getMessage() for r in caplog.records if "tokenizer from" in r.getMessage()]
    assert "GetTokenizer" in line


async def test_with_no_source_serve_names_the_three_ways_in_one_line(nursery, tmp_path, tiny_model):
    engine_env = {**os.environ, "HF_HOME": str(hf_cache(tmp_path / "engine-hf", tiny_model)), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", "0", "--api", "native",
               "--model-path", MODEL_ID, "--speedup", "inf"]  # fmt: skip
    process = await nursery.start(
        partial(trio.run_process, command, stdout=subprocess.PIPE, env=engine_env, check=False)
    )
    ready = await process.stdout.receive_some()
    port = int(ready.split(b'"port": ')[1].split(b",")[0])
    frontend_env = {**os.environ, "HF_HOME": str(tmp_path / "nothing"), "HF_HUB_OFFLINE": "1"}
    result = await trio.run_process(
        [sys.executable, "-m", "trio_direct", "serve", "--port", "0", "--engine-url", f"127.0.0.1:{port}"],
        capture_stdout=True, capture_stderr=True, check=False, env=frontend_env,
    )  # fmt: skip
    process.kill()
    stderr = result.stderr.decode()
    assert result.returncode == 1 and "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    for way in ("--model-path", "Hugging Face cache", "GetTokenizer", "native API"):
        assert way in last


async def test_the_port_listens_while_the_engines_are_still_coming_up(nursery, tiny_model):
    port, engine_port = free_port(), free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port),
               "--engine-url", f"127.0.0.1:{engine_port}", "--engine-wait-timeout", "60",
               "--model-path", str(tiny_model)]  # fmt: skip
    await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        with trio.fail_after(30):
            while True:
                try:
                    live = await client.get("/live")
                    break
                except httpx.TransportError:
                    await trio.sleep(0.1)
        assert live.status_code == 200
        assert (await client.get("/health")).status_code == 503
        body = {"model": "any", "messages": [{"role": "user", "content": "Hi"}]}
        refused = await client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 503 and refused.headers["retry-after"]
        # The engine comes up late: requests flow once it joined, without a restart.
        engine = await start_mock_engine_on(nursery, engine_port)
        with trio.fail_after(60):
            while (await client.get("/health")).status_code != 200:
                await trio.sleep(0.2)
        body["model"] = engine
        assert (await client.post("/v1/chat/completions", json={**body, "max_tokens": 2})).status_code == 200


async def start_mock_engine_on(nursery: trio.Nursery, port: int) -> str:
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", str(port), "--speedup", "inf"]
    await nursery.start(partial(trio.run_process, command, stdout=subprocess.DEVNULL, check=False))
    return "trio-direct-mock"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["serve", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["serve", "--port", "eighty"], "invalid int value"),
        (["serve", "--chat-template", "/nonexistent/template.jinja"], "--chat-template /nonexistent/template.jinja"),
        (["serve", "--default-max-tokens", "0"], "--default-max-tokens must be at least 1"),
        (["mock-engine", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["mock-engine", "--scripted-outputs", "/nonexistent.json"], "--scripted-outputs /nonexistent.json"),
        (["mock-engine", "--model-path", "acme/not-cached"], "not in the Hugging Face cache"),
    ],
)
async def test_a_bad_command_line_is_one_line_and_exit_status_2(argv, expected, tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = await trio.run_process(
        [sys.executable, "-m", "trio_direct", *argv], capture_stderr=True, check=False, env=env
    )
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0]


async def test_a_port_in_use_is_one_line_and_exit_status_2_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        commands = (["serve", "--port", str(port)], ["serve", "--workers", "2", "--port", str(port)],
                    ["mock-engine", "--port", str(port)])  # fmt: skip
        for command in commands:
            result = await trio.run_process(
                [sys.executable, "-m", "trio_direct", *command, "--log-level", "warning"],
                capture_stderr=True, capture_stdout=True, check=False,
            )  # fmt: skip
            lines = result.stderr.decode().strip().splitlines()
            assert result.returncode == 2 and len(lines) == 1, lines
            assert str(port) in lines[0] and "in use" in lines[0].lower()
            assert b"ready" not in result.stdout  # no mock engine started


async def test_with_no_engine_yet_models_answer_503_and_the_start_up_line_says_so(nursery, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trio_direct")
    engines = tmp_path / "engines.json"
    engines.write_text("[]")  # engines come later (an operator edits the file)
    base = await start_frontend(nursery, "--engine-file", str(engines), "--engine-wait-timeout", "0.1")
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/live")).status_code == 200
        assert (await client.get("/health")).status_code == 503
        body = {"model": "qwen3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    assert any("no model is served until an engine joins" in r.getMessage() for r in caplog.records)
    assert not any("model(s)  on" in r.getMessage() for r in caplog.records)
