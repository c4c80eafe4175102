"""Fleets for the API-surface scenario tests: `trio-direct serve` over two mock engine processes,
aggregated (two engines) or disaggregated (a prefill and a decode engine), answering chosen prompts
with scripted text: a Qwen3-style model that thinks in `<think>` tags and calls tools in Hermes
`<tool_call>` markup (`--reasoning-parser qwen3 --tool-call-parser hermes`)."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio
from support import MockEngineProcess, settled_accounts, start_frontend, start_mock_engine

#: SGLang engines, and vLLM engines (``mock-engine --api vllm``), each aggregated and disaggregated.
MODES = ("aggregated", "disaggregated", "vllm-aggregated", "vllm-disaggregated")

#: The first entry whose `match` is in the rendered prompt answers it.
SCRIPTS = [
    # A long story, resumed where a migrated stream left off: the continuation's prompt holds the
    # tokens already generated, and sampled ones could spell another entry's match ("Count" is one
    # token of the tiny vocabulary); this entry comes first, so it is what a continuation gets.
    {"match": "Tell me a long story", "text": "Once upon a time a mock engine told a story. " * 40, "resumable": True},
    # the second turn of a tool round trip: the tool's result is in the prompt
    {"match": "22C", "text": "It is 22C and sunny in Paris."},
    {
        "match": "weather",
        "text": "<think>The user wants the weather in Paris.</think>Let me check.<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    },
    {"match": "riddle", "text": "<think>Keys but no locks... a piano.</think>A piano."},
    # matches only when the first turn's answer is in the prompt: the conversation was continued
    {"match": "I will remember, Ada.", "text": "Your name is Ada."},
    {"match": "remember it", "text": "I will remember, Ada."},
    {"match": "Count", "text": "one two three STOP four five"},
]


@dataclass(slots=True)
class Fleet:
    base: str
    engines: list[MockEngineProcess]
    #: The model name the engines serve.
    model: str

    @property
    def urls(self) -> list[str]:
        return [engine.url for engine in self.engines]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_fleet(
    nursery: trio.Nursery, tmp_path: Path, mode: str, *frontend_args: str, speedup: str = "inf", api_key: str = ""
) -> Fleet:
    script = tmp_path / "scripts.json"
    script.write_text(json.dumps(SCRIPTS))
    common: tuple[str, ...] = (
        "--speedup",
        speedup,
        "--incremental-streaming-output",
        "--scripted-outputs",
        str(script),
    )
    if mode.startswith("vllm-"):
        common = ("--api", "vllm", *common)
    if mode.endswith("aggregated") and not mode.endswith("disaggregated"):
        engines = [await start_mock_engine(nursery, *common) for _ in range(2)]
        urls = [arg for engine in engines for arg in ("--engine-url", engine.url)]
    else:
        prefill = await start_mock_engine(
            nursery, "--role", "prefill", "--disaggregation-bootstrap-port", str(_free_port()), *common
        )
        decode = await start_mock_engine(nursery, "--role", "decode", *common)
        engines = [prefill, decode]
        urls = ["--prefill-engine-url", prefill.url, "--engine-url", decode.url]
    parsers = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes")
    keys = ("--api-key", api_key) if api_key else ()
    base = await start_frontend(nursery, *urls, *parsers, *keys, *frontend_args)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=headers) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    return Fleet(base, engines, model)


async def settle(fleet: Fleet, timeout: float = 20.0) -> list[dict]:
    """Every engine's accounts once none holds a live request and the Aborts owed have arrived
    (bounded: `support.settled_accounts`)."""
    return await settled_accounts(fleet.urls, timeout)


def generations(account: dict) -> set[str]:
    """The rids of an engine's generations (health checks left out)."""
    return {rid for rid in account["first_output_at"] if not rid.startswith("HEALTH_CHECK")}


def aborted(account: dict) -> list[str]:
    return [rid for rid, _ in account["abort_rpcs"] if not rid.startswith("HEALTH_CHECK")]
