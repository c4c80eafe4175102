"""The README's commands work as pasted: its shell blocks parse, and its request gets an answer."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block as argv lists: continuation lines joined, comments dropped,
    `&&` chains split."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            commands.append(words[:cut])
            words = words[cut + 1 :]
    return commands


def readme_command(program: str, *, subcommand: str | None = None) -> list[str]:
    """The one README command that runs `program` (its last path component) [with `subcommand`]."""
    found = [
        argv
        for block in readme_blocks("bash")
        for argv in shell_commands(block)
        if Path(argv[0]).name == program and (subcommand is None or argv[1:2] == [subcommand])
    ]
    assert found, f"the README has no {program} {subcommand or ''} command"
    return found[0]


def test_every_bash_block_of_the_readme_parses():
    blocks = readme_blocks("bash")
    assert len(blocks) >= 3  # install and run; the request; real engines
    for block in blocks:
        result = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True, check=False)
        assert result.returncode == 0, f"{result.stderr}\n{block}"


def test_no_inline_command_of_the_readme_is_cut_across_lines():
    prose = FENCE.sub("", README.read_text())
    spans = re.findall(r"`([^`]+)`", prose)
    cut = [span for span in spans if "\n" in span]
    assert not cut, f"inline code split over lines (breaks when pasted): {cut}"


def test_the_readme_starts_with_install_and_run_and_install_and_test():
    first = shell_commands(readme_blocks("bash")[0])
    programs = [Path(argv[0]).name for argv in first]
    assert programs == ["python3", "pip", "trio-direct", "python3", "pip", "pytest"]


def test_the_readme_request_is_sent_to_the_readme_serve_command_port():
    serve = readme_command("trio-direct", subcommand="serve")
    curl = readme_command("curl")
    url = next(word for word in curl[1:] if "/v1/" in word)
    assert urlsplit(f"http://{url}" if "://" not in url else url).port == int(serve[serve.index("--port") + 1])


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def curl_request(argv: list[str]) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body) of a `curl URL -H 'k: v' -d BODY` command."""
    headers: dict[str, str] = {}
    body = b""
    path = None
    words = iter(argv[1:])
    for word in words:
        if word == "-H":
            name, value = next(words).split(":", 1)
            headers[name.strip()] = value.strip()
        elif word in ("-d", "--data"):
            body = next(words).encode()
        elif not word.startswith("-"):
            path = urlsplit(f"http://{word}" if "://" not in word else word).path
    assert path is not None and body, f"not a curl POST with a body: {argv}"
    return path, headers, body


@pytest.mark.slow
async def test_the_readme_request_gets_a_chat_completion_from_the_readme_serve_command(nursery):
    serve = readme_command("trio-direct", subcommand="serve")
    path, headers, body = curl_request(readme_command("curl"))
    port = free_port()
    args = serve[2:]
    args[args.index("--port") + 1] = str(port)  # the README's command, on a free port
    command = [sys.executable, "-m", "trio_direct", "serve", *args]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        with trio.fail_after(60):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await trio.sleep(0.2)
        reply = await client.post(path, headers=headers, content=body)
    process.terminate()
    assert reply.status_code == 200, reply.text
    completion = reply.json()
    assert completion["object"] == "chat.completion" and completion["model"] == "trio-direct-mock"
    assert completion["choices"][0]["message"]["role"] == "assistant"
    assert 0 < completion["usage"]["completion_tokens"] <= 16


def test_every_readme_serve_command_parses_with_the_serve_flags():
    """The real-engine commands cannot run here (no GPU), but every flag they use is one `serve` takes."""
    from trio_direct.config import parse_serve_args

    serves = [
        argv
        for block in readme_blocks("bash")
        for argv in shell_commands(block)
        if Path(argv[0]).name == "trio-direct" and argv[1:2] == ["serve"]
    ]
    assert len(serves) >= 2  # the built-in mocks, and real engines
    for argv in serves:
        parse_serve_args(argv[2:], environ={})
    engines = [argv for argv in serves if "--engine-url" in argv]
    assert engines
    config = parse_serve_args(engines[0][2:], environ={})
    assert config.engine_url and all(url.startswith("grpc://") for url in config.engine_url)
