"""trio-direct against smg 1.13 on the same mock engines, in the same run: every figure as a ratio.

On a noisy shared machine an absolute figure says little; a ratio against a gateway in Rust measured
in alternated rounds on the same engines holds (the machine's speed and noise move both). Parts:

  throughput  two mocks at --speedup inf; closed-loop streamed chats (256-token prompts, 64 tokens)
              at c=32 and c=64: CPU-seconds of the frontend process per streamed token, tokens/s
  unary       two mocks at --speedup inf; closed-loop non-streamed chats (the same prompts, 64 tokens,
              one JSON answer each) at c=32: CPU-seconds of the frontend process per request, requests/s
  multiturn   multi-turn chats built from the Mooncake conversation trace (each turn resends the
              whole history as text messages; 8 tokens out): frontend CPU per request
  longprompt  long single-turn prompts (10-40k tokens, lengths from the trace's input lengths in that
              range, or uniform without --trace; no shared history: every prompt differs from its
              first token) on four mocks, 8 tokens out: frontend CPU per request
  latency     two mocks at --speedup 1; c=1 TTFT p50 through each frontend minus direct gRPC
  workers     `trio-direct serve --workers N` against --workers 1, tokens/s at c=64 (N on N cores)
  idle        two mocks, both frontends up with health checks on, nothing sent: CPU % of a core
  aiperf      NVIDIA's aiperf as an independent load generator (c=32 --speedup inf: CPU per token
              and tokens/s; c=1 --speedup 1: TTFT p50), when --aiperf names its executable

    python benchmarks/vs_smg.py --trace PATH [--parts throughput,multiturn,longprompt,latency,workers,idle]
        [--aiperf PATH] [--rounds 3] [--seconds 8] [--smg PATH] [--workers 2] [--json OUT]
        [--baseline OTHER/src]

`--baseline` adds a third target, the trio_direct package under another `src/` directory (say, a
checkout of the previous commit), measured in the same rounds: before and after, same run.

Each point alternates trio-direct and smg in `--rounds` rounds (the order rotates every round) and
reports the median of the per-round values and, for ratios, the per-round spread (min-max). CPU is
utime+stime from /proc (the whole process tree for --workers), read before and after each round.
smg runs with its defaults (round_robin here; its tokenizer caches are off by default), trio-direct
with its defaults (health checks every 5 s). A run of every part takes ~6 minutes on 2 vCPUs.

aiperf (pip install aiperf==0.13.0 into a venv of its own) runs offline with a local tokenizer
directory as long as HF_HUB_OFFLINE is *not* set: in offline mode 0.13 looks the path up as a hub
snapshot and fails. Its server-metrics scraping is turned off (it would charge /metrics to the
frontend).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from frontend_bench import PROMPT, direct_latency, find_smg
from kv_routing_bench import TextPrompts
from loadgen import Children, SseConnection, chat_body, cpu_seconds, free_port, percentile, run_load, wait_http

from trio_direct.bench.trace import BLOCK_SIZE, TraceRequest, conversation_turns, load_trace
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer

PARTS = ("throughput", "unary", "multiturn", "longprompt", "latency", "workers", "idle")
TRIO, SMG, BASELINE = "trio-direct", "smg 1.13", "trio-direct baseline"
#: The model name the mocks serve (explicit: the mock's default name changed between versions).
MODEL = "tiny"
PROMPT_WORDS = 256
OUTPUT_TOKENS = 64


# --- processes ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Target:
    """A frontend under test: where it listens and the process whose tree's CPU is its cost."""

    name: str
    port: int
    pid: int

    def cpu(self) -> float:
        return tree_cpu_seconds(self.pid)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and every live descendant (a --workers supervisor and its children)."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children[int(stat[1])].append(int(entry))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += cpu_seconds(current)
        except OSError:
            continue
        todo += children.get(current, [])
    return total


def start_trio_direct(
    children: Children, engines: list[int], *extra: str, src: Path | None = None, name: str = TRIO
) -> Target:
    """`trio-direct serve` on the engines; `src`: run the trio_direct package found there instead."""
    port = free_port()
    urls = [arg for p in engines for arg in ("--engine-url", f"grpc://127.0.0.1:{p}")]
    env = None if src is None else {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    process = children.start(
        [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning", *urls, *extra],
        stdout=subprocess.DEVNULL,
        env=env,
    )
    wait_http(port)
    wait_http(port, "/v1/models")
    return Target(name if not extra else f"{name} {' '.join(extra)}", port, process.pid)


def frontends(children: Children, args, engines: list[int], smg: str, model_dir: Path) -> list[Target]:
    """trio-direct, the `--baseline` trio-direct when given, and smg: all on the same engines."""
    targets = [start_trio_direct(children, engines)]
    if args.baseline is not None:
        targets.append(start_trio_direct(children, engines, src=args.baseline, name=BASELINE))
    return [*targets, start_smg(children, smg, engines, model_dir)]


def start_smg(children: Children, smg: str, engines: list[int], model_dir: Path) -> Target:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = children.start(
        [smg, "launch", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *(f"grpc://127.0.0.1:{p}" for p in engines),
         "--policy", "round_robin", "--model-path", str(model_dir), "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--shutdown-grace-period-secs", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_http(port, "/health")
    wait_http(port, "/v1/models")
    return Target(SMG, port, process.pid)


def mocks(children: Children, speedup: str, count: int = 2, *extra: str) -> list[int]:
    return [
        children.mock_engine(
            "--speedup", speedup, "--incremental-streaming-output", "--log-level", "warning", "--served-model-name", MODEL,
            *extra,
        )
        for _ in range(count)
    ]  # fmt: skip


# --- load -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Window:
    """One measured round of one target."""

    requests: int = 0
    failed: int = 0
    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    ttfts: list[float] = field(default_factory=list)


async def closed_loop(
    port: int, bodies: Callable[[], dict], concurrency: int, seconds: float, *, whole: bool = False
) -> Window:
    """`concurrency` keep-alive connections sending requests back to back for `seconds`; `whole`:
    the bodies ask for one JSON answer each (non-streamed), not a stream."""
    window = Window()
    deadline = trio.current_time() + seconds

    async def worker() -> None:
        connection = SseConnection("127.0.0.1", port)
        request = connection.request_whole if whole else connection.request
        try:
            while trio.current_time() < deadline:
                sample = await request("/v1/chat/completions", bodies())
                window.requests += 1
                if sample.ok:
                    window.tokens += sample.completion_tokens
                    if sample.ttft is not None:
                        window.ttfts.append(sample.ttft)
                else:
                    window.failed += 1
        finally:
            await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    window.wall = time.perf_counter() - start
    return window


def measured(target: Target, run: Callable[[], Window]) -> Window:
    before = target.cpu()
    window = run()
    window.cpu = target.cpu() - before
    if window.failed:
        print(f"  {target.name}: {window.failed} of {window.requests} requests failed", flush=True)
    return window


def in_turn(targets: Sequence[Target], round_index: int) -> list[Target]:
    """The targets in the order of round `round_index`: rotated one place per round, so that over
    as many rounds as targets each runs once in every position (first after another's load, last)."""
    shift = round_index % len(targets)
    return [*targets[shift:], *targets[:shift]]


def alternate(targets: Sequence[Target], rounds: int, run: Callable[[Target], Window]) -> dict[str, list[Window]]:
    """`rounds` rounds of every target, the order rotated each round (`in_turn`); windows per target."""
    windows: dict[str, list[Window]] = {t.name: [] for t in targets}
    for i in range(rounds):
        for target in in_turn(targets, i):
            windows[target.name].append(measured(target, lambda: run(target)))  # noqa: B023
    return windows


class Prompts:
    """Chat bodies with a fresh 256-word prompt each (words that are one token each in the tiny
    model): every request tokenizes a new prompt, as aiperf's synthetic ones do."""

    def __init__(self, words: TextPrompts, model: str, *, seed: int = 0) -> None:
        self.population = words.population
        self.model = model
        self.rng = random.Random(seed)

    def body(self, max_tokens: int = OUTPUT_TOKENS) -> dict:
        text = " ".join(self.rng.choices(self.population, k=PROMPT_WORDS))
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def whole_body(self) -> dict:
        """The same request for one JSON answer (non-streamed)."""
        body = self.body()
        del body["stream_options"]
        body["stream"] = False
        return body


# --- multi-turn chats from the trace ------------------------------------------------------------------


def conversation_chats(
    requests: Sequence[TraceRequest],
    words: TextPrompts,
    *,
    max_prompt_words: int,
    min_turns: int = 2,
    max_message_chars: int | None = None,
) -> list[list[list[dict[str, str]]]]:
    """Per conversation (in trace order), the message list of each turn (`conversation_turns`).

    Turn j resends turn j-1's messages plus an assistant answer (up to 64 words) and a user message
    of the blocks turn j adds; block 0 is the system prompt. Each block is 512 words that are one
    token each, drawn from its hash id, so equal blocks are equal text. Turns past
    `max_prompt_words` are dropped. `max_message_chars` cuts every message's content to that many
    characters: short chats with the trace's turns, where the cost per request is not tokenizing.
    """
    chats = []
    for turns in conversation_turns(requests, min_turns=min_turns):
        system = "".join(words.block(turns[0].request.hash_ids[0])).lstrip()
        messages = [{"role": "system", "content": system}]
        size, chat = BLOCK_SIZE, []
        for index, turn in enumerate(turns):
            size += len(turn.new_blocks) * BLOCK_SIZE
            if size > max_prompt_words:
                break
            if index:
                length = min(64, max(1, turns[index - 1].request.output_length))
                answer = words.block(-1 - turn.request.index)[:length]
                messages = [*messages, {"role": "assistant", "content": "".join(answer).lstrip()}]
            user = "".join(w for block in turn.new_blocks for w in words.block(block)).lstrip()
            messages = [*messages, {"role": "user", "content": user}]
            chat.append(messages)
        if len(chat) >= min_turns:
            chats.append(chat)
    if max_message_chars is not None:
        cut = max_message_chars
        chats = [[[{**m, "content": m["content"][:cut]} for m in turn] for turn in chat] for chat in chats]
    return chats


async def replay_chats(port: int, model: str, chats: list[list[list[dict]]], concurrency: int) -> Window:
    """Each conversation's turns in order, `concurrency` conversations at a time."""
    window = Window()
    queue = iter(chats)

    async def worker() -> None:
        connection = SseConnection("127.0.0.1", port)
        try:
            for chat in queue:
                for messages in chat:
                    body = {"model": model, "messages": messages, "max_tokens": 8, "ignore_eos": True,
                            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
                    sample = await connection.request("/v1/chat/completions", body)
                    window.requests += 1
                    window.tokens += sample.completion_tokens
                    window.failed += not sample.ok
        finally:
            await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    window.wall = time.perf_counter() - start
    return window


# --- long single-turn prompts -----------------------------------------------------------------------

#: Prompt lengths of the longprompt part, in tokens (the trace's requests in this range, or uniform).
LONG_PROMPT_TOKENS = (10_000, 40_000)
#: The mocks' context for the longprompt part: the tiny model declares 32k, the longest prompt is 40k.
LONG_CONTEXT = 65_536


def long_prompt_lengths(trace: Path | None, count: int, *, limit: int, seed: int = 0) -> list[int]:
    """`count` prompt lengths in `LONG_PROMPT_TOKENS`: the trace's input lengths in that range, in
    trace order and repeated when the trace has fewer; uniform draws when there is no trace."""
    low, high = LONG_PROMPT_TOKENS
    if trace is not None:
        lengths = [r.input_length for r in load_trace(trace, limit=limit) if low <= r.input_length <= high]
        if lengths:
            return [lengths[i % len(lengths)] for i in range(count)]
    rng = random.Random(f"long:{seed}")
    return [rng.randint(low, high) for _ in range(count)]


def long_prompt(words: TextPrompts, index: int, length: int) -> str:
    """A prompt of `length` one-token words, unique from its first words: they spell `index` in base
    len(population), so no two prompts share a prefix past the chat template's header (nor a KV
    block after it, nor a cached segment)."""
    population = words.population
    head = []
    number = index
    for _ in range(3):
        number, digit = divmod(number, len(population))
        head.append(population[digit])
    rng = random.Random(f"long:{index}")
    return " ".join(head + rng.choices(population, k=length - len(head)))


async def replay_prompts(port: int, model: str, prompts: list[str], concurrency: int) -> Window:
    """Each prompt as a one-message chat (8 tokens out), `concurrency` requests at a time."""
    window = Window()
    queue = iter(prompts)

    async def worker() -> None:
        connection = SseConnection("127.0.0.1", port)
        try:
            for text in queue:
                body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8,
                        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
                sample = await connection.request("/v1/chat/completions", body)
                window.requests += 1
                window.tokens += sample.completion_tokens
                window.failed += not sample.ok
        finally:
            await connection.aclose()

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    window.wall = time.perf_counter() - start
    return window


# --- reporting ------------------------------------------------------------------------------------


class Report:
    """Rows of (measure, target, value, smg's value, ratio, per-round spread), printed as they come
    and kept for --json. Every trio-direct target is compared with smg."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def ratio(self, measure: str, unit: str, values: dict[str, list[float]], scale: float = 1.0) -> None:
        base = values[SMG]
        for name, own in values.items():
            if name == SMG:
                continue
            ratios = [a / b for a, b in zip(own, base, strict=True) if b]
            row = {
                "measure": measure,
                "target": name,
                "unit": unit,
                "value": statistics.median(own) * scale,
                SMG: statistics.median(base) * scale,
                "ratio": statistics.median(ratios) if ratios else float("nan"),
                "spread": [min(ratios), max(ratios)] if ratios else [],
                "rounds": [round(r, 3) for r in ratios],
            }
            self.rows.append(row)
            print(
                f"{measure:<42} {name:<20} {row['value']:9.2f} vs {row[SMG]:9.2f} {unit:<6} ratio {row['ratio']:5.2f} "
                f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})",
                flush=True,
            )

    def added(self, measure: str, unit: str, values: dict[str, list[float]], scale: float = 1.0) -> None:
        """A figure where the difference from smg, not the ratio, is the measure (added latency)."""
        base = values[SMG]
        for name, own in values.items():
            if name == SMG:
                continue
            differences = [a - b for a, b in zip(own, base, strict=True)]
            row = {
                "measure": measure,
                "target": name,
                "unit": unit,
                "value": statistics.median(own) * scale,
                SMG: statistics.median(base) * scale,
                "minus smg": statistics.median(differences) * scale,
                "rounds": [round(v * scale, 3) for v in own],
                "smg rounds": [round(v * scale, 3) for v in base],
            }
            self.rows.append(row)
            print(
                f"{measure:<42} {name:<20} {row['value']:9.2f} vs {row[SMG]:9.2f} {unit:<6} "
                f"difference {row['minus smg']:+.2f} (rounds {', '.join(f'{v * scale:+.2f}' for v in own)}; "
                f"smg {', '.join(f'{v * scale:+.2f}' for v in base)})",
                flush=True,
            )

    def value(self, measure: str, unit: str, values: dict[str, float], note: str = "") -> None:
        self.rows.append({"measure": measure, "unit": unit, **values, "note": note})
        shown = "  ".join(f"{name} {value:.3f}" for name, value in values.items())
        print(f"{measure:<42} {shown} {unit} {note}", flush=True)


# --- parts ----------------------------------------------------------------------------------------


def part_throughput(args, report: Report, smg: str, model_dir: Path, prompts: Prompts) -> None:
    print("\n== streamed chats, mock --speedup inf, 256-word prompts, 64 tokens ==", flush=True)
    with Children() as children:
        engines = mocks(children, "inf")
        targets = frontends(children, args, engines, smg, model_dir)
        for concurrency in (32, 64):
            for target in targets:  # warm-up
                trio.run(closed_loop, target.port, prompts.body, concurrency, 2.0)
            windows = alternate(
                targets, args.rounds, lambda t: trio.run(closed_loop, t.port, prompts.body, concurrency, args.seconds)  # noqa: B023
            )
            cpu = {name: [w.cpu / max(w.tokens, 1) for w in ws] for name, ws in windows.items()}
            rate = {name: [w.tokens / w.wall for w in ws] for name, ws in windows.items()}
            report.ratio(f"CPU per streamed token, c={concurrency}", "us", cpu, 1e6)
            report.ratio(f"tokens/s, c={concurrency}", "tok/s", rate)


def part_unary(args, report: Report, smg: str, model_dir: Path, prompts: Prompts) -> None:
    print("\n== non-streamed chats, mock --speedup inf, 256-word prompts, 64 tokens, c=32 ==", flush=True)
    with Children() as children:
        engines = mocks(children, "inf")
        targets = frontends(children, args, engines, smg, model_dir)
        for target in targets:  # warm-up
            trio.run(partial(closed_loop, target.port, prompts.whole_body, 32, 2.0, whole=True))
        windows = alternate(
            targets,
            args.rounds,
            lambda t: trio.run(partial(closed_loop, t.port, prompts.whole_body, 32, args.seconds, whole=True)),
        )
        cpu = {name: [w.cpu / max(w.requests, 1) for w in ws] for name, ws in windows.items()}
        rate = {name: [w.requests / w.wall for w in ws] for name, ws in windows.items()}
        report.ratio("CPU per request, non-streamed chats, c=32", "ms", cpu, 1e3)
        report.ratio("requests/s, non-streamed chats, c=32", "req/s", rate)


def part_multiturn(args, report: Report, smg: str, model_dir: Path, words: TextPrompts) -> None:
    requests = load_trace(args.trace, limit=args.trace_limit)
    chats = conversation_chats(
        requests, words, max_prompt_words=args.max_prompt_words, max_message_chars=args.max_message_chars
    )
    per_round = args.conversations
    needed = per_round * args.rounds
    if len(chats) < needed:
        raise SystemExit(f"the trace's first {args.trace_limit} requests give {len(chats)} conversations; {needed} needed")
    turns = sum(len(c) for c in chats[:needed])
    print(
        f"\n== multi-turn chats from the trace: {per_round} conversations per round, {turns / args.rounds:.0f} "
        f"requests, up to {args.max_prompt_words} prompt tokens"
        + (f", messages cut to {args.max_message_chars} characters" if args.max_message_chars is not None else "")
        + ", 8 tokens out, c=4 ==",
        flush=True,
    )
    model = MODEL
    with Children() as children:
        engines = mocks(children, "inf")
        targets = frontends(children, args, engines, smg, model_dir)
        warm = chats[needed : needed + 2] or chats[:1]
        for target in targets:
            trio.run(replay_chats, target.port, model, warm, 2)
        windows: dict[str, list[Window]] = {t.name: [] for t in targets}
        for i in range(args.rounds):  # every target gets round i's conversations, none twice
            batch = chats[i * per_round : (i + 1) * per_round]
            for target in in_turn(targets, i):
                windows[target.name].append(measured(target, lambda: trio.run(replay_chats, target.port, model, batch, 4)))  # noqa: B023
        cpu = {name: [w.cpu / max(w.requests, 1) for w in ws] for name, ws in windows.items()}
        report.ratio("CPU per request, multi-turn trace chats", "ms", cpu, 1e3)


def part_longprompt(args, report: Report, smg: str, model_dir: Path, words: TextPrompts) -> None:
    per_round = max(1, args.long_requests // args.rounds)
    lengths = long_prompt_lengths(args.trace, per_round * args.rounds, limit=args.long_trace_limit)
    low, high = LONG_PROMPT_TOKENS
    print(
        f"\n== long single-turn prompts ({low // 1000}-{high // 1000}k tokens, mean {statistics.mean(lengths):.0f}, "
        f"{'trace lengths' if args.trace else 'uniform lengths'}; no shared history): {per_round} requests per round, "
        f"{args.long_mocks} mocks, 8 tokens out, c=4 ==",
        flush=True,
    )
    counter = iter(range(10**9))  # every prompt of every target and round is new: no cache hit anywhere
    with Children() as children:
        engines = mocks(children, "inf", args.long_mocks, "--context-length", str(LONG_CONTEXT))
        targets = frontends(children, args, engines, smg, model_dir)
        for target in targets:
            warm = [long_prompt(words, next(counter), low) for _ in range(2)]
            trio.run(replay_prompts, target.port, MODEL, warm, 2)
        windows: dict[str, list[Window]] = {t.name: [] for t in targets}
        for i in range(args.rounds):  # every target gets round i's lengths, as texts of its own
            batch = lengths[i * per_round : (i + 1) * per_round]
            for target in in_turn(targets, i):
                prompts = [long_prompt(words, next(counter), n) for n in batch]  # built before the CPU is read
                windows[target.name].append(measured(target, lambda: trio.run(replay_prompts, target.port, MODEL, prompts, 4)))  # noqa: B023
        cpu = {name: [w.cpu / max(w.requests, 1) for w in ws] for name, ws in windows.items()}
        report.ratio("CPU per request, long single-turn prompts", "ms", cpu, 1e3)


def part_latency(args, report: Report, smg: str, model_dir: Path, tokenizer: ModelTokenizer) -> None:
    print("\n== added TTFT, c=1, mock --speedup 1, 32 tokens ==", flush=True)
    prompt_ids = tokenizer.encode(render_chat(tokenizer, PROMPT), add_special_tokens=False)
    with Children() as children:
        engines = mocks(children, "1")
        targets = frontends(children, args, engines, smg, model_dir)
        added: dict[str, list[float]] = {t.name: [] for t in targets}
        per_round = args.latency_requests
        for i in range(args.rounds):
            direct = trio.run(direct_latency, engines[0], prompt_ids, per_round, 32)[0]
            base = percentile(direct, 0.5)
            for target in in_turn(targets, i):
                body = chat_body(MODEL, 32)
                samples, _ = trio.run(lambda: run_load("127.0.0.1", target.port, body, concurrency=1, requests=per_round))  # noqa: B023
                added[target.name].append(percentile([s.ttft for s in samples if s.ttft is not None], 0.5) - base)
        report.added("added TTFT p50 over direct gRPC, c=1", "ms", added, 1e3)


def part_workers(args, report: Report, prompts: Prompts) -> None:
    n = args.workers
    print(f"\n== --workers {n} against --workers 1, mock --speedup inf, c=64 ({os.cpu_count()} CPUs here) ==", flush=True)
    with Children() as children:
        engines = mocks(children, "inf")
        one = start_trio_direct(children, engines)
        many = start_trio_direct(children, engines, "--workers", str(n))
        for target in (one, many):
            trio.run(closed_loop, target.port, prompts.body, 64, 2.0)
        windows = alternate([one, many], args.rounds, lambda t: trio.run(closed_loop, t.port, prompts.body, 64, args.seconds))
        rate = {name: [w.tokens / w.wall for w in ws] for name, ws in windows.items()}
        ratios = [a / b / n for a, b in zip(rate[many.name], rate[one.name], strict=True)]
        report.value(
            f"tokens/s with --workers {n} / ({n} x --workers 1)",
            "",
            {"ratio": statistics.median(ratios), f"{n} workers tok/s": statistics.median(rate[many.name]),
             "1 worker tok/s": statistics.median(rate[one.name])},
            f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}; the client and the mocks share these CPUs)",
        )


def part_idle(args, report: Report, smg: str, model_dir: Path) -> None:
    print(f"\n== idle: two mocks, health checks on, nothing sent, {args.idle_seconds:g} s ==", flush=True)
    with Children() as children:
        engines = mocks(children, "1")
        targets = frontends(children, args, engines, smg, model_dir)
        time.sleep(5)  # start-up work done (first health checks, connections)
        before = {t.name: t.cpu() for t in targets}
        start = time.monotonic()
        time.sleep(args.idle_seconds)  # both at once: idle processes do not disturb each other
        elapsed = time.monotonic() - start
        share = {t.name: (t.cpu() - before[t.name]) / elapsed * 100 for t in targets}
        tick = 100 / os.sysconf("SC_CLK_TCK") / elapsed
        report.value("idle CPU, two engines, health checks on", "% of a core", share, f"(resolution {tick:.3f} %)")


def part_aiperf(args, report: Report, smg: str, model_dir: Path) -> None:
    """aiperf against each frontend, alternated: c=32 at --speedup inf, c=1 at --speedup 1."""
    model = MODEL
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}

    def profile(target: Target, concurrency: int, requests: int, artifacts: Path) -> dict:
        command = [
            args.aiperf, "profile", "--model", model, "--url", f"http://127.0.0.1:{target.port}",
            "--endpoint-type", "chat", "--streaming", "--concurrency", str(concurrency),
            "--request-count", str(requests),
            "--prompt-input-tokens-mean", str(PROMPT_WORDS), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--tokenizer", str(model_dir), "--use-server-token-count",
            "--no-server-metrics", "--no-gpu-telemetry", "--ui", "none", "--artifact-dir", str(artifacts),
        ]  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            raise SystemExit(f"aiperf failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return json.loads((artifacts / "profile_export_aiperf.json").read_text())

    with tempfile.TemporaryDirectory(prefix="vs-smg-aiperf-") as scratch:
        counter = iter(range(10**6))
        for speedup, concurrency, requests in (("inf", 32, args.aiperf_requests), ("1", 1, args.aiperf_latency_requests)):
            print(f"\n== aiperf 0.13: c={concurrency}, mock --speedup {speedup}, 256-token prompts, 64 tokens ==", flush=True)
            with Children() as children:
                engines = mocks(children, speedup)
                targets = frontends(children, args, engines, smg, model_dir)
                results: dict[str, list[tuple[float, dict]]] = {t.name: [] for t in targets}
                for i in range(args.rounds):
                    for target in in_turn(targets, i):
                        before = target.cpu()
                        export = profile(target, concurrency, requests, Path(scratch) / str(next(counter)))
                        results[target.name].append((target.cpu() - before, export))
            if concurrency > 1:
                cpu = {n: [c / r["total_output_tokens"]["avg"] for c, r in rs] for n, rs in results.items()}
                rate = {n: [r["output_token_throughput"]["avg"] for _, r in rs] for n, rs in results.items()}
                report.ratio(f"aiperf: CPU per token, c={concurrency} (whole run)", "us", cpu, 1e6)
                report.ratio(f"aiperf: tokens/s, c={concurrency}", "tok/s", rate)
            else:
                ttft = {n: [r["time_to_first_token"]["p50"] for _, r in rs] for n, rs in results.items()}
                report.added("aiperf: TTFT p50, c=1", "ms", ttft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="the Mooncake conversation trace (JSONL), for the multiturn part (and the longprompt part's lengths)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--aiperf", help="the aiperf executable: adds the aiperf part")
    parser.add_argument("--smg", help="the smg executable (default: PATH, then ~/.cache/trio-direct-smg-venv)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one throughput round")
    parser.add_argument("--latency-requests", type=int, default=40, help="c=1 requests per path per round")
    parser.add_argument("--conversations", type=int, default=20, help="trace conversations per multiturn round")
    parser.add_argument("--trace-limit", type=int, default=3000, help="trace lines read")
    parser.add_argument("--max-prompt-words", type=int, default=16384, help="longest multi-turn prompt")
    parser.add_argument(
        "--max-message-chars", type=int, help="multiturn: cut each message to this many characters (short chats)"
    )
    parser.add_argument(
        "--long-requests", type=int, default=600, help="longprompt requests per frontend, over all rounds"
    )
    parser.add_argument("--long-mocks", type=int, default=4, help="mock engines of the longprompt part")
    parser.add_argument(
        "--long-trace-limit", type=int, default=12_100, help="trace lines read for the longprompt part's lengths"
    )
    parser.add_argument("--workers", type=int, default=2, help="N of the workers part")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--aiperf-requests", type=int, default=640, help="requests per aiperf c=32 round")
    parser.add_argument("--aiperf-latency-requests", type=int, default=40, help="requests per aiperf c=1 round")
    parser.add_argument(
        "--baseline", type=Path, help="a src/ directory of another trio-direct version: measured too (before/after)"
    )
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS) - {"aiperf"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    if "multiturn" in parts:
        if args.trace is None:
            parser.error("the multiturn part needs --trace PATH (the Mooncake conversation trace JSONL)")
        if not args.trace.is_file():
            parser.error(f"--trace {args.trace}: no such file")
    smg = find_smg(args.smg)
    if smg is None:
        parser.error("smg not found: pip install smg==1.13.0 into ~/.cache/trio-direct-smg-venv or pass --smg")
    if args.aiperf and "aiperf" not in parts:
        parts.append("aiperf")

    model_dir = ensure_tiny_model(default_tiny_model_dir())
    tokenizer = ModelTokenizer.from_directory(model_dir)
    words = TextPrompts(tokenizer)
    prompts = Prompts(words, MODEL)
    report = Report()
    started = time.monotonic()
    for part in parts:
        if part == "throughput":
            part_throughput(args, report, smg, model_dir, prompts)
        elif part == "unary":
            part_unary(args, report, smg, model_dir, prompts)
        elif part == "multiturn":
            part_multiturn(args, report, smg, model_dir, words)
        elif part == "longprompt":
            part_longprompt(args, report, smg, model_dir, words)
        elif part == "latency":
            part_latency(args, report, smg, model_dir, tokenizer)
        elif part == "workers":
            part_workers(args, report, prompts)
        elif part == "idle":
            part_idle(args, report, smg, model_dir)
        elif part == "aiperf":
            if not args.aiperf:
                parser.error("the aiperf part needs --aiperf PATH")
            part_aiperf(args, report, smg, model_dir)
    print(f"\n{len(report.rows)} rows in {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": report.rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1))


if __name__ == "__main__":
    main()
