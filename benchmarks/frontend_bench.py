"""What the frontend costs, and how it compares with smg on the same mock engines.

Part 1, latency added (c=1): two mock engines at --speedup 1 (real-time decode steps). The same
chat prompt is sent (a) straight to an engine over gRPC, (b) through `trio-direct serve` and, when
smg is installed, (c) through smg 1.13, the paths alternated; the difference of TTFT and
inter-token latency from (a) is what a frontend adds. smg, a gateway in Rust, shows how much of
that the machine itself charges for the extra hop.

Part 2, throughput: two mock engines at --speedup inf (as fast as the mock can stream), fronted by
`trio-direct serve` and by smg 1.13 (SMG API, round robin) in the same run; streamed tokens/s at
c=1, 16, 64 and the ratio trio-direct / smg.

    python benchmarks/frontend_bench.py [--smg PATH] [--requests-per-slot 8] [--latency-only] [--baseline PYTHON]

`--baseline` adds a third frontend, another checkout's (`git worktree add ../before REV`, a venv
there with it installed), alternated with this one: before/after figures from one run.

Each latency request streams 32 tokens at the mock's real-time pace (~0.25 s), so
`--latency-requests 300` takes about four minutes.

smg is looked up on PATH, then in ~/.cache/trio-direct-smg-venv (pip install smg==1.13.0 there).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio
from loadgen import Children, chat_body, cpu_seconds, free_port, median, percentile, run_load, summary_ms, wait_http

from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.transport import EngineChannel, open_transport
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer

MODEL_NAME = "tiny"
PROMPT = [{"role": "user", "content": "Tell me a long story about routers."}]


def start_frontend(children: Children, engine_ports: list[int], python: str = sys.executable) -> tuple[int, int]:
    port = free_port()
    urls = [arg for p in engine_ports for arg in ("--engine-url", f"grpc://127.0.0.1:{p}")]
    process = children.start(
        [python, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning", *urls],
        stdout=subprocess.DEVNULL,
    )
    wait_http(port)
    return port, process.pid


def start_smg(children: Children, smg: str, engine_ports: list[int], model_dir: Path) -> tuple[int, int]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = children.start(
        [smg, "launch", "--host", "127.0.0.1", "--port", str(port),
         "--worker-urls", *(f"grpc://127.0.0.1:{p}" for p in engine_ports),
         "--policy", "round_robin", "--model-path", str(model_dir), "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--shutdown-grace-period-secs", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait_http(port, "/health")
    wait_http(port, "/v1/models")
    return port, process.pid


async def direct_latency(port: int, prompt_ids: list[int], requests: int, max_tokens: int) -> tuple[list, list]:
    ttfts, gaps = [], []
    async with open_transport():
        client = NativeEngineClient(EngineChannel("127.0.0.1", port), incremental=True)
        for i in range(requests):
            request = GenerateInput(
                rid=f"direct-{i:08d}", input_ids=prompt_ids, sampling=SamplingOptions(max_new_tokens=max_tokens, ignore_eos=True)
            )
            start = last = time.perf_counter()
            async with client.generate(request) as chunks:
                async for chunk in chunks:
                    now = time.perf_counter()
                    if chunk.token_ids:
                        if last is start:
                            ttfts.append(now - start)
                        else:
                            gaps.append(now - last)
                        last = now
        client.channel.close()
    return ttfts, gaps


def find_smg(given: str | None) -> str | None:
    for candidate in (given, shutil.which("smg"), str(Path.home() / ".cache/trio-direct-smg-venv/bin/smg")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smg", help="path of the smg executable")
    parser.add_argument("--requests-per-slot", type=int, default=8, help="requests per concurrent slot")
    parser.add_argument("--latency-requests", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per measurement")
    parser.add_argument("--latency-only", action="store_true", help="measure the latency added, not throughput")
    parser.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also run the frontend of another checkout, through this interpreter of a venv it is installed in "
        "(before/after figures in one run)",
    )
    args = parser.parse_args()
    model_dir = ensure_tiny_model(default_tiny_model_dir())
    tokenizer = ModelTokenizer.from_directory(model_dir)
    prompt_ids = tokenizer.encode(render_chat(tokenizer, PROMPT), add_special_tokens=False)
    model = MODEL_NAME  # the name the mocks serve (--served-model-name)
    smg = find_smg(args.smg)

    with Children() as children:
        print("== latency added by the frontend (c=1, mock --speedup 1, 32 tokens) ==")
        realtime = [children.mock_engine("--incremental-streaming-output", "--served-model-name", MODEL_NAME) for _ in range(2)]
        frontends = {"trio-direct": start_frontend(children, realtime)[0]}
        if args.baseline:
            frontends["baseline"] = start_frontend(children, realtime, args.baseline)[0]
        if smg:  # the same hop through a gateway in Rust: what this machine charges any frontend
            frontends["smg 1.13"] = start_smg(children, smg, realtime, model_dir)[0]
        ttft: dict[str, list[float]] = {"direct gRPC": [], **{name: [] for name in frontends}}
        itl: dict[str, list[float]] = {name: [] for name in ttft}
        per_round = args.latency_requests // args.rounds
        for _ in range(args.rounds):  # alternate the paths so that all see the same machine noise
            ttfts, gaps = trio.run(direct_latency, realtime[0], prompt_ids, per_round, 32)
            ttft["direct gRPC"] += ttfts
            itl["direct gRPC"] += gaps
            for name, port in frontends.items():
                load = partial(run_load, "127.0.0.1", port, chat_body(model, 32), concurrency=1, requests=per_round)
                samples, _ = trio.run(load)
                ttft[name] += [s.ttft for s in samples if s.ttft is not None]
                itl[name] += [g for s in samples for g in s.gaps]
        for name in ttft:
            print(f"{name:<13} TTFT {summary_ms(ttft[name])}   ITL {summary_ms(itl[name])}")
        for name in frontends:
            added = percentile(ttft[name], 0.5) - percentile(ttft["direct gRPC"], 0.5)
            added_itl = percentile(itl[name], 0.5) - percentile(itl["direct gRPC"], 0.5)
            print(f"added by {name}: TTFT p50 {added * 1e3:+.2f} ms, ITL p50 {added_itl * 1e3:+.2f} ms")
        if args.latency_only:
            return

        print("\n== streamed tokens/s (mock --speedup inf, 2 engines, 64 tokens per request) ==")
        fast = [children.mock_engine("--speedup", "inf", "--incremental-streaming-output", "--served-model-name", MODEL_NAME) for _ in range(2)]
        targets = {"trio-direct": start_frontend(children, fast)}
        if args.baseline:
            targets["baseline"] = start_frontend(children, fast, args.baseline)
        if smg:
            targets["smg 1.13"] = start_smg(children, smg, fast, model_dir)
        else:
            print("(smg not found: no comparison; pip install smg==1.13.0 into ~/.cache/trio-direct-smg-venv)")
        rates: dict[tuple[str, int], list[float]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        for concurrency in (1, 16, 64):
            for name, (port, _pid) in targets.items():  # warm-up
                trio.run(lambda: run_load("127.0.0.1", port, chat_body(model, 64), concurrency=concurrency, requests=concurrency))
            ttfts: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(args.rounds):  # interleaved rounds; the median is reported
                for name, (port, pid) in targets.items():
                    requests = concurrency * args.requests_per_slot
                    cpu_before = cpu_seconds(pid)
                    samples, wall = trio.run(
                        lambda: run_load("127.0.0.1", port, chat_body(model, 64), concurrency=concurrency, requests=requests)
                    )
                    tokens = sum(s.completion_tokens for s in samples if s.ok)
                    cpu.setdefault((name, concurrency), []).append((cpu_seconds(pid) - cpu_before) / max(tokens, 1))
                    ok = [s for s in samples if s.ok]
                    if len(ok) != len(samples):
                        print(f"  {name}: {len(samples) - len(ok)} of {len(samples)} requests failed")
                    rates.setdefault((name, concurrency), []).append(sum(s.completion_tokens for s in ok) / wall)
                    ttfts[name] += [s.ttft for s in ok if s.ttft is not None]
            for name in targets:
                runs = rates[name, concurrency]
                print(
                    f"c={concurrency:<3} {name:<12} {median(runs):9.0f} tok/s (median of {len(runs)}: "
                    f"{', '.join(f'{r:.0f}' for r in runs)})  CPU {median(cpu[name, concurrency]) * 1e6:5.1f} us/token  "
                    f"TTFT {summary_ms(ttfts[name])}"
                )
            for other in ("baseline", "smg 1.13"):
                if other in targets:
                    ratio = median(rates["trio-direct", concurrency]) / median(rates[other, concurrency])
                    print(f"c={concurrency:<3} ratio trio-direct/{other}: {ratio:.2f}")

if __name__ == "__main__":
    main()
