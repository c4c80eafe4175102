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
be placed (duplicate pages, wrong block size, malformed) are dropped and counted.

Lost history is not lost routing. A store whose parent page the index never saw (the frontend
restarted, a gap was not replayed, the engine published before this subscription) still proves
that its engine holds the parent's whole prefix: SGLang chains a page's hash onto its parent's,
and an engine only stores on top of what it caches. Such a store is kept as a *floating* run
under an ``_Anchor`` for the unknown parent hash: its pages are indexed (later stores extend
it, removals resolve it), but its routing blocks cannot be hashed until the prefix's tokens are
known. They are learnt from the prompts this frontend routed to that worker (``note_routed``):
the store is what the engine computed of such a prompt after its cached prefix, so where its
tokens sit in the prompt says what the prefix is (where several prompts could say, SGLang's
own hash of the anchor page decides, ``engine_hash``). Once located, the anchor holds the prefix's
routing blocks (known by inference, reported as such) and every run under it is hashed as if
it had been seen from the root. Removals stay exact: removing the anchor's page drops the
whole inferred prefix with it (an engine evicts leaves first, so everything under it is gone
already); the pages before it, whose hashes were never seen, are no longer claimed.

Sans-IO: plain synchronous code, fed by whatever consumes the engines' event streams.
"""

from __future__ import annotations

import logging
from array import array
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from itertools import count
from typing import Protocol

from trio_direct.routing.block_hash import prefix_hashes_from_bytes, token_array, token_view, tokens_from_bytes
from trio_direct.routing.engine_hash import same_engine_hash, sglang_prefix_hash

__all__ = ["BlockRemovedLike", "BlockStoredLike", "KvIndex", "Worker"]

_log = logging.getLogger(__name__)

Worker = Hashable
"""A routing unit, typically a ``RoutingKey`` (engine, DP rank); any hashable works."""

_FIRST_CHUNK = 32  # blocks hashed before the first lookup in find_matches; doubles after
_JUMP = 16  # find_matches probes every _JUMP-th block, bisecting where a worker drops out
#: Prompts recently routed to each worker, kept to locate stores that chain onto unseen pages.
HINTS_PER_WORKER = 32
#: Tokens of a floating run searched for in a routed prompt: enough to be unambiguous.
_NEEDLE_TOKENS = 64
#: Floating anchors a newly routed prompt is tried against (bounded: routing stays O(1) in them).
_RECENT_ANCHORS = 8


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

    A *floating* run descends from an ``_Anchor`` whose prefix is not known yet: its ``base``
    and ``lead`` are unknown and it has no ``blocks`` until the anchor is located.
    """

    __slots__ = (
        "anchor", "base", "blocks", "children", "floating", "hashes", "id", "lead", "parent", "parent_index", "tokens",
    )  # fmt: skip

    def __init__(self, run_id: int, parent: _Run | None, parent_index: int, base: int | None, lead: array) -> None:
        self.id = run_id
        self.parent = parent
        self.parent_index = parent_index
        self.base = base
        self.lead = lead
        self.tokens = token_array()
        self.hashes: list[int] = []
        self.blocks: list[int] = []
        self.children: set[_Run] = set()
        #: A root run chaining onto a page never seen stored: the anchor for that page.
        self.anchor: _Anchor | None = None
        self.floating = False


class _Anchor:
    """An engine page that stores chained onto but that the index never saw stored.

    ``runs`` are the runs stored directly on top of it. ``blocks`` are the routing blocks of
    the prefix through that page once it is located (``None`` before), ``base`` and ``lead``
    what a run continuing it starts from (as for ``_Run``).
    """

    __slots__ = ("base", "blocks", "hash", "lead", "runs", "tried_at")

    def __init__(self, page_hash: int) -> None:
        self.hash = page_hash
        self.runs: set[_Run] = set()
        self.blocks: list[int] | None = None
        self.base: int | None = None
        self.lead = token_array()
        #: Tokens above it when locating it was last tried (tried again each time they double).
        self.tried_at = 0


#: A page's place is one int, ``run id << _INDEX_BITS | page index in the run``: a page-size-1
#: engine caches millions of pages, and a tuple per page would be a GC-tracked object each
#: (a full collection over 800k of them stalled the event loop for 100-150 ms).
_INDEX_BITS = 32
_INDEX_MASK = (1 << _INDEX_BITS) - 1


class _WorkerState:
    __slots__ = (
        "anchors", "bit", "extra", "held", "hints", "inferred", "page_size", "pages", "recent", "roots", "runs", "warned",
    )  # fmt: skip

    def __init__(self, bit: int, page_size: int) -> None:
        self.bit = bit
        self.page_size = page_size
        # engine page hash -> run id << _INDEX_BITS | page index in the run
        self.pages: dict[int, int] = {}
        self.runs: dict[int, _Run] = {}
        self.roots: set[_Run] = set()
        # unseen parent page hash -> the runs stored on top of it
        self.anchors: dict[int, _Anchor] = {}
        # routing blocks this worker holds more than once (the same tokens under two engine
        # chains, e.g. two LoRA namespaces): holds beyond the first
        self.extra: dict[int, int] = {}
        # routing block -> holds that come from an anchor's inferred prefix
        self.inferred: dict[int, int] = {}
        # prompts recently routed here (little-endian u32 bytes), newest last
        self.hints: deque[bytes] = deque(maxlen=HINTS_PER_WORKER)
        # the anchors created last, which a prompt noted after their store may still locate
        self.recent: deque[_Anchor] = deque(maxlen=_RECENT_ANCHORS)
        self.held = 0
        self.warned = False


_COUNTERS = (
    "stored_pages",
    "removed_pages",
    "clears",
    "orphan_stores",
    "anchors_located",
    "anchors_removed",
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
            raise ValueError(f"routing block size {self._block} is not a multiple of page size {page_size}")
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
                    "KV events from %r have block_size %s, registered page size %s: dropping them",
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
        elif (where := pages.get(parent)) is not None:
            parent_run, index = state.runs[where >> _INDEX_BITS], where & _INDEX_MASK
            if index == len(parent_run.hashes) - 1:
                run = parent_run
            else:
                run = self._branch(state, parent_run, index)
        else:
            anchor = state.anchors.get(parent)
            if anchor is None:
                counts["orphan_stores"] += 1
                anchor = state.anchors[parent] = _Anchor(parent)
                state.recent.append(anchor)
            run = self._new_run(state, None, -1, anchor.base, anchor.lead)
            run.anchor = anchor
            run.floating = anchor.blocks is None
            anchor.runs.add(run)
        start = len(run.hashes)
        self._extend(state, run, hashes, packed)
        counts["stored_pages"] += n
        if state.anchors:
            for offset, value in enumerate(hashes):
                anchor = state.anchors.get(value)
                if anchor is not None and _root(run).anchor is not anchor:
                    # A page stores chained onto is stored after all (a chain that would
                    # contain itself, from a broken publisher, is left as it is).
                    del state.anchors[value]
                    self._adopt(state, anchor, run, start + offset)
        top = _root(run) if run.floating else None
        if top is not None and top.anchor is not None:
            anchor = top.anchor
            if anchor.tried_at < _NEEDLE_TOKENS and len(top.tokens) >= 2 * anchor.tried_at:
                # Now, and again as the run grows (engines that publish a page per event).
                anchor.tried_at = max(len(top.tokens), 1)
                self._locate(state, anchor)

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
        anchors = state.anchors
        for value in hashes:
            if value not in pages and value not in anchors:
                counts["unknown_removals"] += 1
        for value in hashes:
            where = pages.get(value)
            if where is not None:
                self._truncate(state, state.runs[where >> _INDEX_BITS], where & _INDEX_MASK)
            elif (anchor := anchors.get(value)) is not None:
                self._drop_anchor(state, anchor)

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

    def inferred_blocks(self, worker: Worker, seq_hashes: Sequence[int], depth: int) -> int:
        """How many of the first ``depth`` blocks of a prompt ``worker`` holds only by inference.

        Those come from a located anchor: the engine stored on top of them, but the frontend
        never saw them stored. An anchor's blocks lead its chain, so this is the length of the
        leading run of such blocks (binary search).
        """
        state = self._workers.get(worker)
        if state is None or not state.inferred or depth <= 0:
            return 0
        inferred, extra = state.inferred, state.extra
        lo, hi = 0, min(depth, len(seq_hashes))
        while lo < hi:
            mid = (lo + hi) // 2
            value = seq_hashes[mid]
            if inferred.get(value, 0) > extra.get(value, 0):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def note_routed(self, worker: Worker, token_ids: Sequence[int]) -> None:
        """A prompt was just routed to ``worker``: what it stores next may chain onto pages this
        index never saw, and the prompt says what they hold."""
        state = self._workers.get(worker)
        if state is None or len(token_ids) < 2 * state.page_size:
            return
        try:
            state.hints.append(token_view(token_ids).tobytes())
        except ValueError:  # token ids out of u32 range: nothing could be located with them
            return
        for anchor in list(state.recent):
            # A store that arrived before the prompt that explains it was noted.
            if anchor.blocks is None and state.anchors.get(anchor.hash) is anchor:
                self._locate(state, anchor, hints=(state.hints[-1],))

    def locate_anchor(self, worker: Worker, page_hash: int, prefix_tokens: Sequence[int]) -> bool:
        """Declare that ``worker``'s page ``page_hash`` (one stores chained onto, never seen
        stored) ends the prefix ``prefix_tokens``; False if there is no such floating anchor or
        the prefix is not whole pages."""
        state = self._workers.get(worker)
        anchor = state.anchors.get(page_hash) if state is not None else None
        if state is None or anchor is None or anchor.blocks is not None:
            return False
        if not prefix_tokens or len(prefix_tokens) % state.page_size:
            return False
        self._settle(state, anchor, token_array(list(prefix_tokens)))
        return True

    def stats(self) -> dict[str, int]:
        """Sizes and event counters: anomalies here mean the index is stale somewhere.

        ``orphan_stores``: stores onto a parent page never seen stored (missed history): kept
        under an anchor; ``anchors_located``: anchors whose prefix a routed prompt revealed;
        ``anchors_removed``: anchor pages the engine evicted (their inferred prefix went too);
        ``duplicate_stores``: stores of pages already cached (replays, missed removals);
        ``malformed_stores``: token count not pages × page size, repeated hashes, bad tokens;
        ``bad_block_size``: stores whose page size is not the registered one;
        ``unknown_removals``: removals of pages not indexed (normal after a dropped store
        or a removed ancestor).
        """
        states = self._workers.values()
        out = {
            "workers": len(self._workers),
            "blocks": len(self._blocks),
            "pages": sum(len(state.pages) for state in states),
            "floating_pages": sum(len(r.hashes) for state in states for r in state.runs.values() if r.floating),
            "anchors": sum(len(state.anchors) for state in states),
            "inferred_blocks": sum(len(state.inferred) for state in states),
        }
        out.update(self._counts)
        return out

    # -- internals -----------------------------------------------------------------------

    def _match(self, hashes: Sequence[int], offset: int, alive: int, result: dict[Worker, int]) -> int:
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
        if parent.floating:
            run = self._new_run(state, parent, index, None, token_array())
            run.floating = True
        else:
            base, lead = self._continuation(state, parent, index)
            run = self._new_run(state, parent, index, base, lead)
        parent.children.add(run)
        return run

    def _continuation(self, state: _WorkerState, run: _Run, index: int) -> tuple[int | None, array]:
        """``base`` and ``lead`` of a run continuing ``run`` after its page ``index``."""
        block = self._block
        through = (index + 1) * state.page_size
        lead_len = len(run.lead)
        done = (lead_len + through) // block
        if done == 0:
            return run.base, run.lead + run.tokens[:through]
        return run.blocks[done - 1], run.tokens[done * block - lead_len : through]

    def _extend(self, state: _WorkerState, run: _Run, hashes: Sequence[int], tokens: array) -> None:
        start = len(run.hashes)
        run.tokens.extend(tokens)
        run.hashes.extend(hashes)
        first = run.id << _INDEX_BITS | start
        state.pages.update(zip(hashes, range(first, first + len(hashes)), strict=True))
        if run.floating:
            return  # hashed once its anchor is located
        block = self._block
        lead_len = len(run.lead)
        have = len(run.tokens) - len(tokens)
        blocks = run.blocks
        partial = lead_len + have - len(blocks) * block
        if not partial:
            pending = tokens
        elif partial <= have:
            pending = run.tokens[have - partial : have] + tokens
        else:
            pending = run.lead + run.tokens
        base = blocks[-1] if blocks else run.base
        new = prefix_hashes_from_bytes(token_view(pending), block, base)
        if new:
            blocks.extend(new)
            self._hold(state, new)

    def _hold(self, state: _WorkerState, values: Iterable[int], *, inferred: bool = False) -> None:
        index = self._blocks
        bit = state.bit
        get = index.get
        extra = state.extra
        for value in values:
            mask = get(value, 0)
            if mask & bit:
                extra[value] = extra.get(value, 0) + 1
            else:
                index[value] = mask | bit
                state.held += 1
        if inferred:
            counts = state.inferred
            for value in values:
                counts[value] = counts.get(value, 0) + 1

    def _release(self, state: _WorkerState, values: Iterable[int], *, inferred: bool = False) -> None:
        index = self._blocks
        extra = state.extra
        keep = ~state.bit
        if inferred:
            counts = state.inferred
            for value in values:
                left = counts[value] - 1
                if left:
                    counts[value] = left
                else:
                    del counts[value]
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
            if run.parent is not None:
                run.parent.children.discard(run)
                run.parent = None
            elif run.anchor is not None:
                anchor = run.anchor
                anchor.runs.discard(run)
                run.anchor = None
                if not anchor.runs and anchor.blocks is None:
                    del state.anchors[anchor.hash]  # nothing known under it any more
            else:
                state.roots.discard(run)

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

    def _adopt(self, state: _WorkerState, anchor: _Anchor, run: _Run, index: int) -> None:
        """The anchor's page turned out to be page ``index`` of ``run``: its runs continue it."""
        if anchor.blocks is not None:
            self._release(state, anchor.blocks, inferred=True)
        if run.floating:
            stack = []
        else:
            base, lead = self._continuation(state, run, index)
            stack = [(child, base, lead) for child in anchor.runs]
        for child in anchor.runs:
            child.anchor = None
            child.parent = run
            child.parent_index = index
            run.children.add(child)
            if child.blocks:
                self._release(state, child.blocks)
                child.blocks = []
            child.floating = run.floating
            _float_subtree(self, state, child, run.floating)
        anchor.runs = set()
        self._hash_runs(state, stack)

    def _drop_anchor(self, state: _WorkerState, anchor: _Anchor) -> None:
        """The engine evicted the anchor's page: its inferred prefix and all under it are gone."""
        self._counts["anchors_removed"] += 1
        del state.anchors[anchor.hash]
        if anchor.blocks is not None:
            self._release(state, anchor.blocks, inferred=True)
        for run in list(anchor.runs):
            self._drop_subtree(state, run)
        anchor.runs = set()

    # -- locating anchors --------------------------------------------------------------------

    def _locate(self, state: _WorkerState, anchor: _Anchor, hints: Iterable[bytes] | None = None) -> bool:
        """Find the prefix of a floating anchor in the prompts recently routed to its worker.

        The runs stored on top of the anchor are what the engine computed after the prompt's
        cached prefix, so their tokens sit in the prompt right after the anchor's page: at a
        page-aligned position. When several prompts hold them after different prefixes (a short
        store, "Hi" after several system prompts), the one whose pages hash to the anchor's page
        as SGLang hashes (`engine_hash`) is taken; with no such proof, nothing is located (the
        store stays floating, matched by nothing).
        """
        run = max(anchor.runs, key=lambda r: len(r.tokens), default=None)
        if run is None or not run.tokens:
            return False
        page_bytes = 4 * state.page_size
        stored = token_view(run.tokens)
        needle = bytes(stored[: 4 * _NEEDLE_TOKENS])
        candidates: dict[bytes, None] = {}
        for hint in reversed(state.hints) if hints is None else hints:
            pos = hint.find(needle, page_bytes)
            while pos != -1:
                if pos % page_bytes == 0:
                    overlap = min(len(stored), len(hint) - pos)
                    if hint[pos : pos + overlap] == stored[:overlap]:
                        candidates[hint[:pos]] = None
                pos = hint.find(needle, pos + 1)
        if len(candidates) > 1:
            page_size = state.page_size
            candidates = {
                prefix: None
                for prefix in candidates
                if (value := sglang_prefix_hash(prefix, page_size)) is not None and same_engine_hash(value, anchor.hash)
            }
        if len(candidates) != 1:
            return False
        self._counts["anchors_located"] += 1
        self._settle(state, anchor, tokens_from_bytes(next(iter(candidates))))
        return True

    def _settle(self, state: _WorkerState, anchor: _Anchor, prefix: array) -> None:
        """The anchor's page ends ``prefix``: hold its blocks and hash every run under it."""
        block = self._block
        blocks = prefix_hashes_from_bytes(token_view(prefix), block)
        anchor.blocks = blocks
        anchor.base = blocks[-1] if blocks else None
        anchor.lead = prefix[len(blocks) * block :]
        self._hold(state, blocks, inferred=True)
        self._hash_runs(state, [(run, anchor.base, anchor.lead) for run in anchor.runs])

    def _hash_runs(self, state: _WorkerState, stack: list[tuple[_Run, int | None, array]]) -> None:
        """Give each floating run (and its descendants) its ``base`` and ``lead``, and hold its blocks."""
        block = self._block
        while stack:
            run, base, lead = stack.pop()
            run.floating = False
            run.base, run.lead = base, lead
            run.blocks = prefix_hashes_from_bytes(token_view(lead + run.tokens), block, base)
            self._hold(state, run.blocks)
            for child in run.children:
                stack.append((child, *self._continuation(state, run, child.parent_index)))

    def _clear(self, state: _WorkerState) -> None:
        index = self._blocks
        keep = ~state.bit
        held = [run.blocks for run in state.runs.values()]
        held += [anchor.blocks for anchor in state.anchors.values() if anchor.blocks]
        for blocks in held:
            for value in blocks:
                mask = index.get(value, 0) & keep
                if mask:
                    index[value] = mask
                else:
                    index.pop(value, None)
        for run in state.runs.values():
            _unlink(run)
        for anchor in state.anchors.values():
            anchor.runs = set()
        state.pages = {}
        state.runs = {}
        state.roots = set()
        state.anchors = {}
        state.extra = {}
        state.inferred = {}
        state.held = 0


def _root(run: _Run) -> _Run:
    while run.parent is not None:
        run = run.parent
    return run


def _float_subtree(index: KvIndex, state: _WorkerState, run: _Run, floating: bool) -> None:
    """Release the blocks below ``run`` and mark them floating (to be hashed again)."""
    stack = list(run.children)
    while stack:
        child = stack.pop()
        if child.blocks:
            index._release(state, child.blocks)
            child.blocks = []
        child.floating = floating
        stack.extend(child.children)


def _unlink(run: _Run) -> None:
    """Break a dropped run's parent/child cycle so its memory is freed at once, not by the GC."""
    run.parent = None
    run.anchor = None
    run.children = set()
