"""KV-aware routing on the Mooncake conversation trace: trio-direct kv vs round-robin vs smg cache_aware.

Four mock SGLang engines (separate processes, native + SMG API on one port, KV events over ZMQ and
SubscribeKvEvents) serve the same trace slice three times, restarted before each configuration so
every one starts with a cold cache:

* `trio-direct serve --router-mode kv` (KV events from the engines' ZMQ publishers);
* `trio-direct serve --router-mode round-robin`;
* smg 1.13 `--policy cache_aware` over the SMG API (it subscribes to `SubscribeKvEvents`).

The client is `trio-direct bench`'s load generator (open loop, streamed `/v1/completions`), run
in this process so that every configuration also gets the engines' `GetLoad` samples and plots.

Prompts are text by default. smg 1.13 rejects token-id prompts on `/v1/completions` ("prompt: data
did not match any variant of untagged enum StringOrArray"), so the fair comparison sends all three
configurations the same text, built from words that are one token each in the tiny model's
vocabulary: the text of a trace request tokenizes to exactly `input_length` tokens, and equal
`hash_ids` give equal token prefixes, as the bench's token-id prompts do. `--prompt-format
token-ids` sends the bench's own token-id prompts instead (smg's requests then fail, and are
counted as errors).

    python benchmarks/kv_routing_bench.py [--trace FILE] [--limit N --time-scale X --speedup S ...] [--out DIR]

`--kv-variants` adds trio-direct kv configurations with other flags to the same run (the sweep
that chose the defaults: `--kv-variants "--router-preset dynamo" "--router-prefill-load-scale 3"`);
`--rounds N` replays every configuration N times, in alternating order (forwards, then backwards),
and reports each configuration's median over the rounds, so that a machine whose other load drifts
during the run does not favour whichever configuration ran first.

The defaults are the measured run of benchmarks/kv_routing_results.md (about 9 minutes): trace
requests 0-999 at --time-scale 0.5, mocks at --speedup 0.37 (slower than real time, so simulated
steps, not Python, dominate latency; the engines see 5.4x the trace's real-time load, where
round-robin still keeps up), 65536 pages of 16 tokens per engine (the slice's prompts exceed the
fleet's cache, so eviction matters), prompts capped at 16384 tokens and answers at 64.

smg is looked up on PATH, then in ~/.cache/trio-direct-smg-venv (pip install smg==1.13.0 there).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from frontend_bench import find_smg
from loadgen import Children, cpu_seconds, free_port, wait_http

from trio_direct.bench import default_trace_path
from trio_direct.bench.report import results_document, summarize, write_plots
from trio_direct.bench.runner import (
    LOAD_POLL_INTERVAL_S,
    BenchResult,
    HttpError,
    check_client_latency,
    fetch_model,
    run_bench,
)
from trio_direct.bench.trace import BLOCK_SIZE, PromptSynthesizer, TraceRequest, cap_lengths, load_trace
from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.transport import EngineChannel, open_asyncio_loop
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.tokenizer import ModelTokenizer

REPO = Path(__file__).resolve().parent.parent
CONFIGURATIONS = ("trio-direct kv", "trio-direct round-robin", "smg cache_aware")
KV_EVENTS = {
    "publisher": "zmq",
    "endpoint": "tcp://127.0.0.1:0",
    "replay_endpoint": "tcp://127.0.0.1:0",
    "topic": "",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(slots=True, frozen=True)
class EngineSettings:
    """The mock engines' flags: the same for every configuration."""

    count: int
    speedup: float
    page_size: int
    num_blocks: int
    context_length: int

    def argv(self, index: int) -> list[str]:
        return [
            "--page-size", str(self.page_size), "--num-blocks", str(self.num_blocks),
            "--context-length", str(self.context_length), "--speedup", f"{self.speedup:g}",
            "--incremental-streaming-output", "--kv-events-config", json.dumps(KV_EVENTS),
            "--seed", str(index), "--log-level", "warning",
        ]  # fmt: skip


class TextPrompts:
    """Trace prompts as text that the tiny model tokenizes to exactly the trace's token counts.

    Every word is a single vocabulary token with its leading space ("Ġword"), and the byte-level
    pre-tokenizer splits text at those spaces, so a prompt of n words is n tokens and the tokens of a
    shared text prefix are a shared token prefix. Block `h` is 512 words drawn with (`seed`, `h`),
    as `PromptSynthesizer` draws token ids. Duck-types `PromptSynthesizer.prompt` for `run_bench`,
    whose request body carries the prompt as given.
    """

    def __init__(self, tokenizer: ModelTokenizer, *, seed: int = 0) -> None:
        vocab = tokenizer.tokenizer.get_vocab()
        self.population = sorted(
            token[1:]
            for token, token_id in vocab.items()
            if token.startswith("Ġ")
            and token[1:].isascii()
            and token[1:].isalpha()
            and tokenizer.encode(" " + token[1:], add_special_tokens=False) == [token_id]
        )
        if not self.population:
            raise ValueError("the tokenizer has no single-token words")
        self.seed = seed
        self._blocks: dict[int, list[str]] = {}

    def block(self, hash_id: int) -> list[str]:
        words = self._blocks.get(hash_id)
        if words is None:
            rng = random.Random(f"text:{self.seed}:{hash_id}")
            words = self._blocks[hash_id] = [" " + w for w in rng.choices(self.population, k=BLOCK_SIZE)]
        return words

    def prompt(self, request: TraceRequest) -> str:
        words: list[str] = []
        for hash_id in request.hash_ids:
            words += self.block(hash_id)
        if len(words) < request.input_length:
            raise ValueError(f"request {request.index}: hash ids cover fewer than {request.input_length} tokens")
        return "".join(words[: request.input_length])


def start_engines(children: Children, settings: EngineSettings) -> list[tuple[int, int]]:
    """Start the mock engines together; returns (gRPC port, pid) of each once all are ready."""
    processes = [
        children.start(
            [sys.executable, "-m", "trio_direct", "mock-engine", "--port", "0", *settings.argv(i)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(settings.count)
    ]
    return [(json.loads(p.stdout.readline())["port"], p.pid) for p in processes]


def start_trio_direct(
    children: Children, ports: list[int], mode: str, extra: list[str]
) -> tuple[int, int, Path | None]:
    port = free_port()
    urls = [arg for p in ports for arg in ("--engine-url", f"grpc://127.0.0.1:{p}")]
    process = children.start(
        [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning",
         "--router-mode", mode, *extra, *urls],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_http(port)
    wait_http(port, "/v1/models")
    return port, process.pid, None


def start_smg(
    children: Children, smg: str, ports: list[int], model_dir: Path, log_dir: Path
) -> tuple[int, int, Path]:
    """smg with cache_aware over the SMG API; its log goes to a file (info level says when KV events connect)."""
    port = free_port()
    log_path = log_dir / "smg.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with log_path.open("w") as log:
        process = children.start(
            [smg, "launch", "--host", "127.0.0.1", "--port", str(port),
             "--worker-urls", *(f"grpc://127.0.0.1:{p}" for p in ports),
             "--policy", "cache_aware", "--model-path", str(model_dir), "--log-level", "info",
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--shutdown-grace-period-secs", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wait_http(port, "/health")
    wait_http(port, "/v1/models")
    return port, process.pid, log_path


def subscribed_workers(log_path: Path) -> set[str]:
    """Worker URLs whose KV event stream smg reports connected."""
    found = set()
    for line in _ANSI.sub("", log_path.read_text(errors="replace")).splitlines():
        if "KV event stream connected" in line and (match := re.search(r"worker_url=(\S+)", line)):
            found.add(match.group(1))
    return found


async def prime_engines(ports: list[int], counter: itertools.count[int]) -> None:
    """One tiny generation on every engine, straight over gRPC: a fresh page, so a KV event.

    smg's `SubscribeKvEvents` gives up after 2 s without a first message, and the mock sends one only
    when it has an event; each configuration gets the same primes (a few 16-token pages, far below
    the pool) so that caches start equal.
    """
    for port in ports:
        n = next(counter)
        prompt = [3 + (n * 16 + i) % 700 for i in range(16)] + [3 + n % 700]
        channel = EngineChannel("127.0.0.1", port)
        try:
            client = NativeEngineClient(channel, incremental=True)
            request = GenerateInput(
                rid=f"prime-{n}", input_ids=prompt, sampling=SamplingOptions(max_new_tokens=1, ignore_eos=True)
            )
            async with client.generate(request) as chunks:
                async for _ in chunks:
                    pass
        finally:
            channel.close()


async def measure(
    base_url: str,
    engines: list[int],
    requests: list[TraceRequest],
    prompts: TextPrompts | PromptSynthesizer,
    *,
    smg_log: Path | None,
    timeout: float,
) -> tuple[BenchResult, dict[str, Any]]:
    counter = itertools.count()
    async with open_asyncio_loop():
        await prime_engines(engines, counter)
        if smg_log is not None:
            wanted = {f"grpc://127.0.0.1:{p}" for p in engines}
            with trio.move_on_after(60):
                while not wanted <= subscribed_workers(smg_log):
                    await trio.sleep(0.5)
                    await prime_engines(engines, counter)
            missing = wanted - subscribed_workers(smg_log)
            if missing:
                print(f"  warning: smg has no KV event stream from {sorted(missing)}", file=sys.stderr)
        model = await fetch_model(base_url)
        try:
            check = await check_client_latency(base_url, model, prompts=prompts, timeout=30.0)  # type: ignore[arg-type]
        except HttpError as exc:  # e.g. smg refusing token-id prompts: the replay records every failure
            check = {"error": str(exc)}
        result = await run_bench(
            base_url,
            model,
            requests,
            timeout=timeout,
            prompts=prompts,  # type: ignore[arg-type]
            load_targets=[(f"engine{i}", "127.0.0.1", port) for i, port in enumerate(engines)],
        )
    return result, {"client_check": check, "primes": next(counter)}


def _busy_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole box so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


@dataclass(slots=True, frozen=True)
class Configuration:
    """One frontend to measure: its name in the tables, and (trio-direct) its mode and flags."""

    name: str
    mode: str | None = None  # None: smg
    flags: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


def configurations(names: list[str], kv_variants: list[str], flags: list[str]) -> list[Configuration]:
    out = []
    for name in names:
        if name == "smg cache_aware":
            out.append(Configuration(name))
        else:
            out.append(Configuration(name, name.removeprefix("trio-direct "), tuple(flags)))
        if name == "trio-direct kv":
            for variant in kv_variants:
                out.append(Configuration(f"trio-direct kv {variant}", "kv", (*flags, *shlex.split(variant))))
    return out


def run_configuration(
    config: Configuration, settings: EngineSettings, requests: list[TraceRequest],
    prompts: TextPrompts | PromptSynthesizer, *, smg: str | None, model_dir: Path, timeout: float,
) -> tuple[BenchResult, dict[str, Any]]:  # fmt: skip
    """Fresh engines, one frontend, one replay; returns the result and the run's facts (CPU, ...)."""
    with Children() as children, tempfile.TemporaryDirectory() as scratch:
        engines = start_engines(children, settings)
        ports = [port for port, _ in engines]
        if config.mode is None:
            if smg is None:
                raise RuntimeError("smg not found: pip install smg==1.13.0 into ~/.cache/trio-direct-smg-venv")
            port, pid, log_path = start_smg(children, smg, ports, model_dir, Path(scratch))
        else:
            port, pid, log_path = start_trio_direct(children, ports, config.mode, list(config.flags))
        cpu = {"frontend": cpu_seconds(pid), "engines": sum(cpu_seconds(p) for _, p in engines)}
        client, box = time.process_time(), _busy_cpu()
        result, facts = trio.run(
            lambda: measure(f"http://127.0.0.1:{port}", ports, requests, prompts, smg_log=log_path, timeout=timeout)
        )
        busy, total = _busy_cpu()
        if config.mode == "kv":  # did the KV events reach the router's index?
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/routing", timeout=10) as response:
                facts["kv_index"] = json.load(response).get("kv")
        facts["cpu_s"] = {
            "frontend": round(cpu_seconds(pid) - cpu["frontend"], 2),
            "engines": round(sum(cpu_seconds(p) for _, p in engines) - cpu["engines"], 2),
            "client": round(time.process_time() - client, 2),
        }
        facts["box_busy_fraction"] = round((busy - box[0]) / max(total - box[1], 1e-9), 3)
        if log_path is not None:
            facts["smg_kv_streams"] = len(subscribed_workers(log_path))
    return result, facts


def write_configuration(out: Path, result: BenchResult, config: dict[str, Any]) -> list[Path]:
    """results.json and small PNGs.

    The bench's document, slimmed to stay small in the repository: per-request token gaps are left
    out (the summary keeps their percentiles) and engine load keeps one sample a second per engine
    (the plot draws all of them).
    """
    out.mkdir(parents=True, exist_ok=True)
    document = results_document(result, config)
    for record in document["requests"]:
        record.pop("itl_s")
    thin = round(1.0 / LOAD_POLL_INTERVAL_S)
    engines = config["engines"]["count"]
    document["engine_load"] = [s for i, s in enumerate(document["engine_load"]) if i // engines % thin == 0]
    lines = [f" {json.dumps(k)}: {json.dumps(v, indent=1)}" for k, v in document.items() if not isinstance(v, list)]
    lines += [
        f" {json.dumps(k)}: [\n" + ",\n".join("  " + json.dumps(item) for item in v) + "\n ]"
        for k, v in document.items()
        if isinstance(v, list)
    ]
    (out / "results.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
    plots = write_plots(result, out)
    try:  # line plots need few colours: a palette PNG is a third of the size
        from PIL import Image

        for path in plots:
            with Image.open(path) as image:
                small = image.convert("RGB").quantize(colors=16)
            small.save(path, optimize=True)
    except ImportError:
        pass
    return plots


def row(name: str, summary: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    return {
        "configuration": name,
        "completed": summary["completed"],
        "errors": summary["errors"],
        "ttft_p50_ms": summary["ttft_ms"]["p50"],
        "ttft_p99_ms": summary["ttft_ms"]["p99"],
        "e2e_p50_ms": summary["e2e_ms"]["p50"],
        "e2e_p99_ms": summary["e2e_ms"]["p99"],
        "cached_token_ratio": summary["cached_token_ratio"],
        "requests_per_s": summary["requests_per_s"],
        "output_tokens_per_s": summary["output_tokens_per_s"],
        "frontend_cpu_s": facts["cpu_s"]["frontend"],
        "box_busy": facts["box_busy_fraction"],
        "error_kinds": summary["error_kinds"],
    }


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "| configuration | ok | errors | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | E2E p99 ms | cached ratio "
            "| req/s | out tok/s | frontend CPU s | box busy |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['configuration']} | {r['completed']} | {r['errors']} | {_num(r['ttft_p50_ms'])} "
            f"| {_num(r['ttft_p99_ms'])} | {_num(r['e2e_p50_ms'])} | {_num(r['e2e_p99_ms'])} "
            f"| {_num(r['cached_token_ratio'], 3)} | {_num(r['requests_per_s'], 2)} "
            f"| {_num(r['output_tokens_per_s'], 0)} "
            f"| {_num(r['frontend_cpu_s'])} | {_num(100 * r['box_busy'], 0)} % |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """TTFT p50 of round-robin and smg over trio-direct kv's: above 1 means kv is faster."""
    by_name = {r["configuration"]: r for r in rows}
    kv = by_name.get("trio-direct kv")
    out: dict[str, float | None] = {}
    for other, key in (("trio-direct round-robin", "rr_over_kv_ttft_p50"), ("smg cache_aware", "smg_over_kv_ttft_p50")):
        theirs = by_name.get(other)
        if kv and theirs and kv["ttft_p50_ms"] and theirs["ttft_p50_ms"]:
            out[key] = round(theirs["ttft_p50_ms"] / kv["ttft_p50_ms"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smg", help="path of the smg executable")
    parser.add_argument("--trace", type=Path, help="Mooncake JSONL trace (default: the shared conversation trace)")
    parser.add_argument("--start", type=int, default=0, help="first trace request")
    parser.add_argument("--limit", type=int, default=1000, help="trace requests to replay")
    parser.add_argument("--time-scale", type=float, default=0.5, help="arrival time multiplier")
    parser.add_argument(
        "--sample-conversations", type=float, default=1.0,
        help="keep this share of the trace's conversations, all their turns (before --start/--limit)",
    )
    parser.add_argument("--max-input-tokens", type=int, default=16384)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--speedup", type=float, default=0.37, help="mock timing divisor")
    parser.add_argument("--num-blocks", type=int, default=65536, help="KV pages per engine (x 16 tokens)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--prompt-format", choices=("text", "token-ids"), default="text")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout (s)")
    parser.add_argument(
        "--trio-direct-flags", default="", help="extra `trio-direct serve` flags for every trio-direct configuration"
    )
    parser.add_argument("--configs", nargs="+", choices=CONFIGURATIONS, default=list(CONFIGURATIONS))
    parser.add_argument(
        "--kv-variants", nargs="*", default=[], metavar="FLAGS",
        help="more trio-direct kv configurations, each with these extra flags (a quoted string each)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="replays of every configuration (alternating order)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/kv_routing")
    args = parser.parse_args()

    trace = args.trace or default_trace_path()
    if trace is None or not Path(trace).is_file():
        missing = (
            f"trace file {trace} not found"
            if trace
            else "no trace given and the shared Mooncake trace (shared/traces/mooncake_conversation_trace.jsonl "
            "above this checkout) was not found: pass --trace FILE"
        )
        parser.error(missing)
    requests = cap_lengths(
        load_trace(
            trace,
            start=args.start,
            limit=args.limit,
            time_scale=args.time_scale,
            conversation_fraction=args.sample_conversations,
            seed=args.seed,
        ),
        max_input_tokens=args.max_input_tokens,
        max_output_tokens=args.max_output_tokens,
    )
    settings = EngineSettings(
        count=args.engines,
        speedup=args.speedup,
        page_size=args.page_size,
        num_blocks=args.num_blocks,
        context_length=args.max_input_tokens + args.max_output_tokens + args.page_size,
    )
    model_dir = ensure_tiny_model(default_tiny_model_dir())
    tokenizer = ModelTokenizer.from_directory(model_dir)
    if args.prompt_format == "text":
        prompts: TextPrompts | PromptSynthesizer = TextPrompts(tokenizer, seed=args.seed)
    else:
        special = tokenizer.special_token_ids
        prompts = PromptSynthesizer(low=max(special) + 1, high=tokenizer.vocab_size, avoid=special, seed=args.seed)
    smg = find_smg(args.smg)
    span = requests[-1].arrival_s if requests else 0.0
    print(
        f"{len(requests)} requests (trace {args.start}..{args.start + len(requests) - 1}) over {span:.0f} s, "
        f"{args.engines} engines at speedup {args.speedup:g}, {args.num_blocks} x {args.page_size}-token pages each, "
        f"{args.prompt_format} prompts",
        file=sys.stderr,
    )
    plan = configurations(args.configs, args.kv_variants, shlex.split(args.trio_direct_flags))
    by_round: dict[str, list[dict[str, Any]]] = {c.name: [] for c in plan}
    for round_ in range(args.rounds):
        for config in plan if round_ % 2 == 0 else plan[::-1]:
            started = time.monotonic()
            print(f"== {config.name} (round {round_ + 1}/{args.rounds}) ==", file=sys.stderr)
            result, facts = run_configuration(
                config, settings, requests, prompts, smg=smg, model_dir=model_dir, timeout=args.timeout
            )
            summary = summarize(result)
            document = {
                "configuration": config.name,
                "round": round_ + 1,
                "command": " ".join(sys.argv),
                "trace": trace.name,
                "start": args.start,
                "limit": args.limit,
                "time_scale": args.time_scale,
                "sample_conversations": args.sample_conversations,
                "max_input_tokens": args.max_input_tokens,
                "max_output_tokens": args.max_output_tokens,
                "prompt_format": args.prompt_format,
                "seed": args.seed,
                "trio_direct_flags": list(config.flags),
                "engines": {"count": settings.count, "argv": settings.argv(0)},
                **facts,
            }
            slug = config.slug if args.rounds == 1 else f"{config.slug}/round-{round_ + 1}"
            write_configuration(args.out / slug, result, document)
            by_round[config.name].append(row(config.name, summary, facts))
            print(
                f"  {summary['completed']} ok, {summary['errors']} errors, TTFT p50 {summary['ttft_ms']['p50']} ms, "
                f"cached {summary['cached_token_ratio']}, CPU {facts['cpu_s']}, box busy {facts['box_busy_fraction']}, "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    rows = [median_row(by_round[c.name]) for c in plan]
    table = markdown_table(rows)
    summary_ratios = ratios(rows)
    print(table)
    for key, value in summary_ratios.items():
        print(f"{key}: {value}")
    for r in rows:
        for kind, count in r["error_kinds"].items():
            print(f"{r['configuration']}: error x{count}: {kind}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(
        json.dumps(
            {"command": " ".join(sys.argv), "rows": rows, "rounds": by_round, "ratios": summary_ratios}, indent=1
        )
        + "\n"
    )


def median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over its rounds: the median of each figure (the only one for one round)."""
    if len(rounds) == 1:
        return rounds[0]
    out: dict[str, Any] = {"configuration": rounds[0]["configuration"], "rounds": len(rounds)}
    for key, value in rounds[0].items():
        if key in out:
            continue
        if isinstance(value, int | float) or value is None:
            values = sorted(r[key] for r in rounds if r[key] is not None)
            out[key] = statistics.median(values) if values else None
        elif key == "error_kinds":
            merged: dict[str, int] = {}
            for r in rounds:
                for kind, count in r[key].items():
                    merged[kind] = merged.get(kind, 0) + count
            out[key] = merged
    return out


if __name__ == "__main__":
    main()
