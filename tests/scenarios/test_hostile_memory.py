"""A request costs memory in proportion to its size: prompts far over the context are refused before
the work that would cost memory (rendering and encoding them whole).

Measured on a real `trio-direct serve` process from /proc: its peak resident size (VmHWM, reset
through /proc/PID/clear_refs before each request) and its resident size afterwards.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from support import start_mock_engine

pytestmark = pytest.mark.slow

MOCK = "trio-direct-mock"
MB = 1024 * 1024
JSON = {"content-type": "application/json"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status(pid: int, field: str) -> int:
    """A size from /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from the current size


async def serve(nursery: trio.Nursery, *, embedding: bool = False) -> tuple[trio.Process, str]:
    """`trio-direct serve` over its built-in mock engines, or over one embedding mock engine."""
    port = free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--mock-speedup", "inf",
               "--log-level", "warning"]  # fmt: skip
    if embedding:
        engine = await start_mock_engine(nursery, "--is-embedding", "--speedup", "inf")
        command += ["--engine-url", engine.url]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        with trio.fail_after(60):
            while True:
                try:
                    if (await client.get("/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await trio.sleep(0.2)
        for _ in range(3):  # warm: the first requests load what every later one uses
            assert (await served(client, embedding)).status_code == 200
    return process, base


async def served(client: httpx.AsyncClient, embedding: bool) -> httpx.Response:
    """A small request the server must answer (the warm-up, and proof that it serves on)."""
    if embedding:
        return await client.post("/v1/embeddings", json={"model": MOCK, "input": "Hello"})
    body = {"model": MOCK, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    return await client.post("/v1/chat/completions", json=body)


def chat_with(content: str) -> bytes:
    return json.dumps({"model": MOCK, "messages": [{"role": "user", "content": content}], "max_tokens": 4}).encode()


def body(**fields: object) -> bytes:
    return json.dumps({"model": MOCK, **fields}).encode()


TWENTY_MB = "lorem ipsum " * (20 * MB // 12)  # 20 MB in one prompt string, under the 32 MiB body limit
#: one-character words, a token each: too short for the length bound to decide (the tiny model's
#: longest token bounds it at ~31k of its 32k context), so the chunked count must
ONE_CHAR_WORDS = "x " * 400_000

#: name -> (route, body, served by an embedding model)
CASES = {
    "a 20 MB chat message": ("/v1/chat/completions", lambda: chat_with(TWENTY_MB), False),
    "a 20 MB completion prompt": ("/v1/completions", lambda: body(prompt="dolor sit " * (2 * MB)), False),
    # a million-ish messages, each tiny
    "900,000 messages": (
        "/v1/chat/completions",
        lambda: body(messages=[{"role": "user", "content": ""}] * 900_000, max_tokens=4),
        False,
    ),
    "800,000 characters of one-character words": ("/v1/chat/completions", lambda: chat_with(ONE_CHAR_WORDS), False),
    "a 20 MB /generate text": ("/generate", lambda: body(text=TWENTY_MB), False),
    "a /generate batch holding a 20 MB text": ("/generate", lambda: body(text=["Hi", TWENTY_MB]), False),
    "/generate: 800,000 characters of one-character words": ("/generate", lambda: body(text=ONE_CHAR_WORDS), False),
    "a 20 MB /tokenize prompt": ("/tokenize", lambda: body(prompt=TWENTY_MB), False),
    "/tokenize: 800,000 characters of one-character words": (
        "/v1/tokenize",
        lambda: body(prompt=ONE_CHAR_WORDS),
        False,
    ),
    "a 20 MB /tokenize chat message": (
        "/v1/tokenize",
        lambda: body(messages=[{"role": "user", "content": TWENTY_MB}]),
        False,
    ),
    "a 20 MB embeddings input": ("/v1/embeddings", lambda: body(input=TWENTY_MB), True),
    "embeddings: 800,000 characters of one-character words": (
        "/v1/embeddings",
        lambda: body(input=["Hi", ONE_CHAR_WORDS]),
        True,
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
async def test_a_prompt_far_over_the_context_is_refused_at_a_small_cost(nursery, kind):
    path, make_body, embedding = CASES[kind]
    process, base = await serve(nursery, embedding=embedding)
    content = make_body()
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        before = status(process.pid, "VmRSS")
        reset_peak(process.pid)
        started = time.monotonic()
        reply = await client.post(path, content=content, headers={"content-type": "application/json"})
        elapsed = time.monotonic() - started
        peak = status(process.pid, "VmHWM")
        grew = peak - before
        print(f"{kind} ({path}): refused in {elapsed:.2f}s, peak grew {grew / MB:.0f} MB")
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        if kind == "900,000 messages":  # past --max-messages (10,000), refused before it is decoded
            assert error["code"] == "too_many_messages"
        else:
            assert error["code"] == "context_length_exceeded" and "maximum context length" in error["message"]
        # Proportional to the body: the JSON decoded once (a big string, or one small object per
        # message); rendering and encoding the whole prompt would cost gigabytes (it did: 4.3 GB for
        # a 20 MB chat message in 26 s, 3.6 GB for a 20 MB /generate text in 15 s, 4.4 GB for a
        # million messages in 19 s).
        assert grew < 16 * len(content) + 64 * MB, f"peak grew {grew / MB:.0f} MB for a {len(content) / MB:.0f} MB body"
        if "messages" not in kind:  # one long string: well under 200 MB
            assert grew < 200 * MB, f"peak grew {grew / MB:.0f} MB"
        assert elapsed < 5, f"{elapsed:.1f}s to refuse"  # well under a second on the development VM
        await trio.sleep(0.5)
        after = status(process.pid, "VmRSS")
        assert after - before < 64 * MB, f"{(after - before) / MB:.0f} MB still held"
        assert (await served(client, embedding)).status_code == 200  # and the server serves on
    process.terminate()


async def test_four_hostile_prompts_at_once_cost_their_size_and_the_server_stays_responsive(nursery):
    """Four 20 MB chat messages sent together (they once peaked at 15.7 GB and stalled the event loop
    for 1.8 s): each is refused, the peak stays proportional to the four bodies, and `/live` keeps
    answering while they are read and refused."""
    process, base = await serve(nursery)
    content = chat_with(TWENTY_MB)
    replies: list[httpx.Response] = []
    slowest = 0.0
    async with (
        httpx.AsyncClient(base_url=base, timeout=60) as client,
        httpx.AsyncClient(base_url=base, timeout=60) as probe,
    ):
        before = status(process.pid, "VmRSS")
        reset_peak(process.pid)

        async def hostile() -> None:
            replies.append(await client.post("/v1/chat/completions", content=content, headers=JSON))

        async with trio.open_nursery() as senders:
            for _ in range(4):
                senders.start_soon(hostile)
            while len(replies) < 4:
                started = time.monotonic()
                assert (await probe.get("/live")).status_code == 200
                slowest = max(slowest, time.monotonic() - started)
                await trio.sleep(0.02)
        grew = status(process.pid, "VmHWM") - before
        print(f"four 20 MB prompts: peak grew {grew / MB:.0f} MB; slowest /live {slowest * 1e3:.0f} ms")
        assert [reply.status_code for reply in replies] == [400] * 4
        assert all(reply.json()["error"]["code"] == "context_length_exceeded" for reply in replies)
        assert grew < 4 * 200 * MB, f"peak grew {grew / MB:.0f} MB"
        assert slowest < 1.0, f"/live took {slowest:.2f}s while the prompts were refused"
        await trio.sleep(0.5)
        assert status(process.pid, "VmRSS") - before < 128 * MB
        assert (await served(client, False)).status_code == 200
    process.terminate()
