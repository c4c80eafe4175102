"""What a streamed chat costs `trio-direct serve` in Python calls and trio task steps: counts, not time.

Timing figures move by 20-50 % on a shared machine; call counts do not. Two mocks at `--speedup inf`
(or `--speedup 1`, where every token is an engine message and a write of its own); `serve` runs with
a `sitecustomize` that profiles its main thread with cProfile between two SIGUSR1s, around a fixed
load of streamed chats (`--requests` at `--concurrency`, `--tokens` each) after a warm-up. Printed
per request: Python function calls (coroutine resumptions count as calls), trio task steps (one per
`Context.run`), engine messages (protobuf parses); and calls per streamed token.

    python benchmarks/call_counts.py [--requests 256] [--concurrency 32] [--tokens 64] [--speedup inf]
        [--baseline OTHER/src] [--keep-profile DIR]

`--baseline` also counts the trio_direct package under another `src/` directory (say, a checkout of
main), on the same mocks, for before/after counts from one run. The engine messages per request vary
between runs: the mock coalesces the deltas that queue while the frontend is busy. `--keep-profile`
keeps each profile (`DIR/this.prof`, `DIR/baseline.prof`) for `python -m pstats`.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from loadgen import Children, chat_body, free_port, run_load, wait_http

SITECUSTOMIZE = """
import os
_out = os.environ.get("TRIO_DIRECT_BENCH_PROFILE")
if _out:
    import cProfile, signal
    _profile = cProfile.Profile()
    _on = []
    def _toggle(signum, frame):
        if _on:
            _profile.disable()
            _profile.dump_stats(_out)
            _on.clear()
        else:
            _profile.enable()
            _on.append(True)
    signal.signal(signal.SIGUSR1, _toggle)
"""


def count(args: argparse.Namespace, engines: list[int], folder: Path, src: str | None, name: str) -> dict:
    """Profile one `serve` (this checkout's package, or the one under `src`) over the fixed load."""
    stats = folder / f"{name}.prof"
    env = {
        **os.environ,
        "TRIO_DIRECT_BENCH_PROFILE": str(stats),
        "PYTHONPATH": os.pathsep.join(p for p in (str(folder), src, os.environ.get("PYTHONPATH")) if p),
    }
    port = free_port()
    urls = [arg for p in engines for arg in ("--engine-url", f"grpc://127.0.0.1:{p}")]
    with Children() as children:
        process = children.start(
            [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning", *urls],
            stdout=subprocess.DEVNULL,
            env=env,
        )
        wait_http(port)
        wait_http(port, "/v1/models")
        body = chat_body("tiny", args.tokens)
        concurrency = args.concurrency
        trio.run(lambda: run_load("127.0.0.1", port, body, concurrency=concurrency, requests=2 * concurrency))
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        samples, _ = trio.run(
            lambda: run_load("127.0.0.1", port, body, concurrency=concurrency, requests=args.requests)
        )
        process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # the dump is written by now
    if args.keep_profile:
        Path(args.keep_profile).mkdir(parents=True, exist_ok=True)
        shutil.copy(stats, Path(args.keep_profile) / stats.name)
    ok = [s for s in samples if s.ok]
    tokens = sum(s.completion_tokens for s in ok)
    table = pstats.Stats(str(stats)).stats  # type: ignore[attr-defined]
    calls = sum(row[1] for row in table.values())

    def calls_of(name: str) -> int:
        return sum(row[1] for key, row in table.items() if key[2] == name)

    requests = max(len(ok), 1)
    return {
        "requests": len(ok),
        "failed": len(samples) - len(ok),
        "calls per request": calls / requests,
        "task steps per request": calls_of("<method 'run' of '_contextvars.Context' objects>") / requests,
        "engine messages per request": calls_of("<built-in method FromString>") / requests,
        "calls per token": calls / max(tokens, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256, help="streamed chats counted")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per chat")
    parser.add_argument("--speedup", default="inf", help="the mocks' --speedup (1: real time)")
    parser.add_argument("--baseline", metavar="SRC", help="also count the trio_direct package under this src/")
    parser.add_argument("--keep-profile", metavar="DIR", help="keep the cProfile dumps in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Children() as children:
        folder = Path(tmp)
        (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
        engines = [
            children.mock_engine("--speedup", args.speedup, "--incremental-streaming-output", "--log-level", "warning",
                                 "--served-model-name", "tiny")
            for _ in range(2)
        ]  # fmt: skip
        results = {"trio-direct": count(args, engines, folder, None, "this")}
        if args.baseline:
            results["baseline"] = count(args, engines, folder, args.baseline, "baseline")
    print(
        f"{args.requests} streamed chats of {args.tokens} tokens at c={args.concurrency}, mocks --speedup {args.speedup}"
    )
    for name, result in results.items():
        print(f"{name:12s} " + "  ".join(f"{key} {value:,.1f}" for key, value in result.items()))
    if "baseline" in results:
        this, base = results["trio-direct"], results["baseline"]
        print(f"calls per request, this / baseline: {this['calls per request'] / base['calls per request']:.3f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
