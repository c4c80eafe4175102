"""Which worker's KV cache holds how much of a prompt, learned from the engines' KV events.

Identity is the prefix, not the engine: a routing block is keyed by the sequence hash of its
token ids (``block_hash.py``), so two engines that cached the same prefix share one entry and
the engine's own hash algorithm never matters. Engine ``block_hashes`` are opaque ids, kept
per worker only to attach a store to its parent page and to resolve removals.

Engines cache pages (SGLang's default page is one token); the router matches coarser routing
blocks (a multiple of the page size, e.g. 16 tokens). Per worker, pages are kept as *runs*:
consecutive pages of one chain, with their token ids and the routing blocks they complete. A
store that continues a run's last page extends it in place; one that branches off earlier
starts a child run. A store costs O(tokens stored), a lookup O(prompt blocks), whatever the
page size.

A removed page takes with it everything after it in that worker's chain: the routing block
holding it and every later one are no longer a guaranteed prefix hit there. Stores that cannot
be placed (unknown parent, duplicate pages, wrong block size) are dropped and counted, never
guessed: a stale index costs routing quality, a guessed one misroutes silently.

Sans-IO: plain synchronous code, fed by whatever consumes the engines' event streams.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Hashable, Iterable, Sequence
from itertools import count
from typing import Protocol

from trio_direct.routing.block_hash import prefix_hashes_from_bytes, token_array, token_view

__all__ = ["BlockRemovedLike", "BlockStoredLike", "KvIndex", "Worker"]

_log = logging.getLogger(__name__)

Worker = Hashable
"""A routing unit, typically a ``RoutingKey`` (engine, DP rank); any hashable works."""

_FIRST_CHUNK = 32  # blocks hashed before the first lookup in find_matches; doubles after
_JUMP = 16  # find_matches probes every _JUMP-th block, bisecting where a worker drops out


class BlockStoredLike(Protocol):
    """What ``apply_stored`` reads from a decoded ``BlockStored`` event."""

    @property
    def block_hashes(self) -> Sequence[int]: ...
    @property
    def parent_block_hash(self) -> int | None: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def block_size(self) -> int: ...


class BlockRemovedLike(Protocol):
    """What ``apply_removed`` reads from a decoded ``BlockRemoved`` event."""

    @property
    def block_hashes(self) -> Sequence[int]: ...


class _Run:
    """Consecutive pages of one chain in one worker's cache.

    ``lead`` holds the tokens of the routing block already begun before the run's first page
    (by its ancestors) and ``base`` the sequence hash of the last routing block completed
    before it (``None`` at the root). ``blocks`` are the sequence hashes of the routing blocks
    completed inside the run, in order: ``len(blocks) == (len(lead) + len(tokens)) // R``.
    """

    __slots__ = ("base", "blocks", "children", "hashes", "id", "lead", "parent", "parent_index", "tokens")

    def __init__(
        self, run_id: int, parent: _Run | None, parent_index: int, base: int | None, lead: array
    ) -> None:
        self.id = run_id
        self.parent = parent
        self.parent_index = parent_index
        self.base = base
        self.lead = lead
        self.tokens = token_array()
        self.hashes: list[int] = []
        self.blocks: list[int] = []
        self.children: set[_Run] = set()


#: A page's place is one int, ``run id << _INDEX_BITS | page index in the run``: a page-size-1
#: engine caches millions of pages, and a tuple per page would be a GC-tracked object each
#: (a full collection over 800k of them stalled the event loop for 100-150 ms).
_INDEX_BITS = 32
_INDEX_MASK = (1 << _INDEX_BITS) - 1


class _WorkerState:
    __slots__ = ("bit", "extra", "held", "page_size", "pages", "roots", "runs", "warned")

    def __init__(self, bit: int, page_size: int) -> None:
        self.bit = bit
        self.page_size = page_size
        # engine page hash -> run id << _INDEX_BITS | page index in the run
        self.pages: dict[int, int] = {}
        self.runs: dict[int, _Run] = {}
        self.roots: set[_Run] = set()
        # routing blocks this worker holds more than once (the same tokens under two engine
        # chains, e.g. two LoRA namespaces): holds beyond the first
        self.extra: dict[int, int] = {}
        self.held = 0
        self.warned = False


_COUNTERS = (
    "stored_pages",
    "removed_pages",
    "clears",
    "orphan_stores",
    "duplicate_stores",
    "malformed_stores",
    "bad_block_size",
    "unknown_removals",
    "unknown_worker_events",
)


class KvIndex:
    """Prefix index over every worker's KV cache, at a routing block of ``block_size`` tokens."""

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._block = block_size
        # sequence hash -> bitmask of the workers holding that routing block
        self._blocks: dict[int, int] = {}
        self._workers: dict[Worker, _WorkerState] = {}
        self._by_bit: list[Worker | None] = []
        self._free_bits: list[int] = []
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._run_ids = count()

    # -- workers -------------------------------------------------------------------------

    @property
    def block_size(self) -> int:
        """The routing block size in tokens."""
        return self._block

    @property
    def num_blocks(self) -> int:
        """Distinct routing blocks held by at least one worker."""
        return len(self._blocks)

    def workers(self) -> list[Worker]:
        """Registered workers, in registration order."""
        return list(self._workers)

    def held_blocks(self, worker: Worker) -> int:
        """Routing blocks ``worker`` holds (0 if unknown): the size of its indexed cache."""
        state = self._workers.get(worker)
        return state.held if state is not None else 0

    def register_worker(self, worker: Worker, page_size: int) -> None:
        """Start indexing ``worker``, whose engine caches pages of ``page_size`` tokens.

        Registering again with the same page size changes nothing; with another one (the
        engine restarted with a new configuration) the worker's entries are dropped.
        """
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if self._block % page_size:
            raise ValueError(
                f"routing block size {self._block} is not a multiple of page size {page_size}"
            )
        state = self._workers.get(worker)
        if state is not None:
            if state.page_size != page_size:
                self._clear(state)
                state.page_size = page_size
                state.warned = False
            return
        if self._free_bits:
            index = self._free_bits.pop()
            self._by_bit[index] = worker
        else:
            index = len(self._by_bit)
            self._by_bit.append(worker)
        self._workers[worker] = _WorkerState(1 << index, page_size)

    def remove_worker(self, worker: Worker) -> None:
        """Forget ``worker`` entirely (engine gone); unknown workers are ignored."""
        state = self._workers.pop(worker, None)
        if state is None:
            return
        self._clear(state)
        index = state.bit.bit_length() - 1
        self._by_bit[index] = None
        self._free_bits.append(index)

    def clear_worker(self, worker: Worker) -> None:
        """Drop everything ``worker`` caches (``AllBlocksCleared``, restart, lost history)."""
        state = self._workers.get(worker)
        if state is None:
            self._counts["unknown_worker_events"] += 1
            return
        self._counts["clears"] += 1
        self._clear(state)

    # -- events --------------------------------------------------------------------------

    def apply(self, worker: Worker, event: object) -> None:
        """Apply one decoded KV event, dispatching on its type name as the wire tags do."""
        kind = type(event).__name__
        if kind == "BlockStored":
            self.apply_stored(worker, event)  # type: ignore[arg-type]
        elif kind == "BlockRemoved":
            self.apply_removed(worker, event)  # type: ignore[arg-type]
        elif kind == "AllBlocksCleared":
            self.clear_worker(worker)
        else:
            raise TypeError(f"not a KV event: {kind}")

    def apply_stored(self, worker: Worker, event: BlockStoredLike) -> None:
        """Index a run of pages ``worker`` cached."""
        counts = self._counts
        state = self._workers.get(worker)
        if state is None:
            counts["unknown_worker_events"] += 1
            return
        page_size = state.page_size
        if event.block_size != page_size:
            counts["bad_block_size"] += 1
            if not state.warned:
                state.warned = True
                _log.warning(
                    "KV events from %r have block_size %s, registered page size %s: "
                    "dropping them",
                    worker,
                    event.block_size,
                    page_size,
                )
            return
        hashes = event.block_hashes
        tokens = event.token_ids
        n = len(hashes)
        if not n:
            return
        if len(tokens) != n * page_size or (n > 1 and len(set(hashes)) != n):
            counts["malformed_stores"] += 1
            return
        try:
            packed = token_array(tokens)
        except (TypeError, ValueError):  # ids out of u32 range, or EAGLE bigram pairs
            counts["malformed_stores"] += 1
            return
        pages = state.pages
        for value in hashes:
            if value in pages:
                counts["duplicate_stores"] += 1
                return
        parent = event.parent_block_hash
        if parent is None:
            run = self._new_run(state, None, -1, None, token_array())
            state.roots.add(run)
        else:
            where = pages.get(parent)
            if where is None:
                counts["orphan_stores"] += 1
                return
            parent_run, index = state.runs[where >> _INDEX_BITS], where & _INDEX_MASK
            if index == len(parent_run.hashes) - 1:
                run = parent_run
            else:
                run = self._branch(state, parent_run, index)
        self._extend(state, run, hashes, packed)
        counts["stored_pages"] += n

    def apply_removed(self, worker: Worker, event: BlockRemovedLike) -> None:
        """Drop pages ``worker`` evicted, and everything after each in its chain."""
        counts = self._counts
        state = self._workers.get(worker)
        if state is None:
            counts["unknown_worker_events"] += 1
            return
        pages = state.pages
        # Count unknown pages before removing any: a page that goes with an earlier page of
        # this same event is not unknown.
        hashes = event.block_hashes
        for value in hashes:
            if value not in pages:
                counts["unknown_removals"] += 1
        for value in hashes:
            where = pages.get(value)
            if where is not None:
                self._truncate(state, state.runs[where >> _INDEX_BITS], where & _INDEX_MASK)

    # -- lookups -------------------------------------------------------------------------

    def find_matches(self, token_ids: Sequence[int]) -> dict[Worker, int]:
        """Per worker, how many leading routing blocks of the prompt it caches (≥ 1 only).

        Only complete blocks count (a prompt's tail shorter than a block never matches).
        Hashes lazily, in growing chunks, so a prompt nobody caches costs one chunk.
        """
        block = self._block
        total = len(token_ids) // block
        result: dict[Worker, int] = {}
        alive = -1
        depth = 0
        parent: int | None = None
        chunk = _FIRST_CHUNK
        while depth < total:
            stop = min(total, depth + chunk)
            data = token_view(token_ids[depth * block : stop * block])
            hashes = prefix_hashes_from_bytes(data, block, parent)
            alive = self._match(hashes, depth, alive, result)
            if not alive:
                return result
            depth = stop
            parent = hashes[-1]
            chunk *= 2
        if depth:
            self._credit(result, alive, depth)
        return result

    def find_matches_hashes(self, seq_hashes: Sequence[int]) -> dict[Worker, int]:
        """``find_matches`` for a prompt already hashed with ``block_hash.prefix_hashes``."""
        result: dict[Worker, int] = {}
        if seq_hashes:
            alive = self._match(seq_hashes, 0, -1, result)
            if alive:
                self._credit(result, alive, len(seq_hashes))
        return result

    def stats(self) -> dict[str, int]:
        """Sizes and event counters: anomalies here mean the index is stale somewhere.

        ``orphan_stores``: stores whose parent page was unknown (missed events);
        ``duplicate_stores``: stores of pages already cached (replays, missed removals);
        ``malformed_stores``: token count not pages × page size, repeated hashes, bad tokens;
        ``bad_block_size``: stores whose page size is not the registered one;
        ``unknown_removals``: removals of pages not indexed (normal after a dropped store
        or a removed ancestor).
        """
        out = {
            "workers": len(self._workers),
            "blocks": len(self._blocks),
            "pages": sum(len(state.pages) for state in self._workers.values()),
        }
        out.update(self._counts)
        return out

    # -- internals -----------------------------------------------------------------------

    def _match(
        self, hashes: Sequence[int], offset: int, alive: int, result: dict[Worker, int]
    ) -> int:
        """Walk one chunk of a prompt's block hashes; returns the workers still matching.

        ``offset`` is the chunk's first block in the prompt and ``alive`` the workers holding
        every block before it (``-1``: the chunk starts the prompt). A worker holding a block
        holds every block before it (a removal drops the rest of the chain), so the walk
        probes every ``_JUMP``-th block and bisects only where some worker drops out:
        O(blocks / _JUMP + drop-outs × log _JUMP) lookups into a dict too big for the caches.
        """
        lookup = self._blocks.get
        last = len(hashes) - 1
        if alive == -1:
            alive = lookup(hashes[0], 0)
            if not alive:
                return 0
            lo = 0
        else:
            lo = -1  # the block before the chunk, held by ``alive``
        while lo < last:
            hi = min(lo + _JUMP, last)
            mask = lookup(hashes[hi], 0) & alive
            if mask != alive:
                self._bisect(hashes, offset, lo, alive, hi, mask, result)
                if not mask:
                    return 0
                alive = mask
            lo = hi
        return alive

    def _bisect(
        self,
        hashes: Sequence[int],
        offset: int,
        lo: int,
        lo_mask: int,
        hi: int,
        hi_mask: int,
        result: dict[Worker, int],
    ) -> None:
        """Credit the workers of ``lo_mask`` missing from ``hi_mask`` with where each stops."""
        lookup = self._blocks.get
        pending = [(lo, lo_mask, hi, hi_mask)]
        while pending:
            lo, lo_mask, hi, hi_mask = pending.pop()
            if hi - lo == 1:
                self._credit(result, lo_mask & ~hi_mask, offset + hi)
                continue
            mid = (lo + hi) // 2
            mask = lookup(hashes[mid], 0) & lo_mask
            if mask != lo_mask:
                pending.append((lo, lo_mask, mid, mask))
            if mask != hi_mask:
                pending.append((mid, mask, hi, hi_mask))

    def _credit(self, result: dict[Worker, int], bits: int, depth: int) -> None:
        by_bit = self._by_bit
        while bits:
            low = bits & -bits
            result[by_bit[low.bit_length() - 1]] = depth
            bits ^= low

    def _new_run(
        self, state: _WorkerState, parent: _Run | None, parent_index: int, base: int | None, lead: array
    ) -> _Run:
        run = _Run(next(self._run_ids), parent, parent_index, base, lead)
        state.runs[run.id] = run
        return run

    def _branch(self, state: _WorkerState, parent: _Run, index: int) -> _Run:
        """A new run continuing ``parent`` after its page ``index`` (not its last)."""
        block = self._block
        through = (index + 1) * state.page_size
        lead_len = len(parent.lead)
        done = (lead_len + through) // block
        if done == 0:
            base = parent.base
            lead = parent.lead + parent.tokens[:through]
        else:
            base = parent.blocks[done - 1]
            lead = parent.tokens[done * block - lead_len : through]
        run = self._new_run(state, parent, index, base, lead)
        parent.children.add(run)
        return run

    def _extend(
        self, state: _WorkerState, run: _Run, hashes: Sequence[int], tokens: array
    ) -> None:
        block = self._block
        lead_len = len(run.lead)
        have = len(run.tokens)
        blocks = run.blocks
        partial = lead_len + have - len(blocks) * block
        if not partial:
            pending = tokens
        elif partial <= have:
            pending = run.tokens[have - partial :] + tokens
        else:
            pending = run.lead + run.tokens + tokens
        base = blocks[-1] if blocks else run.base
        start = len(run.hashes)
        run.tokens.extend(tokens)
        run.hashes.extend(hashes)
        first = run.id << _INDEX_BITS | start
        state.pages.update(zip(hashes, range(first, first + len(hashes))))
        new = prefix_hashes_from_bytes(token_view(pending), block, base)
        if not new:
            return
        blocks.extend(new)
        index = self._blocks
        bit = state.bit
        get = index.get
        for value in new:
            mask = get(value, 0)
            if mask & bit:
                state.extra[value] = state.extra.get(value, 0) + 1
            else:
                index[value] = mask | bit
                state.held += 1

    def _release(self, state: _WorkerState, values: Iterable[int]) -> None:
        index = self._blocks
        extra = state.extra
        keep = ~state.bit
        for value in values:
            if extra:
                more = extra.get(value)
                if more:
                    if more == 1:
                        del extra[value]
                    else:
                        extra[value] = more - 1
                    continue
            mask = index[value] & keep
            if mask:
                index[value] = mask
            else:
                del index[value]
            state.held -= 1

    def _truncate(self, state: _WorkerState, run: _Run, index: int) -> None:
        """Drop page ``index`` of ``run`` and everything after it in this worker's chain."""
        pages = state.pages
        removed = run.hashes[index:]
        self._counts["removed_pages"] += len(removed)
        for value in removed:
            del pages[value]
        del run.hashes[index:]
        del run.tokens[index * state.page_size :]
        keep = (len(run.lead) + len(run.tokens)) // self._block
        if keep < len(run.blocks):
            self._release(state, run.blocks[keep:])
            del run.blocks[keep:]
        if run.children:
            for child in [c for c in run.children if c.parent_index >= index]:
                run.children.discard(child)
                self._drop_subtree(state, child)
        if index == 0:
            del state.runs[run.id]
            if run.parent is None:
                state.roots.discard(run)
            else:
                run.parent.children.discard(run)
                run.parent = None

    def _drop_subtree(self, state: _WorkerState, run: _Run) -> None:
        pages = state.pages
        counts = self._counts
        stack = [run]
        while stack:
            run = stack.pop()
            counts["removed_pages"] += len(run.hashes)
            for value in run.hashes:
                del pages[value]
            del state.runs[run.id]
            self._release(state, run.blocks)
            stack.extend(run.children)
            _unlink(run)

    def _clear(self, state: _WorkerState) -> None:
        index = self._blocks
        keep = ~state.bit
        stack = list(state.roots)
        while stack:
            run = stack.pop()
            for value in run.blocks:
                mask = index.get(value, 0) & keep
                if mask:
                    index[value] = mask
                else:
                    index.pop(value, None)
            stack.extend(run.children)
            _unlink(run)
        state.pages = {}
        state.runs = {}
        state.roots = set()
        state.extra = {}
        state.held = 0


def _unlink(run: _Run) -> None:
    """Break a dropped run's parent/child cycle so its memory is freed at once, not by the GC."""
    run.parent = None
    run.children = set()
