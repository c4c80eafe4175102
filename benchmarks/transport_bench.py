"""How many engine messages per second trio code receives through the engine transport.

An engine process (this script with --serve, pinned to the other core) floods one Generate stream
with small GenerateResponse messages; the client (pinned to one core) receives them
  * through trio-direct's client (`EngineChannel.open_stream`, trio side), and
  * with plain asyncio grpclib (no trio), the baseline,
alternating in the same run, so the ratio holds on a noisy machine.

    python benchmarks/transport_bench.py [--messages 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import trio
from grpclib.client import Channel
from grpclib.const import Cardinality

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.native import GENERATE
from trio_direct.engine.transport import EngineChannel, open_transport
from trio_direct.engine.transport.server import RpcMethod, serve_grpc

MESSAGE = pb.GenerateResponse(output_ids=[12345], meta_info={"completion_tokens": "1"})


def pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {core % os.cpu_count()})


async def serve() -> None:
    def flood(call):
        for _ in range(call.request.sampling_params.max_new_tokens):
            call.send(MESSAGE)
        call.finish()

    methods = [RpcMethod(GENERATE, True, pb.GenerateRequest, pb.GenerateResponse, flood)]
    async with open_transport(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, methods, "127.0.0.1", 0)
        print(json.dumps({"port": port}), flush=True)


def request(n: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(input_ids=[1], sampling_params=pb.SamplingParams(max_new_tokens=n))


async def trio_run(channel: EngineChannel, n: int) -> tuple[float, list[float]]:
    gaps, last = [], time.perf_counter()
    start = last
    async with channel.open_stream(GENERATE, request(n), pb.GenerateResponse, timeout=60) as stream:
        async for _ in stream:
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    return n / (last - start), gaps


def asyncio_run(port: int, n: int, runs: int) -> list[float]:
    async def main() -> list[float]:
        channel = Channel("127.0.0.1", port)
        rates = []
        for _ in range(runs):
            start = time.perf_counter()
            async with channel.request(GENERATE, Cardinality.UNARY_STREAM, pb.GenerateRequest, pb.GenerateResponse) as s:
                await s.send_message(request(n), end=True)
                while await s.recv_message() is not None:
                    pass
            rates.append(n / (time.perf_counter() - start))
        channel.close()
        return rates

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if args.serve:
        pin(1)
        trio.run(serve)
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        pin(0)
        bridge_rates, baseline_rates, gaps = [], [], []

        async def bridge_runs() -> None:
            async with open_transport():
                channel = EngineChannel("127.0.0.1", port)
                for _ in range(args.runs):
                    rate, run_gaps = await trio_run(channel, args.messages)
                    bridge_rates.append(rate)
                    gaps.extend(run_gaps)
                channel.close()

        asyncio_run(port, 2000, 1)  # warm-up
        for _ in range(2):  # interleave the two clients
            trio.run(bridge_runs)
            baseline_rates.extend(asyncio_run(port, args.messages, args.runs))
        gaps.sort()
        bridge = statistics.median(bridge_rates)
        baseline = statistics.median(baseline_rates)
        print(f"messages per run: {args.messages}, runs per client: {2 * args.runs}")
        print(f"trio bridge        : {bridge:9.0f} msg/s (median)   min {min(bridge_rates):.0f}  max {max(bridge_rates):.0f}")
        print(f"plain asyncio      : {baseline:9.0f} msg/s (median)   min {min(baseline_rates):.0f}  max {max(baseline_rates):.0f}")
        print(f"ratio bridge/asyncio: {bridge / baseline:.2f}")
        print(
            f"inter-message gap at the trio reader: p50 {gaps[len(gaps) // 2] * 1e6:.1f} us, "
            f"p99 {gaps[int(len(gaps) * 0.99)] * 1e6:.1f} us"
        )
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
