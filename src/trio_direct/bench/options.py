"""`trio-direct bench`'s options: one `BenchOptions` field per flag (see `trio_direct.options`).

bench reads no environment variables: a benchmark's settings are the command line it was run
with, which its results.json records.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from trio_direct.bench.runner import PROGRESS_INTERVAL_S
from trio_direct.bench.trace import DEFAULT_MIN_TOKEN_ID, DEFAULT_VOCAB_SIZE
from trio_direct.options import option
from trio_direct.routing.policies import routing_policy_names

__all__ = ["DEFAULT_OUT", "DESCRIPTION", "TRACE_NAME", "TRACE_URL", "BenchOptions"]

TRACE_NAME = "mooncake_conversation_trace.jsonl"
#: Where to download the Mooncake conversation trace (Apache-2.0) that `--trace` replays.
TRACE_URL = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl"
#: Default output directory (one subdirectory per run); .gitignore covers it.
DEFAULT_OUT = Path("bench-results")
#: What `trio-direct bench --help` opens with.
DESCRIPTION = (
    "Replay a Mooncake request trace (or a synthetic multi-turn workload) open-loop against an OpenAI-compatible "
    "frontend, streaming /v1/completions with token-id prompts, and write results.json and plots."
)

_TARGET = "target: a running frontend (--url), else an embedded fleet"
_WORKLOAD = "workload"
_RUN = "run"


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


@dataclass(slots=True)
class BenchOptions:
    """Everything `trio-direct bench` takes (see docs/bench.md)."""

    url: str | None = option(
        None, group=_TARGET, metavar="URL", help="base URL of a running frontend, e.g. http://127.0.0.1:8000"
    )
    model: str | None = option(
        None, group=_TARGET, metavar="NAME", help="model to request (default: the first of GET /v1/models)"
    )
    mock_engines: int = option(
        2,
        group=_TARGET,
        metavar="N",
        parse=_positive_int,
        help="embedded mode: mock engines behind an in-process trio-direct (default %(default)s)",
    )
    mock_speedup: float = option(
        1.0,
        group=_TARGET,
        metavar="S",
        parse=_positive_float,
        help="embedded mode: mock timing divisor; inf = as fast as the CPU allows (default %(default)s)",
    )
    router_mode: str = option(
        "round-robin",
        group=_TARGET,
        choices=routing_policy_names,
        help="embedded mode: the frontend's --router-mode (default %(default)s)",
    )
    page_size: int = option(
        16,
        group=_TARGET,
        metavar="TOKENS",
        parse=_positive_int,
        help="embedded mode: engines' KV page size (default %(default)s)",
    )
    trace: Path | None = option(
        None,
        group=_WORKLOAD,
        exclusive=True,
        metavar="PATH",
        help=f"Mooncake JSONL trace to replay, e.g. the conversation trace from {TRACE_URL} "
        "(default: the --synthetic workload)",
    )
    synthetic: bool = option(
        False,
        group=_WORKLOAD,
        exclusive=True,
        help="a generated multi-turn workload (the default without --trace)",
    )
    start: int = option(0, group=_WORKLOAD, metavar="I", help="index of the first request (default 0)")
    limit: int | None = option(None, group=_WORKLOAD, metavar="N", help="number of requests to replay (default: all)")
    sample_conversations: float = option(
        1.0,
        group=_WORKLOAD,
        metavar="FRACTION",
        parse=_fraction,
        help="keep this share of the trace's conversations, every turn of each (applied before "
        "--start/--limit; drawn with --seed); replays the whole reuse pattern of a long window at a "
        "rate a small fleet sustains (default 1 = all)",
    )
    time_scale: float = option(
        1.0,
        group=_WORKLOAD,
        metavar="X",
        parse=_non_negative_float,
        help="multiply arrival times by this; 0.5 = twice as fast, 0 = all at once (default %(default)s)",
    )
    max_input_tokens: int | None = option(
        None, group=_WORKLOAD, metavar="N", parse=_positive_int, help="truncate longer prompts"
    )
    max_output_tokens: int | None = option(None, group=_WORKLOAD, metavar="N", help="cap max_tokens of every request")
    conversations: int = option(
        16,
        group=_WORKLOAD,
        metavar="N",
        parse=_positive_int,
        help="--synthetic: conversations (default %(default)s)",
    )
    turns: int = option(
        4, group=_WORKLOAD, metavar="N", parse=_positive_int, help="--synthetic: turns each (default %(default)s)"
    )
    system_prompts: int = option(
        2,
        group=_WORKLOAD,
        metavar="N",
        parse=_positive_int,
        help="--synthetic: shared system prompts (default %(default)s)",
    )
    seed: int = option(
        0, group=_WORKLOAD, metavar="N", help="prompt token seed; change it for a cold cache (default %(default)s)"
    )
    min_token_id: int | None = option(
        None,
        group=_WORKLOAD,
        metavar="ID",
        help="lowest prompt token id (default: above the embedded model's special ids; "
        f"{DEFAULT_MIN_TOKEN_ID} with --url)",
    )
    vocab_size: int | None = option(
        None,
        group=_WORKLOAD,
        metavar="N",
        help="prompt token ids stay below this (default: the embedded model's vocabulary; "
        f"{DEFAULT_VOCAB_SIZE} with --url)",
    )
    duration: float | None = option(
        None,
        group=_RUN,
        metavar="SECONDS",
        parse=_positive_float,
        help="stop after this many seconds, cancelling requests in flight",
    )
    concurrency: int | None = option(
        None,
        group=_RUN,
        metavar="N",
        parse=_positive_int,
        help="at most this many requests in flight; later ones wait (default: unbounded, open loop)",
    )
    timeout: float = option(
        600.0,
        group=_RUN,
        metavar="SECONDS",
        parse=_positive_float,
        help="per-request timeout (default %(default)s)",
    )
    out: Path | None = option(
        None, group=_RUN, metavar="DIR", help=f"output directory (default: {DEFAULT_OUT}/<date-time>)"
    )
    keep_alive: bool = option(True, group=_RUN, help="reuse HTTP connections between requests (default on)")
    client_check: bool = option(
        True,
        group=_RUN,
        help="first compare TTFT over reused and fresh connections, to catch a client-side latency floor (default on)",
    )
    progress: bool = option(
        True,
        group=_RUN,
        help="progress on stderr: one rewritten line on a terminal, else a line every --progress-interval seconds",
    )
    progress_interval: float = option(
        PROGRESS_INTERVAL_S,
        group=_RUN,
        metavar="SECONDS",
        parse=_positive_float,
        help="seconds between progress lines when stderr is not a terminal (default %(default)s)",
    )

    def problem(self) -> str | None:
        """What no single flag's parser can see: a setting out of range given the others."""
        if self.start < 0 or (self.limit is not None and self.limit < 0):
            return "--start and --limit must not be negative"
        if self.max_output_tokens is not None and self.max_output_tokens < 0:
            return "--max-output-tokens must not be negative"
        return None
