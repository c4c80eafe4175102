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
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import trio

from trio_direct.bench.options import DEFAULT_OUT, DESCRIPTION, TRACE_NAME, TRACE_URL, BenchOptions
from trio_direct.bench.report import format_summary, summarize, write_report
from trio_direct.bench.runner import (
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
from trio_direct.options import OneLineErrorParser, add_options, options_from_args

__all__ = [
    "DEFAULT_OUT",
    "TRACE_NAME",
    "TRACE_URL",
    "bench_main",
    "BenchOptions",
    "DESCRIPTION",
    "build_parser",
    "default_trace_path",
    "plan_requests",
    "run_bench_command",
]


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


def build_parser(prog: str = "trio-direct bench") -> argparse.ArgumentParser:
    """bench's parser on its own (the `trio-direct` command line adds the same options under ``bench``)."""
    parser = OneLineErrorParser(prog=prog, description=DESCRIPTION)
    add_options(parser, BenchOptions)
    return parser


def plan_requests(args: BenchOptions | argparse.Namespace) -> tuple[list[TraceRequest], str]:
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
    """Parse `argv` as `trio-direct bench` does and run it (see `run_bench_command`)."""
    options = options_from_args(BenchOptions, build_parser(prog).parse_args(argv))
    return run_bench_command(options, prog=prog)


def run_bench_command(args: BenchOptions, *, prog: str = "trio-direct bench") -> int:
    """Run `trio-direct bench`; returns the exit status (1 when no request succeeded, 2 for bad usage)."""
    problem = args.problem()
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
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
            print(f"{prog}: error: the embedded frontend rejects these settings: {exc}", file=sys.stderr)
            return 2
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
    args: BenchOptions, spec: FleetSpec | None, requests: list[TraceRequest]
) -> tuple[BenchResult, dict[str, Any]]:
    config: dict[str, Any] = {
        key: _json_safe(value) for key, value in asdict(args).items() if key not in ("progress", "progress_interval")
    }
    if args.url is not None:  # a running frontend (no embedded fleet: spec is None)
        prompts = PromptSynthesizer(
            low=DEFAULT_MIN_TOKEN_ID if args.min_token_id is None else args.min_token_id,
            high=DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size,
            seed=args.seed,
        )
        return await _measure(args, args.url, prompts, requests, config, load_targets=())
    assert spec is not None, "bench_main builds the embedded fleet's spec when no --url is given"
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
    args: BenchOptions,
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
