"""Which worker probably caches a prompt, learned from the router's own decisions (no KV events).

For engines that publish no KV events (``--no-router-kv-events``, Dynamo's approximate mode): every
routed prompt's blocks are assumed cached on the worker it went to for ``ttl`` seconds
(``--router-ttl-secs``, 120), refreshed each time a prompt with the same prefix goes there.
A guess, never merged into the event-driven ``KvIndex``: engines evict under pressure, so an
entry can outlive the real cache, and other frontends' traffic is invisible.

Memory is bounded by ``max_blocks`` (worker, block) entries; past it the oldest go first. A
prompt's blocks are recorded deepest first, and any prompt that refreshes a block refreshes
every block before it, so expiry and eviction take a prefix's tail before its head: what a
worker holds is always a whole prefix, which lookups rely on (given a ``now`` that never goes
backwards).

Sans-IO, and clock-free: every call takes ``now`` (any monotonic clock, in seconds).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from trio_direct.routing.block_hash import prefix_hashes

__all__ = ["DEFAULT_MAX_BLOCKS", "ApproximateIndex"]

Worker = Hashable

DEFAULT_MAX_BLOCKS = 1 << 18
"""(worker, block) entries kept at most: 4 M tokens of prefixes at 16-token blocks, ~80 MB."""


class ApproximateIndex:
    """Prefixes routed to each worker in the last ``ttl`` seconds, at ``block_size`` tokens."""

    __slots__ = ("_block", "_blocks", "_max", "_order", "_ttl")

    def __init__(self, block_size: int, ttl: float, *, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if ttl <= 0:
            raise ValueError("ttl must be > 0")
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self._block = block_size
        self._ttl = ttl
        self._max = max_blocks
        # sequence hash -> worker -> expiry time
        self._blocks: dict[int, dict[Worker, float]] = {}
        # (sequence hash, worker) -> expiry, oldest first: expiry order as well, ttl being fixed
        self._order: OrderedDict[tuple[int, Worker], float] = OrderedDict()

    @property
    def block_size(self) -> int:
        return self._block

    @property
    def ttl(self) -> float:
        return self._ttl

    def __len__(self) -> int:
        """(worker, block) entries held, expired ones not yet purged included."""
        return len(self._order)

    def insert(self, worker: Worker, seq_hashes: Sequence[int], now: float) -> None:
        """Assume ``worker`` caches this prompt's blocks until ``now + ttl``."""
        self._purge(now)
        expiry = now + self._ttl
        blocks = self._blocks
        order = self._order
        for value in reversed(seq_hashes):
            holders = blocks.get(value)
            if holders is None:
                holders = blocks[value] = {}
            holders[worker] = expiry
            key = (value, worker)
            order[key] = expiry
            order.move_to_end(key)
        while len(order) > self._max:
            self._pop_oldest()

    def find_matches_hashes(self, seq_hashes: Sequence[int], now: float) -> dict[Worker, int]:
        """Per worker, how many leading blocks of the prompt it holds unexpired (≥ 1 only).

        What a worker holds is a whole prefix (see the module docstring), so each worker that
        holds the first block is measured by binary search: O(workers × log blocks).
        """
        self._purge(now)
        if not seq_hashes:
            return {}
        blocks = self._blocks
        first = blocks.get(seq_hashes[0])
        if not first:
            return {}
        result: dict[Worker, int] = {}
        total = len(seq_hashes)
        for worker, expiry in first.items():
            if expiry <= now:
                continue
            lo, hi = 1, total  # block lo - 1 is held; block hi is not, or hi is the end
            while lo < hi:
                mid = (lo + hi) // 2
                holders = blocks.get(seq_hashes[mid])
                if holders is not None and holders.get(worker, now) > now:
                    lo = mid + 1
                else:
                    hi = mid
            result[worker] = lo
        return result

    def find_matches(self, token_ids: Sequence[int], now: float) -> dict[Worker, int]:
        """``find_matches_hashes`` for a prompt not hashed yet."""
        return self.find_matches_hashes(prefix_hashes(token_ids, self._block), now)

    def remove_worker(self, worker: Worker) -> None:
        """Forget everything routed to ``worker`` (engine gone). O(entries)."""
        gone = [key for key in self._order if key[1] == worker]
        for key in gone:
            del self._order[key]
            self._drop(key)

    def _purge(self, now: float) -> None:
        order = self._order
        while order:
            expiry = next(iter(order.values()))
            if expiry > now:
                return
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        key, _ = self._order.popitem(last=False)
        self._drop(key)

    def _drop(self, key: tuple[int, Worker]) -> None:
        value, worker = key
        holders = self._blocks[value]
        del holders[worker]
        if not holders:
            del self._blocks[value]
