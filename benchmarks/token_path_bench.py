"""The per-token cost of the request core: engine chunks in, SSE bytes out, nothing else.

`stream_response` is driven with an in-process engine client that hands out one-token chunks as fast
as they are read (no transport, no sockets) and a writer that drops the bytes, so what is measured
is the core's own work per token: the engine call's batching, the choice reader, the output pipeline
(a detokenizer stand-in), the renderer and the driver. CPU seconds per token, the best of several
runs, so that other load on the machine shows as little as possible.

    python benchmarks/token_path_bench.py [--tokens 20000] [--runs 7] [--baseline PYTHON]

`--baseline` runs the same measurement with another checkout's interpreter (its venv has that
checkout installed) and prints both, interleaved run by run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from types import SimpleNamespace


def measure(tokens: int) -> float:
    """CPU seconds per token of one streamed completion of `tokens` one-token chunks."""
    import trio

    from trio_direct.config import ServeConfig
    from trio_direct.core.output import ChoiceOutput
    from trio_direct.core.plan import ChoicePlan, Prompt, RequestPlan
    from trio_direct.core.render import StreamCutter, stream_response
    from trio_direct.engine.types import GenerateChunk, GenerateInput
    from trio_direct.fleet.fleet import Engine, Fleet
    from trio_direct.core.model_pool import ModelPool
    from trio_direct.routing.policy import RoutingPolicy
    from trio_direct.surfaces.completions import CompletionRenderer

    class Chunks:
        def __init__(self, count: int) -> None:
            self.left = count

        def __aiter__(self):
            return self

        async def __anext__(self) -> GenerateChunk:
            await trio.lowlevel.checkpoint()
            self.left -= 1
            if self.left < 0:
                raise StopAsyncIteration
            return GenerateChunk([7], finish_reason="length" if self.left == 0 else None, completion_tokens=tokens - self.left)

        def next_nowait(self) -> GenerateChunk:
            raise trio.WouldBlock

        async def wait_written(self) -> None:
            pass

    class Client:
        api, name, last_output_at = "native", "bench", 0.0

        @asynccontextmanager
        async def generate(self, request):
            yield Chunks(tokens)

        async def abort(self, rid, *, timeout=5.0):
            return True

    class Detokenizer:
        def prepare(self) -> None:
            pass

        def push(self, ids) -> str:
            return "x" * len(ids)

        def flush(self) -> str:
            return ""

    class Writer:
        async def start(self, status, headers) -> None:
            pass

        async def send(self, data: bytes) -> None:
            pass

        async def end(self) -> None:
            pass

    card = SimpleNamespace(role="aggregated", dp_size=1, url="grpc://bench:1")
    fleet = Fleet([Engine("e0", card, Client(), healthy=True)], model=SimpleNamespace(served_model_name="m", context_length=None))
    pool = ModelPool(ServeConfig(), fleet, RoutingPolicy(), tokenizer=None, chat_template_override=None)
    choice = ChoicePlan(GenerateInput(rid="a" * 36, input_ids=[1, 2]), ChoiceOutput(0, Detokenizer()))
    plan = RequestPlan(id="cmpl-x", key="a" * 32, created=0, model="m", prompts=[Prompt([1, 2], "go")],
                       choices=[choice], stream=True)  # fmt: skip

    async def run() -> None:
        await stream_response(pool, plan, CompletionRenderer(plan, str), Writer(), started=0.0, cutter=StreamCutter())

    start = time.process_time()
    trio.run(run)
    return (time.process_time() - start) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", help="another checkout's python, measured in turn")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.tokens)))
        return
    pythons = {"this": sys.executable, **({"baseline": args.baseline} if args.baseline else {})}
    results: dict[str, list[float]] = {name: [] for name in pythons}
    for _ in range(args.runs):
        for name, python in pythons.items():
            out = subprocess.run([python, __file__, "--one", "--tokens", str(args.tokens)], capture_output=True, text=True, check=True)
            results[name].append(json.loads(out.stdout))
    for name, values in results.items():
        values.sort()
        print(f"{name:9s} best {values[0] * 1e6:6.2f} us/token   median {values[len(values) // 2] * 1e6:6.2f} us/token")
    if args.baseline:
        print(f"this / baseline (best): {results['this'][0] / results['baseline'][0]:.3f}")


if __name__ == "__main__":
    main()
