"""Rough edges a new user hit, each as that user would try it (issue 14)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from support import start_frontend, start_mock_engine

from trio_direct.bench import DEFAULT_OUT, TRACE_URL, bench_main, build_parser
from trio_direct.cli import main
from trio_direct.config import ServeConfig, parse_serve_args
from trio_direct.logs import FORMAT
from trio_direct.mock import MOCK_MODEL_NAME
from trio_direct.options import declared_options

ROOT = Path(__file__).resolve().parents[2]
HELLO = [{"role": "user", "content": "Hello"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_healthy(client: httpx.AsyncClient) -> None:
    with trio.fail_after(60):
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.2)


# --- a mock engine started by hand serves the model name the README asks for ----------------------


@pytest.mark.slow
async def test_a_mock_engine_started_by_hand_serves_the_name_of_the_built_in_mocks(nursery):
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == [MOCK_MODEL_NAME]
        body = {"model": "trio-direct-mock", "messages": HELLO, "max_tokens": 4}
        reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == "trio-direct-mock"


# --- sampling: without a seed choices differ, with one they repeat ---------------------------------


async def chat_texts(client: httpx.AsyncClient, **fields: object) -> list[str]:
    body = {"model": MOCK_MODEL_NAME, "messages": HELLO, "max_tokens": 12, "temperature": 1.0, "ignore_eos": True}
    reply = await client.post("/v1/chat/completions", json=body | fields)
    assert reply.status_code == 200, reply.text
    return [choice["message"]["content"] for choice in reply.json()["choices"]]


async def test_choices_without_a_seed_differ_and_requests_with_a_seed_repeat(nursery):
    base = await start_frontend(nursery, "--mock-speedup", "inf")  # the built-in mocks
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        first, second = await chat_texts(client, n=2)
        assert first != second, "n=2 at temperature 1 sampled the same answer twice"
        assert (await chat_texts(client)) != (await chat_texts(client)), "two unseeded requests answered alike"
        seeded = [await chat_texts(client, n=2, seed=7) for _ in range(3)]  # round-robin: both engines
        assert seeded[0] == seeded[1] == seeded[2]


# --- probe prints one JSON array -------------------------------------------------------------------


@pytest.mark.slow
async def test_probe_of_two_engines_prints_one_json_array_in_order(nursery):
    engines = [await start_mock_engine(nursery, "--page-size", str(size)) for size in (4, 8)]
    result = await trio.run_process(
        [sys.executable, "-m", "trio_direct", "probe", *(e.url for e in engines)], capture_stdout=True, check=False
    )
    assert result.returncode == 0
    cards = json.loads(result.stdout)
    assert [(card["port"], card["block_size"]) for card in cards] == [(engines[0].port, 4), (engines[1].port, 8)]


# --- --version -------------------------------------------------------------------------------------


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("argv", [["--version"], ["serve", "--version"]])
def test_version_prints_the_project_version(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"trio-direct {project_version()}\n"


def test_the_installed_command_prints_its_version():
    result = subprocess.run(
        [sys.executable, "-m", "trio_direct", "--version"], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (0, f"trio-direct {project_version()}\n")


# --- hypercorn -k trio trio_direct.app:app logs like serve ------------------------------------------


def format_pattern(fmt: str) -> re.Pattern[str]:
    """A regex matching the lines `fmt` (a %-style logging format) produces."""
    fields = {
        "asctime": r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}",
        "levelname": r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)",
        "name": r"[\w.]+",
        "request_id": r"[^\]\s]+",
        "message": r".*",
    }
    pattern = re.escape(fmt)
    for name, regex in fields.items():
        pattern = pattern.replace(re.escape(f"%({name})s"), f"(?P<{name}>{regex})")
    return re.compile(pattern)


@pytest.mark.slow
async def test_hypercorn_serving_the_app_logs_in_the_frontend_format_at_the_configured_level(nursery):
    port = free_port()
    env = {**os.environ, "TRIO_DIRECT_LOG_LEVEL": "debug", "TRIO_DIRECT_MOCK_SPEEDUP": "inf"}
    command = [sys.executable, "-m", "hypercorn", "-k", "trio", "trio_direct.app:app", "--bind", f"127.0.0.1:{port}"]
    process = await nursery.start(
        partial(trio.run_process, command, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    )
    stderr = bytearray()
    closed = trio.Event()

    async def read_stderr() -> None:
        async for chunk in process.stderr:
            stderr.extend(chunk)
        closed.set()

    nursery.start_soon(read_stderr)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
        reply = await client.post("/v1/chat/completions", json={"model": MOCK_MODEL_NAME, "messages": HELLO})
        assert reply.status_code == 200, reply.text
    process.send_signal(signal.SIGINT)
    with trio.fail_after(20):
        await closed.wait()  # everything it logged, up to its exit
        await process.wait()
    lines = [line for line in stderr.decode().splitlines() if line.strip()]
    pattern = format_pattern(FORMAT)
    unformatted = [line for line in lines if not pattern.fullmatch(line)]
    assert not unformatted, f"lines not in trio-direct's format: {unformatted[:5]}"
    records = [record for line in lines if (record := pattern.fullmatch(line))]  # all of them, as checked above
    assert any(r["name"] == "trio_direct.frontend.runtime" and "serving model" in r["message"] for r in records)
    request_lines = [r for r in records if r["request_id"] == reply.headers["x-request-id"]]
    assert any(r["levelname"] == "DEBUG" and r["name"].startswith("trio_direct.") for r in request_lines)
    running = [r for r in records if f"Running on http://127.0.0.1:{port}" in r["message"]]
    assert len(running) == 1 and running[0]["name"] == "hypercorn.error", "hypercorn's line, once"
    noise = [r["name"] for r in records if r["levelname"] == "DEBUG" and not r["name"].startswith("trio_direct")]
    assert not noise, f"debug lines of other libraries: {sorted(set(noise))}"


# --- bench works in a fresh clone ------------------------------------------------------------------


def documented_bench_commands() -> list[list[str]]:
    import shlex

    text = (ROOT / "docs" / "bench.md").read_text()
    blocks = re.findall(r"^```\w*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["trio-direct", "bench"]:
                commands.append(words[2:])
    return commands


def test_every_documented_bench_command_parses():
    commands = documented_bench_commands()
    assert len(commands) >= 3
    for argv in commands:
        build_parser().parse_args(argv)  # exits (fails the test) on a flag that does not exist


def test_the_first_documented_bench_command_needs_no_download():
    first = build_parser().parse_args(documented_bench_commands()[0])
    assert first.trace is None and first.url is None


@pytest.mark.slow
def test_the_first_documented_bench_command_runs_in_an_empty_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert bench_main(documented_bench_commands()[0]) == 0
    [run] = (tmp_path / DEFAULT_OUT).iterdir()  # the default output directory, in the working directory
    assert json.loads((run / "results.json").read_text())["summary"]["errors"] == 0


def test_bench_output_is_ignored_by_git(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    written = DEFAULT_OUT / "20260101-000000" / "results.json"
    result = subprocess.run(["git", "check-ignore", "-q", str(written)], cwd=ROOT, capture_output=True, check=False)
    assert result.returncode == 0, f"git would offer {written} for commit"


def test_a_missing_trace_says_where_to_get_one(tmp_path, capsys):
    missing = tmp_path / "conversation_trace.jsonl"
    assert bench_main(["--trace", str(missing), "--url", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and TRACE_URL in err and "--synthetic" in err


def test_bench_without_a_trace_runs_the_synthetic_workload():
    from trio_direct.bench import plan_requests

    requests, source = plan_requests(build_parser().parse_args([]))
    assert source.startswith("synthetic") and requests


def test_bench_prints_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    status = bench_main([
        "--synthetic", "--conversations", "1", "--turns", "3", "--max-output-tokens", "2",  # turns 1 s apart
        "--mock-engines", "1", "--mock-speedup", "inf", "--no-client-check", "--progress-interval", "0.2",
        "--out", str(tmp_path / "out"),
    ])  # fmt: skip
    assert status == 0
    err = capsys.readouterr().err
    progress = [line for line in err.splitlines() if re.fullmatch(r"bench: \d+/3 done, .*", line)]
    assert len(progress) >= 3, err  # a line every 0.2 s over a run of 2 s or more, not only the last
    assert progress[-1].startswith("bench: 3/3 done, 0 in flight, 0 failed")
    assert "\r" not in err and "\x1b" not in err


# --- prefill/decode roles: one rule ----------------------------------------------------------------


async def test_a_prefill_engine_given_with_engine_url_serves_as_prefill(mock_engine_factory, nursery):
    prefill = await mock_engine_factory(role="prefill", incremental_streaming_output=True)
    decode = await mock_engine_factory(role="decode", incremental_streaming_output=True)
    urls = [a for e in (prefill, decode) for a in ("--engine-url", f"grpc://127.0.0.1:{e.port}")]
    base = await start_frontend(nursery, *urls)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body = {"model": (await client.get("/v1/models")).json()["data"][0]["id"], "messages": HELLO, "max_tokens": 3}
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert (await client.get("/debug/routing")).json()["disaggregated"] is True
    legs = [
        [rid for rid in e.engine.accounting.outcomes if not rid.startswith("HEALTH_CHECK")] for e in (prefill, decode)
    ]
    assert legs[0] and legs[0] == legs[1], "the request ran as a prefill leg and a decode leg"


# --- Dynamo's spellings of --host and --port -------------------------------------------------------


def test_http_host_and_http_port_set_host_and_port():
    config = parse_serve_args(["--http-host", "0.0.0.0", "--http-port", "9001"], environ={})
    assert (config.host, config.port) == ("0.0.0.0", 9001)


def test_every_flag_alias_is_in_the_flag_list():
    docs = (ROOT / "docs" / "direct-engines.md").read_text()
    aliases = [alias for declared in declared_options(ServeConfig) for alias in declared.option.aliases]
    missing = [alias for alias in aliases if f"`{alias}`" not in docs]
    assert not missing, f"aliases missing from docs/direct-engines.md: {missing}"
