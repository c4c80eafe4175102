"""Disaggregated (1 prefill + 1 decode engine) vs aggregated (2 engines) serving on the mock engines.

Both fleets are mock engines at --speedup 1 (real-time polynomial timing), fronted by `trio-direct
serve`, loaded alternately with the same streamed chats (long prompts, 48 output tokens) at a given
concurrency. Reported: TTFT and inter-token latency. On aggregated engines every prefill step
stalls the decoding requests of that engine (the mock, like SGLang by default, runs either a prefill
or a decode batch per step); in the disaggregated fleet the decode engine never prefills.

    python benchmarks/pd_bench.py [--concurrency 1 8] [--requests 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import trio

from loadgen import Children, free_port, run_load, summary_ms, wait_http
from trio_direct.mock import MOCK_MODEL_NAME


def frontend(children: Children, *urls: str) -> int:
    port = free_port()
    children.start(
        [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning", *urls],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_http(port)
    return port


def body(model: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "a long document to read " * 150}],
        "max_tokens": 48,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model = MOCK_MODEL_NAME  # what a mock engine serves unless told otherwise
    with Children() as children:
        bootstrap = str(free_port())
        prefill = children.mock_engine("--role", "prefill", "--disaggregation-bootstrap-port", bootstrap, "--incremental-streaming-output")
        decode = children.mock_engine("--role", "decode", "--incremental-streaming-output")
        aggregated = [children.mock_engine("--incremental-streaming-output") for _ in range(2)]
        targets = {
            "disaggregated 1P+1D": frontend(
                children, "--prefill-engine-url", f"grpc://127.0.0.1:{prefill}", "--engine-url", f"grpc://127.0.0.1:{decode}"
            ),
            "aggregated 2 engines": frontend(children, *(a for p in aggregated for a in ("--engine-url", f"grpc://127.0.0.1:{p}"))),
        }
        for concurrency in args.concurrency:
            ttft: dict[str, list[float]] = {name: [] for name in targets}
            itl: dict[str, list[float]] = {name: [] for name in targets}
            failed = dict.fromkeys(targets, 0)
            for _ in range(args.rounds):
                for name, port in targets.items():
                    samples, _wall = trio.run(
                        lambda: run_load("127.0.0.1", port, body(model), concurrency=concurrency, requests=args.requests // args.rounds)
                    )
                    failed[name] += sum(not s.ok for s in samples)
                    ttft[name] += [s.ttft for s in samples if s.ok and s.ttft is not None]
                    itl[name] += [g for s in samples if s.ok for g in s.gaps]
            for name in targets:
                print(f"c={concurrency:<2} {name:<22} TTFT {summary_ms(ttft[name])}   ITL {summary_ms(itl[name])}   failed {failed[name]}")


if __name__ == "__main__":
    main()
