"""`trio-direct bench`: replay a request trace against an OpenAI endpoint and report what users saw.

Against a running frontend (`--url`) or an embedded fleet of mock engines behind an in-process
trio-direct (`--mock-engines N`). The workload is the trace given with `--trace PATH`, else a
synthetic multi-turn one, so the command runs in a fresh clone. See docs/bench.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from trio_direct.bench.report import format_summary, summarize, write_report
from trio_direct.bench.runner import (
    PROGRESS_INTERVAL_S,
    BenchResult,
    FleetSpec,
    HttpError,
    check_client_latency,
    check_serve_argv,
    fetch_model,
    open_embedded_fleet,
    run_bench,
)
from trio_direct.bench.trace import (
    DEFAULT_MIN_TOKEN_ID,
    DEFAULT_VOCAB_SIZE,
    PromptSynthesizer,
    TraceRequest,
    cap_lengths,
    load_trace,
    rebase,
    synthetic_multiturn,
)
from trio_direct.routing.policies import routing_policy_names

__all__ = [
    "DEFAULT_OUT",
    "TRACE_NAME",
    "TRACE_URL",
    "bench_main",
    "build_parser",
    "default_trace_path",
    "plan_requests",
]

TRACE_NAME = "mooncake_conversation_trace.jsonl"
#: Where to download the Mooncake conversation trace (Apache-2.0) that `--trace` replays.
TRACE_URL = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl"
#: Default output directory (one subdirectory per run); .gitignore covers it.
DEFAULT_OUT = Path("bench-results")

log = logging.getLogger("trio_direct.bench")


def default_trace_path() -> Path | None:
    """A local copy of the Mooncake trace for the project's own tests and benchmarks
    (`<ancestor>/shared/traces/...` of this file or the working directory), if there is one.

    `trio-direct bench` itself never looks for it: a trace is replayed only when given with `--trace`.
    """
    seen: set[Path] = set()
    for origin in (Path.cwd(), Path(__file__).resolve().parent):
        for ancestor in (origin, *origin.parents):
            if ancestor in seen:
                continue
            seen.add(ancestor)
            candidate = ancestor / "shared" / "traces" / TRACE_NAME
            if candidate.is_file():
                return candidate
    return None


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("must be a finite number >= 0")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be in (0, 1]")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser(prog: str = "trio-direct bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Replay a Mooncake request trace (or a synthetic multi-turn workload) open-loop against "
        "an OpenAI-compatible frontend, streaming /v1/completions with token-id prompts, and write "
        "results.json and plots.",
    )
    target = p.add_argument_group("target: a running frontend (--url), else an embedded fleet")
    target.add_argument("--url", metavar="URL", help="base URL of a running frontend, e.g. http://127.0.0.1:8000")
    target.add_argument("--model", metavar="NAME", help="model to request (default: the first of GET /v1/models)")
    target.add_argument(
        "--mock-engines",
        metavar="N",
        type=_positive_int,
        default=2,
        help="embedded mode: mock engines behind an in-process trio-direct (default %(default)s)",
    )
    target.add_argument(
        "--mock-speedup",
        metavar="S",
        type=_positive_float,
        default=1.0,
        help="embedded mode: mock timing divisor; inf = as fast as the CPU allows (default %(default)s)",
    )
    target.add_argument(
        "--router-mode",
        choices=routing_policy_names(),
        default="round-robin",
        help="embedded mode: the frontend's --router-mode (default %(default)s)",
    )
    target.add_argument(
        "--page-size",
        metavar="TOKENS",
        type=_positive_int,
        default=16,
        help="embedded mode: engines' KV page size (default %(default)s)",
    )

    workload = p.add_argument_group("workload")
    source = workload.add_mutually_exclusive_group()
    source.add_argument(
        "--trace",
        type=Path,
        metavar="PATH",
        help=f"Mooncake JSONL trace to replay, e.g. the conversation trace from {TRACE_URL} "
        "(default: the --synthetic workload)",
    )
    source.add_argument(
        "--synthetic", action="store_true", help="a generated multi-turn workload (the default without --trace)"
    )
    workload.add_argument("--start", metavar="I", type=int, default=0, help="index of the first request (default 0)")
    workload.add_argument("--limit", metavar="N", type=int, help="number of requests to replay (default: all)")
    workload.add_argument(
        "--sample-conversations",
        metavar="FRACTION",
        type=_fraction,
        default=1.0,
        help="keep this share of the trace's conversations, every turn of each (applied before "
        "--start/--limit; drawn with --seed); replays the whole reuse pattern of a long window at a "
        "rate a small fleet sustains (default 1 = all)",
    )
    workload.add_argument(
        "--time-scale",
        metavar="X",
        type=_non_negative_float,
        default=1.0,
        help="multiply arrival times by this; 0.5 = twice as fast, 0 = all at once (default %(default)s)",
    )
    workload.add_argument("--max-input-tokens", metavar="N", type=_positive_int, help="truncate longer prompts")
    workload.add_argument("--max-output-tokens", metavar="N", type=int, help="cap max_tokens of every request")
    workload.add_argument(
        "--conversations",
        metavar="N",
        type=_positive_int,
        default=16,
        help="--synthetic: conversations (default %(default)s)",
    )
    workload.add_argument(
        "--turns", metavar="N", type=_positive_int, default=4, help="--synthetic: turns each (default %(default)s)"
    )
    workload.add_argument(
        "--system-prompts",
        metavar="N",
        type=_positive_int,
        default=2,
        help="--synthetic: shared system prompts (default %(default)s)",
    )
    workload.add_argument(
        "--seed",
        metavar="N",
        type=int,
        default=0,
        help="prompt token seed; change it for a cold cache (default %(default)s)",
    )
    workload.add_argument(
        "--min-token-id",
        metavar="ID",
        type=int,
        default=None,
        help="lowest prompt token id (default: above the embedded model's special ids; "
        f"{DEFAULT_MIN_TOKEN_ID} with --url)",
    )
    workload.add_argument(
        "--vocab-size",
        metavar="N",
        type=int,
        default=None,
        help="prompt token ids stay below this (default: the embedded model's vocabulary; "
        f"{DEFAULT_VOCAB_SIZE} with --url)",
    )

    run = p.add_argument_group("run")
    run.add_argument(
        "--duration",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help="stop after this many seconds, cancelling requests in flight",
    )
    run.add_argument(
        "--concurrency",
        metavar="N",
        type=_positive_int,
        default=None,
        help="at most this many requests in flight; later ones wait (default: unbounded, open loop)",
    )
    run.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        default=600.0,
        help="per-request timeout (default %(default)s)",
    )
    run.add_argument("--out", metavar="DIR", type=Path, help=f"output directory (default: {DEFAULT_OUT}/<date-time>)")
    run.add_argument(
        "--keep-alive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse HTTP connections between requests (default on)",
    )
    run.add_argument(
        "--client-check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first compare TTFT over reused and fresh connections, to catch a client-side latency floor (default on)",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="progress on stderr: one rewritten line on a terminal, else a line every --progress-interval seconds",
    )
    run.add_argument(
        "--progress-interval",
        metavar="SECONDS",
        type=_positive_float,
        default=PROGRESS_INTERVAL_S,
        help="seconds between progress lines when stderr is not a terminal (default %(default)s)",
    )
    return p


def plan_requests(args: argparse.Namespace) -> tuple[list[TraceRequest], str]:
    """The requests to replay and a description of where they came from."""
    if args.trace is None:  # --synthetic, or no workload given: the synthetic one
        requests = synthetic_multiturn(args.conversations, args.turns, args.system_prompts, seed=args.seed)
        end = None if args.limit is None else args.start + args.limit
        requests = rebase(requests[args.start : end], args.time_scale)
        source = (
            f"synthetic: {args.conversations} conversations x {args.turns} turns, {args.system_prompts} system prompts"
        )
    else:
        path = args.trace
        if not path.is_file():
            raise ValueError(
                f"no trace file at {path}; download the Mooncake conversation trace from {TRACE_URL} "
                "and pass its path with --trace, or run the synthetic workload (--synthetic)"
            )
        requests = load_trace(
            path,
            start=args.start,
            limit=args.limit,
            time_scale=args.time_scale,
            conversation_fraction=args.sample_conversations,
            seed=args.seed,
        )
        source = str(path)
        if args.sample_conversations < 1.0:
            source += f" ({args.sample_conversations:g} of the conversations)"
    requests = cap_lengths(requests, max_input_tokens=args.max_input_tokens, max_output_tokens=args.max_output_tokens)
    return requests, source


def bench_main(argv: Sequence[str] | None = None, *, prog: str = "trio-direct bench") -> int:
    """Run `trio-direct bench`; returns the exit status (1 when no request succeeded, 2 for bad usage)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.start < 0 or (args.limit is not None and args.limit < 0):
        parser.error("--start and --limit must not be negative")
    if args.max_output_tokens is not None and args.max_output_tokens < 0:
        parser.error("--max-output-tokens must not be negative")
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    spec = None
    if args.url is None:
        spec = FleetSpec(
            engines=args.mock_engines, speedup=args.mock_speedup, router_mode=args.router_mode, page_size=args.page_size
        )
        try:
            check_serve_argv(spec.serve_argv(["grpc://127.0.0.1:1"]))
        except ValueError as exc:
            parser.error(f"the embedded frontend rejects these settings: {exc}")
    try:
        requests, source = plan_requests(args)
    except (OSError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    out = args.out or DEFAULT_OUT / time.strftime("%Y%m%d-%H%M%S")
    target = args.url or (
        f"embedded: {args.mock_engines} mock engine(s), speedup {args.mock_speedup:g}, {args.router_mode}"
    )
    print(f"bench: {len(requests)} requests from {source}; target {target}", file=sys.stderr)
    try:
        result, config = trio.run(_bench, args, spec, requests)
    except Exception as exc:
        leaves = _leaves(exc)
        if not all(isinstance(leaf, (HttpError, OSError, ValueError)) for leaf in leaves):
            raise
        for leaf in leaves:
            print(f"{prog}: error: {leaf}", file=sys.stderr)
        return 1
    config["source"] = source
    config["target"] = target
    files = write_report(result, out, config)
    print(format_summary(summarize(result)))
    print(f"results: {files.results}")
    for plot in files.plots:
        print(f"plot: {plot}")
    if files.plots_skipped:
        print(f"plots: {files.plots_skipped}", file=sys.stderr)
    return 0 if not result.records or any(r.ok for r in result.records) else 1


def _json_safe(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf"
    return value


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) nursery exception groups."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def _bench(
    args: argparse.Namespace, spec: FleetSpec | None, requests: list[TraceRequest]
) -> tuple[BenchResult, dict[str, Any]]:
    config: dict[str, Any] = {
        key: _json_safe(value) for key, value in vars(args).items() if key not in ("progress", "progress_interval")
    }
    if spec is None:
        prompts = PromptSynthesizer(
            low=DEFAULT_MIN_TOKEN_ID if args.min_token_id is None else args.min_token_id,
            high=DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
            seed=args.seed,
        )
        return await _measure(args, args.url, prompts, requests, config, load_targets=())
    needed = max((r.input_length + r.output_length for r in requests), default=0) + 1
    spec = replace(spec, min_context_length=needed)
    async with open_embedded_fleet(spec) as fleet:
        special = fleet.special_token_ids
        prompts = PromptSynthesizer(
            low=max(special, default=-1) + 1 if args.min_token_id is None else args.min_token_id,
            high=fleet.vocab_size if args.vocab_size is None else args.vocab_size,
            avoid=special,
            seed=args.seed,
        )
        config["embedded_frontend"] = fleet.base_url
        return await _measure(args, fleet.base_url, prompts, requests, config, load_targets=fleet.engines)


async def _measure(
    args: argparse.Namespace,
    base_url: str,
    prompts: PromptSynthesizer,
    requests: list[TraceRequest],
    config: dict[str, Any],
    *,
    load_targets: Sequence[tuple[str, str, int]],
) -> tuple[BenchResult, dict[str, Any]]:
    model = args.model or await fetch_model(base_url)
    config["prompt_token_range"] = [prompts.population[0], prompts.population[-1] + 1]
    if args.client_check:
        check = await check_client_latency(base_url, model, prompts=prompts, timeout=args.timeout)
        config["client_check"] = check
        if check["floor_suspected"]:
            log.warning(
                "reused connections are slower than fresh ones (TTFT p50 %.1f ms vs %.1f ms): a client-side "
                "latency floor; consider --no-keep-alive",
                check["keep_alive_ttft_p50_ms"],
                check["fresh_connection_ttft_p50_ms"],
            )
    result = await run_bench(
        base_url,
        model,
        requests,
        concurrency_limit=args.concurrency,
        timeout=args.timeout,
        progress=args.progress,
        progress_interval=args.progress_interval,
        duration=args.duration,
        prompts=prompts,
        keep_alive=args.keep_alive,
        load_targets=load_targets,
    )
    return result, config
