"""How fast the mock engine streams tokens at --speedup inf (engine in its own process).

A trio client (the project's own native-API adapter) runs `concurrency` streamed generations at a
time against one `trio-direct mock-engine --speedup inf` process and counts the tokens received; it
prints tokens/s and the p50/p99 time to first token and between messages. The engine's own CPU per
token is printed too (from /proc), which holds still when the machine is noisy.

    python benchmarks/mock_engine_bench.py [--concurrency 1 16 64] [--tokens 256] [--requests 64]
"""

from __future__ import annotations

import argparse
import time

import trio
from loadgen import Children, cpu_seconds, summary_ms

from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.transport import EngineChannel, open_transport
from trio_direct.engine.types import GenerateInput, SamplingOptions


async def load(port: int, concurrency: int, requests: int, tokens: int) -> tuple[int, float, list[float], list[float]]:
    ttft: list[float] = []
    gaps: list[float] = []
    received = 0
    limiter = trio.Semaphore(concurrency)
    async with open_transport():
        client = NativeEngineClient(EngineChannel("127.0.0.1", port), incremental=True)

        async def one(i: int) -> None:
            nonlocal received
            request = GenerateInput(
                rid=f"bench-{i:012d}",
                input_ids=list(range(10, 74)),
                sampling=SamplingOptions(max_new_tokens=tokens, ignore_eos=True, seed=i),
            )
            async with limiter, client.generate(request) as chunks:
                start = last = time.perf_counter()
                async for chunk in chunks:
                    now = time.perf_counter()
                    if chunk.token_ids:
                        (ttft if last == start else gaps).append(now - last)
                        last = now
                        received += len(chunk.token_ids)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(requests):
                nursery.start_soon(one, i)
        wall = time.perf_counter() - start
        client.channel.close()
    return received, wall, ttft, gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    with Children() as children:
        port = children.mock_engine("--speedup", "inf", "--incremental-streaming-output")
        pid = children.processes[-1].pid
        for concurrency in args.concurrency:
            before = cpu_seconds(pid)
            received, wall, ttft, gaps = trio.run(load, port, concurrency, max(args.requests, concurrency), args.tokens)
            engine_cpu = (cpu_seconds(pid) - before) / max(received, 1)
            print(
                f"c={concurrency:<3} {received / wall:9.0f} tokens/s  engine CPU {engine_cpu * 1e6:5.1f} us/token  "
                f"TTFT {summary_ms(ttft)}  between messages {summary_ms(gaps)}"
            )


if __name__ == "__main__":
    main()
