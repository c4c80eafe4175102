"""Micro-benchmark of the KV index: event ingestion rate and lookup latency.

* ingest: engine blocks per second through ``apply_stored`` for page-16 engines (16 engine-ranks,
  coalesced events of ``--pages-per-event`` pages), filling the index to ``--blocks`` routing
  blocks; then the same for page-1 engines assembled into 16-token routing blocks, both with
  coalesced events (SGLang 0.5.19+) and one event per page (0.5.4-0.5.14);
* lookup: ``find_matches`` on a 32k-token prompt (2048 routing blocks) against the full index,
  p50/p99/max over ``--lookups`` calls, for a prompt every worker caches in part (the worst
  case: the walk runs to the end) and for a prompt nobody caches; plus hashing alone and
  ``find_matches_hashes`` on a pre-hashed prompt;
* removal: engine blocks per second through ``apply_removed`` (leaves-first eviction).

Targets (one core): ingest >= 200k engine blocks/s at page 16; find_matches p99 <= 1 ms.
Events are built before the clock starts, with token ids as lists (what a msgpack decoder
yields). Compare runs on one machine, not absolutes.

    python benchmarks/kv_index_bench.py [--blocks 1000000] [--workers 16] [--lookups 300]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import time
from array import array
from dataclasses import dataclass

from trio_direct.routing.block_hash import RoutingKey, prefix_hashes
from trio_direct.routing.kv_index import KvIndex

ROUTING_BLOCK = 16
PROMPT_BLOCKS = 2048  # a 32k-token prompt


@dataclass(slots=True, frozen=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [t % 150_000 for t in array("I", rng.randbytes(4 * n))]


def chain_events(
    tokens: list[int], page: int, per_event: int, ids: itertools.count
) -> list[BlockStored]:
    """A chain of ``tokens`` stored as successive coalesced events of ``per_event`` pages."""
    events = []
    parent = None
    step = page * per_event
    for start in range(0, len(tokens) - len(tokens) % page, step):
        chunk = tokens[start : start + step]
        chunk = chunk[: len(chunk) - len(chunk) % page]
        hashes = tuple(next(ids) for _ in range(len(chunk) // page))
        events.append(BlockStored(hashes, parent, chunk, page))
        parent = hashes[-1]
    return events


def timed_apply(index: KvIndex, batches) -> tuple[int, float]:
    """Apply (worker, events) batches; only the apply calls are timed."""
    pages = 0
    elapsed = 0.0
    for worker, events in batches:
        start = time.perf_counter()
        for event in events:
            index.apply_stored(worker, event)
        elapsed += time.perf_counter() - start
        pages += sum(len(e.block_hashes) for e in events)
    return pages, elapsed


def percentiles(samples: list[float]) -> str:
    samples = sorted(samples)

    def ms(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] * 1e3

    return f"p50 {ms(0.50):.3f} ms  p99 {ms(0.99):.3f} ms  max {samples[-1] * 1e3:.3f} ms"


def bench_page16(args: argparse.Namespace) -> None:
    rng = random.Random(1)
    ids = itertools.count(1)
    workers = [RoutingKey(f"engine-{i // 2}", i % 2) for i in range(args.workers)]
    index = KvIndex(ROUTING_BLOCK)
    for worker in workers:
        index.register_worker(worker, ROUTING_BLOCK)

    # The hot prompt: every worker caches a different share of it, so a lookup walks it all.
    hot = random_tokens(rng, PROMPT_BLOCKS * ROUTING_BLOCK)
    hot_batches = []
    for i, worker in enumerate(workers):
        held = PROMPT_BLOCKS - i * (PROMPT_BLOCKS // (2 * len(workers)))
        hot_batches.append(
            (worker, chain_events(hot[: held * ROUTING_BLOCK], 16, args.pages_per_event, ids))
        )
    total_pages, total_time = timed_apply(index, hot_batches)

    # Fill with conversations: unique chains of 1-4k tokens, round-robin over workers.
    worker_cycle = itertools.cycle(workers)
    while index.num_blocks < args.blocks:
        batch = []
        for _ in range(64):
            chain = random_tokens(rng, rng.randrange(64, 256) * ROUTING_BLOCK)
            events = chain_events(chain, 16, args.pages_per_event, ids)
            batch.append((next(worker_cycle), events))
        pages, elapsed = timed_apply(index, batch)
        total_pages += pages
        total_time += elapsed
    stats = index.stats()
    print(
        f"ingest page 16 ({args.pages_per_event} pages/event): {total_pages / total_time:,.0f} "
        f"engine blocks/s [target >= 200,000]  ({total_pages:,} blocks in {total_time:.2f} s; "
        f"index holds {stats['blocks']:,} routing blocks over {stats['workers']} engine-ranks)"
    )

    gc.collect()
    gc.freeze()  # the long-lived index: keep the collector from rescanning it mid-lookup
    miss = random_tokens(rng, PROMPT_BLOCKS * ROUTING_BLOCK)
    for label, prompt in (("hot prompt, partial hits", hot), ("prompt nobody caches", miss)):
        samples = []
        for _ in range(args.lookups):
            start = time.perf_counter()
            matches = index.find_matches(prompt)
            samples.append(time.perf_counter() - start)
        deepest = max(matches.values(), default=0)
        print(
            f"find_matches 32k tokens, {label} ({len(matches)} workers, deepest {deepest}): "
            f"{percentiles(samples)} [target p99 <= 1 ms]"
        )
    samples, walk = [], []
    for _ in range(args.lookups):
        start = time.perf_counter()
        hashes = prefix_hashes(hot, ROUTING_BLOCK)
        middle = time.perf_counter()
        index.find_matches_hashes(hashes)
        end = time.perf_counter()
        samples.append(middle - start)
        walk.append(end - middle)
    print(f"prefix_hashes 32k tokens: {percentiles(samples)}")
    print(f"find_matches_hashes 2048 hashes: {percentiles(walk)}")

    # Eviction of the hot prompt's chains: leaves first, one BlockRemoved per stored event.
    removals = []
    for worker, events in hot_batches:
        for event in reversed(events):
            removals.append((worker, BlockRemoved(tuple(reversed(event.block_hashes)))))
    start = time.perf_counter()
    for worker, event in removals:
        index.apply_removed(worker, event)
    elapsed = time.perf_counter() - start
    removed = sum(len(event.block_hashes) for _, event in removals)
    print(f"remove page 16 (leaves first): {removed / elapsed:,.0f} engine blocks/s")
    gc.unfreeze()


def bench_page1(args: argparse.Namespace) -> None:
    rng = random.Random(2)
    ids = itertools.count(1)
    workers = [RoutingKey(f"engine-{i}", None) for i in range(4)]
    for per_event, label in ((128, "coalesced, 128 pages/event"), (1, "one page per event")):
        index = KvIndex(ROUTING_BLOCK)
        for worker in workers:
            index.register_worker(worker, 1)
        total_pages = 0
        total_time = 0.0
        while total_pages < args.page1_blocks:
            batch = []
            for _ in range(16):
                tokens = random_tokens(rng, rng.randrange(256, 2048))
                batch.append((rng.choice(workers), chain_events(tokens, 1, per_event, ids)))
            pages, elapsed = timed_apply(index, batch)
            total_pages += pages
            total_time += elapsed
        print(
            f"ingest page 1 -> routing block 16 ({label}): {total_pages / total_time:,.0f} "
            f"engine blocks/s ({total_pages:,} pages, {index.num_blocks:,} routing blocks)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1_000_000, help="routing blocks to index")
    parser.add_argument("--workers", type=int, default=16, help="engine-ranks")
    parser.add_argument("--pages-per-event", type=int, default=8)
    parser.add_argument("--lookups", type=int, default=300)
    parser.add_argument("--page1-blocks", type=int, default=1_000_000, help="page-1 pages")
    args = parser.parse_args()
    bench_page16(args)
    bench_page1(args)


if __name__ == "__main__":
    main()
