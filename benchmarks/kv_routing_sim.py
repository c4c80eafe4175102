"""Routing policies on the Mooncake trace in virtual time: the mock engines' own scheduler, no processes.

The end-to-end benchmark (`kv_routing_bench.py`) runs real processes on a shared 2-core box, where
runs of one command differ by 20-50 % and more when other work runs; that is too much noise to choose
a cost's weights by. This simulation replays the same trace slices through the same code that decides
in the frontend (`KvRouter` and `KvIndex` from `trio_direct.routing`) and the same engine model
(`trio_direct.mock.scheduler.Scheduler`: radix cache, FCFS admission, the polynomial step timing),
stepping each engine in virtual time: a step's outputs and KV events arrive when it ends, as the
mock engine publishes them. Nothing else runs, so a result depends only on the policy and the slice,
and a whole sweep over several slices takes minutes. What it leaves out, by design: the frontend's
own time (tokenizing, HTTP), which does not depend on the policy, and network delays.

Policies: `kv` with any cost weights (`credit`, `scale`: `--router-kv-overlap-score-credit`,
`--router-prefill-load-scale`), `round-robin`, `least-load`, `power-of-two`, and `smg-like`, smg's
event-driven cache_aware as its source describes it (the engine with the most cached blocks of the
prompt, ties to fewer requests in flight; fewest in flight when nothing is cached or in-flight counts
are imbalanced: max - min > 64 and max > 1.5 x min), for orientation only: smg's own figures come
from `kv_routing_bench.py`. Engine load is polled every second as the frontend does (`GetLoad`).

    python benchmarks/kv_routing_sim.py --slices 0:0:500 0:500:500 1:0:500 2:0:500 \\
        --policies kv:1:1 kv:1:3 kv:1:10 kv:2:10 kv:1:30 round-robin smg-like

A slice is `SEED:START:LIMIT` of the trace sampled with `--sample-conversations` (all turns of that
share of the conversations, drawn with SEED).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trio_direct.bench import default_trace_path
from trio_direct.bench.trace import PromptSynthesizer, TraceRequest, cap_lengths, load_trace
from trio_direct.mock.scheduler import MockRequest, Scheduler, SchedulerConfig
from trio_direct.routing.block_hash import RoutingKey, prefix_hashes
from trio_direct.routing.kv_index import KvIndex
from trio_direct.routing.kv_router import KvRouter, KvRouterConfig

BLOCK = 16
POLL_S = 1.0
VOCAB = 32_000


@dataclass(slots=True)
class Engine:
    key: RoutingKey
    scheduler: Scheduler
    busy: bool = False


@dataclass(slots=True)
class Outcome:
    arrival: float
    first: float | None = None
    end: float | None = None
    prompt: int = 0
    cached: int = 0


class Policy:
    """Chooses an engine; told when a request's first token comes and when it ends."""

    index: KvIndex | None = None

    def choose(self, rid: str, token_ids: list[int], keys: list[RoutingKey]) -> RoutingKey:
        raise NotImplementedError

    def first_token(self, rid: str) -> None: ...

    def free(self, rid: str) -> None: ...

    def poll(self, loads: dict[RoutingKey, dict[str, Any]]) -> None: ...


class KvPolicy(Policy):
    """trio-direct's router, as the frontend runs it (cost, or a load-only selection)."""

    def __init__(self, keys: list[RoutingKey], config: KvRouterConfig, seed: int) -> None:
        self.index = KvIndex(BLOCK) if config.selection == "cost" else None
        if self.index is not None:
            for key in keys:
                self.index.register_worker(key, BLOCK)
        self.router = KvRouter(config, self.index, rng=random.Random(seed), clock=lambda: 0.0)

    def choose(self, rid: str, token_ids: list[int], keys: list[RoutingKey]) -> RoutingKey:
        return self.router.route(rid, token_ids, keys).worker  # type: ignore[return-value]

    def first_token(self, rid: str) -> None:
        self.router.first_token(rid)

    def free(self, rid: str) -> None:
        self.router.free(rid)

    def poll(self, loads: dict[RoutingKey, dict[str, Any]]) -> None:
        active = self.router.active
        for key, load in loads.items():
            active.set_external_load(
                key,
                running=load["num_running_reqs"],
                waiting=load["num_waiting_reqs"],
                used_tokens=load["num_used_tokens"],
                waiting_tokens=load["num_waiting_uncached_tokens"],
                max_tokens=load["max_total_num_tokens"],
            )


class RoundRobin(Policy):
    def __init__(self) -> None:
        self.turn = itertools.count()

    def choose(self, rid: str, token_ids: list[int], keys: list[RoutingKey]) -> RoutingKey:
        return keys[next(self.turn) % len(keys)]


class SmgLike(Policy):
    """smg's event-driven cache_aware, as its source describes it: the engine with the most cached
    blocks of the prompt, ties to fewer requests in flight, then to the smaller cache; no overlap
    anywhere, or in-flight counts imbalanced (max - min > 64 and max > 1.5 x min): fewest in flight."""

    def __init__(self, keys: list[RoutingKey], seed: int) -> None:
        self.index = KvIndex(BLOCK)
        for key in keys:
            self.index.register_worker(key, BLOCK)
        self.load: dict[RoutingKey, int] = dict.fromkeys(keys, 0)
        self.where: dict[str, RoutingKey] = {}
        self.rng = random.Random(seed)

    def choose(self, rid: str, token_ids: list[int], keys: list[RoutingKey]) -> RoutingKey:
        index = self.index
        assert index is not None
        loads = [self.load[k] for k in keys]
        matches = index.find_matches_hashes(prefix_hashes(token_ids, BLOCK))
        best = max((matches.get(k, 0) for k in keys), default=0)
        imbalanced = max(loads) - min(loads) > 64 and max(loads) > 1.5 * min(loads)
        if imbalanced or best == 0:
            low = min(loads)
            key = self.rng.choice([k for k in keys if self.load[k] == low])
        else:
            key = min(
                (k for k in keys if matches.get(k, 0) == best),
                key=lambda k: (self.load[k], index.held_blocks(k), self.rng.random()),
            )
        self.load[key] += 1
        self.where[rid] = key
        return key

    def free(self, rid: str) -> None:
        self.load[self.where.pop(rid)] -= 1


def make_policy(name: str, keys: list[RoutingKey], seed: int) -> Policy:
    if name == "round-robin":
        return RoundRobin()
    if name == "smg-like":
        return SmgLike(keys, seed)
    if name in ("least-load", "power-of-two"):
        return KvPolicy(keys, KvRouterConfig(block_size=BLOCK, selection=name), seed)
    kind, credit, scale = name.split(":")
    assert kind == "kv", name
    return KvPolicy(
        keys, KvRouterConfig(block_size=BLOCK, overlap_score_credit=float(credit), prefill_load_scale=float(scale)), seed
    )


@dataclass(slots=True)
class Settings:
    engines: int = 4
    speedup: float = 0.37
    num_blocks: int = 65536
    max_input_tokens: int = 16384
    max_output_tokens: int = 64


def simulate(policy_name: str, requests: list[TraceRequest], prompts: PromptSynthesizer, settings: Settings,
             seed: int) -> dict[str, Any]:  # fmt: skip
    """Replay ``requests`` through ``policy_name`` over fresh engines; latency figures in ms."""
    keys = [RoutingKey(f"e{i}") for i in range(settings.engines)]
    context = settings.max_input_tokens + settings.max_output_tokens + BLOCK
    config = SchedulerConfig(
        vocab_size=VOCAB, page_size=BLOCK, num_blocks=settings.num_blocks, context_length=context,
        speedup=settings.speedup,
    )  # fmt: skip
    engines = {key: Engine(key, Scheduler(config)) for key in keys}
    policy = make_policy(policy_name, keys, seed)
    outcomes: dict[str, Outcome] = {}
    # (time, order, kind, payload): kind 0 = a step ends, 1 = a request arrives, 2 = a load poll
    queue: list[tuple[float, int, int, Any]] = []
    order = itertools.count()
    for i, request in enumerate(requests):
        heapq.heappush(queue, (request.arrival_s, next(order), 1, (f"r{i}", request)))
    heapq.heappush(queue, (0.0, next(order), 2, None))
    pending_steps: dict[RoutingKey, Any] = {}

    def start(engine: Engine, now: float) -> None:
        result = engine.scheduler.step()
        if result is None:
            engine.busy = False
            return
        engine.busy = True
        pending_steps[engine.key] = result
        heapq.heappush(queue, (now + result.seconds, next(order), 0, engine.key))

    arrived = 0
    while queue:
        now, _, kind, payload = heapq.heappop(queue)
        if kind == 1:
            arrived += 1
            rid, request = payload
            token_ids = list(prompts.prompt(request))
            key = policy.choose(rid, token_ids, keys)
            outcomes[rid] = Outcome(now, prompt=len(token_ids))
            engine = engines[key]
            engine.scheduler.add(MockRequest(rid, token_ids, request.output_length, ignore_eos=True, temperature=0.0))
            if not engine.busy:
                start(engine, now)
        elif kind == 0:
            engine = engines[payload]
            result = pending_steps.pop(payload)
            if policy.index is not None:
                for event in result.kv_events:
                    policy.index.apply(payload, event)
            for out in result.outputs:
                outcome = outcomes[out.rid]
                if outcome.first is None:
                    outcome.first = now
                    outcome.cached = out.cached_tokens
                    policy.first_token(out.rid)
                if out.finish is not None:
                    outcome.end = now
                    policy.free(out.rid)
            start(engine, now)
        elif arrived < len(requests) or any(e.busy for e in engines.values()):
            policy.poll({key: engine.scheduler.load() for key, engine in engines.items()})
            heapq.heappush(queue, (now + POLL_S, next(order), 2, None))

    done = [o for o in outcomes.values() if o.end is not None and o.first is not None]
    ttft = sorted(1000 * (o.first - o.arrival) for o in done)  # type: ignore[operator]
    e2e = sorted(1000 * (o.end - o.arrival) for o in done)  # type: ignore[operator]
    return {
        "policy": policy_name,
        "completed": len(done),
        "ttft_p50_ms": round(_pct(ttft, 50), 1),
        "ttft_p99_ms": round(_pct(ttft, 99), 1),
        "e2e_p50_ms": round(_pct(e2e, 50), 1),
        "e2e_p99_ms": round(_pct(e2e, 99), 1),
        "cached_token_ratio": round(sum(o.cached for o in done) / max(sum(o.prompt for o in done), 1), 4),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


@dataclass(slots=True, frozen=True)
class Slice:
    seed: int
    start: int
    limit: int

    @classmethod
    def parse(cls, text: str) -> Slice:
        seed, start, limit = (int(part) for part in text.split(":"))
        return cls(seed, start, limit)

    def __str__(self) -> str:
        return f"{self.seed}:{self.start}:{self.limit}"


@dataclass(slots=True)
class Table:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def markdown(self, policies: list[str], slices: list[Slice], metric: str, digits: int = 0) -> str:
        head = "| policy | " + " | ".join(f"slice {s}" for s in slices) + " | geometric mean vs best |"
        lines = [head, "|---" * (len(slices) + 2) + "|"]
        by = {(r["policy"], r["slice"]): r[metric] for r in self.rows}
        means = {}
        for policy in policies:
            values = [by[(policy, str(s))] for s in slices]
            means[policy] = statistics.geometric_mean(values) if all(v > 0 for v in values) else float("nan")
        best = min(means.values()) if metric != "cached_token_ratio" else max(means.values())
        for policy in policies:
            cells = " | ".join(f"{by[(policy, str(s))]:.{digits}f}" for s in slices)
            lines.append(f"| {policy} | {cells} | {means[policy] / best:.3f} |")
        return "\n".join(lines)


def main(argv: list[str] | None = None, *, out: Callable[[str], None] = print) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="Mooncake JSONL trace (default: the shared conversation trace)")
    parser.add_argument("--sample-conversations", type=float, default=0.0833)
    parser.add_argument("--time-scale", type=float, default=0.035)
    parser.add_argument("--slices", nargs="+", type=Slice.parse, default=[Slice(0, 0, 500), Slice(1, 0, 500)])
    parser.add_argument("--policies", nargs="+", default=["kv:1:1", "kv:1:10", "round-robin", "smg-like"])
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--speedup", type=float, default=0.37)
    parser.add_argument("--num-blocks", type=int, default=65536)
    parser.add_argument("--json", type=Path, help="write every row here")
    args = parser.parse_args(argv)
    trace = args.trace or default_trace_path()
    if trace is None or not Path(trace).is_file():
        parser.error("no trace found: pass --trace FILE (the Mooncake conversation trace, JSONL)")
    settings = Settings(engines=args.engines, speedup=args.speedup, num_blocks=args.num_blocks)
    table = Table()
    for piece in args.slices:
        requests = cap_lengths(
            load_trace(trace, start=piece.start, limit=piece.limit, time_scale=args.time_scale,
                       conversation_fraction=args.sample_conversations, seed=piece.seed),
            max_input_tokens=settings.max_input_tokens, max_output_tokens=settings.max_output_tokens,
        )  # fmt: skip
        rate = len(requests) / max(requests[-1].arrival_s, 1e-9)
        print(f"slice {piece}: {len(requests)} requests, {rate:.1f} req/s", file=sys.stderr)
        for name in args.policies:
            started = time.monotonic()
            prompts = PromptSynthesizer(low=3, high=VOCAB, seed=piece.seed)
            row = simulate(name, requests, prompts, settings, seed=piece.seed)
            row["slice"] = str(piece)
            table.rows.append(row)
            print(f"  {json.dumps(row)} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    for metric, digits in (("ttft_p50_ms", 0), ("ttft_p99_ms", 0), ("e2e_p50_ms", 0), ("cached_token_ratio", 3)):
        out(f"\n{metric}\n")
        out(table.markdown(args.policies, args.slices, metric, digits))
    if args.json:
        args.json.write_text(json.dumps(table.rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
