"""Micro-benchmark of the mock engine's scheduler core: CPU cost of a decode step.

Keeps 64 requests running (each finishes after ``--tokens`` tokens and is replaced) and
reports microseconds per step and tokens per second at ``speedup=inf``, i.e. the ceiling the
scheduler puts on a ``--speedup inf`` benchmark. Compare runs on one machine, not absolutes.

    python benchmarks/mock_scheduler_bench.py [--running 64] [--steps 5000]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import time

from trio_direct.mock.scheduler import MockRequest, Scheduler, SchedulerConfig


def bench(
    running: int, steps: int, prompt_len: int, tokens: int, page_size: int, kv_events: bool
) -> None:
    config = SchedulerConfig(
        vocab_size=32_000,
        eos_token_ids=frozenset({2}),
        page_size=page_size,
        num_blocks=65536,  # the default pool: steady state evicts cached pages
        max_running_requests=running,
        speedup=math.inf,
        kv_events=kv_events,
    )
    sched = Scheduler(config)
    ids = itertools.count()

    def top_up() -> None:
        while sched.num_running + sched.num_waiting < running:
            n = next(ids)
            prompt = [(n * 7919 + i) % 31_000 + 3 for i in range(prompt_len)]
            sched.add(MockRequest(f"req-{n}", prompt, tokens, ignore_eos=True, seed=n))

    top_up()
    while sched.num_waiting:  # admit everything before timing decode
        sched.step()

    gc.collect()  # the previous run's trie is garbage with cycles; keep it out of the timing
    decode_steps = other_steps = produced = 0
    decode_ns = 0
    start = time.perf_counter_ns()
    for _ in range(steps):
        top_up()
        t0 = time.perf_counter_ns()
        result = sched.step()
        elapsed = time.perf_counter_ns() - t0
        assert result is not None
        produced += sum(len(o.new_token_ids) for o in result.outputs)
        # A plain decode step: no admission, no request finishing (those cost per request).
        if all(o.completion_tokens > 1 and o.finish is None for o in result.outputs):
            decode_steps += 1
            decode_ns += elapsed
        else:
            other_steps += 1
    total_s = (time.perf_counter_ns() - start) / 1e9
    label = f"page_size={page_size:<3} kv_events={'on ' if kv_events else 'off'}"
    print(
        f"{label}  plain decode step: {decode_ns / max(decode_steps, 1) / 1e3:8.1f} µs"
        f" ({decode_ns / max(decode_steps, 1) / 1e3 / running:5.2f} µs/token)"
        f"  overall, with admissions and finishes: {produced / total_s:8.0f} tokens/s"
        f"  ({decode_steps} plain decode steps of {steps})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--running", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    args = parser.parse_args()
    print(
        f"{args.running} running requests, {args.prompt_len}-token prompts,"
        f" {args.tokens} output tokens each"
    )
    for page_size, kv_events in ((1, True), (1, False), (16, True)):
        bench(args.running, args.steps, args.prompt_len, args.tokens, page_size, kv_events)


if __name__ == "__main__":
    main()
