"""The mock engine's paged prefix cache: one per DP rank, with LRU eviction and KV events.

It models SGLang's radix cache closely enough for a KV-aware router to be tested against it:
only full pages are cached, pages referenced by running requests are never evicted, eviction
takes least-recently-used unreferenced leaves first, and every change is reported as the KV
events SGLang 0.5.23 publishes (coalesced ``BlockStored`` runs with chained SHA-256 hashes,
``BlockRemoved`` per eviction, ``AllBlocksCleared`` on flush).

Memory accounting covers the whole KV pool of ``num_blocks`` pages: cached pages plus pages
``allocate``-d for running requests (their tails not yet in the cache). A trie with one node
per page keeps every call O(pages touched).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from trio_direct.mock.kv_types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    page_hasher,
)

__all__ = ["RadixCache", "RadixNode"]


class RadixNode:
    """One cached page; also the handle ``match_prefix``/``insert`` return for locking.

    ``depth`` is the number of pages from the root to this node, so a handle's cached prefix
    is ``depth * page_size`` tokens.
    """

    __slots__ = (
        "children",
        "depth",
        "digest",
        "evicted",
        "hash",
        "key",
        "last_access",
        "lock_ref",
        "parent",
    )

    def __init__(
        self,
        key: object,
        parent: RadixNode | None,
        depth: int,
        digest: bytes,
        block_hash: int | None,
    ) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[object, RadixNode] = {}
        self.depth = depth
        self.digest = digest
        self.hash = block_hash
        self.lock_ref = 0
        self.last_access = 0
        self.evicted = False

    def __repr__(self) -> str:
        return f"RadixNode(depth={self.depth}, hash={self.hash}, lock_ref={self.lock_ref})"


class RadixCache:
    """Paged prefix cache with LRU eviction over ``num_blocks`` pages of ``page_size`` tokens.

    Mutating calls record their KV events in order; ``drain_events`` hands them out, so a
    removal and a later re-store of the same page always reach subscribers in that order.
    """

    def __init__(self, num_blocks: int, page_size: int = 1, *, emit_events: bool = True) -> None:
        if num_blocks < 1 or page_size < 1:
            raise ValueError("num_blocks and page_size must be >= 1")
        self._capacity = num_blocks
        self._page_size = page_size
        self._emit = emit_events
        self._hash_page = page_hasher(page_size)
        self._root = RadixNode(None, None, 0, b"", None)
        self._root.lock_ref = 1  # never evicted, never counted
        self._free = num_blocks
        self._cached = 0
        self._allocated = 0
        self._evictable = 0
        self._tick = 0
        self._seq = 0  # heap tie-break: older pushes first
        # Candidate leaves as (last_access, seq, node); stale entries are skipped on pop.
        self._heap: list[tuple[int, int, RadixNode]] = []
        self._events: list[KvEvent] = []
        self._inserts = 0

    # -- sizes ---------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Total pages in the KV pool."""
        return self._capacity

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def used_pages(self) -> int:
        """Pages holding KV: cached pages plus pages allocated to running requests."""
        return self._cached + self._allocated

    @property
    def cached_pages(self) -> int:
        return self._cached

    @property
    def allocated_pages(self) -> int:
        return self._allocated

    @property
    def evictable_pages(self) -> int:
        """Cached pages no running request references."""
        return self._evictable

    @property
    def free_pages(self) -> int:
        return self._free

    @property
    def active_pages(self) -> int:
        """Pages in use by running requests (what SGLang reports as used)."""
        return self._cached + self._allocated - self._evictable

    @property
    def insert_count(self) -> int:
        """Bumped by every insert that stored a page; lets callers reuse a stale match."""
        return self._inserts

    @property
    def root(self) -> RadixNode:
        """The empty-prefix handle."""
        return self._root

    # -- lookups -------------------------------------------------------------------------

    def match_prefix(self, token_ids: Sequence[int], max_tokens: int | None = None) -> tuple[int, RadixNode]:
        """Longest cached full-page prefix of ``token_ids[:max_tokens]``: (tokens, handle).

        Refreshes the matched pages' LRU position.
        """
        page = self._page_size
        n = len(token_ids) if max_tokens is None else min(len(token_ids), max_tokens)
        end = n - n % page
        node = self._root
        self._tick += 1
        tick = self._tick
        if page == 1:
            for i in range(end):
                child = node.children.get(token_ids[i])
                if child is None:
                    break
                node = child
                node.last_access = tick
        else:
            for start in range(0, end, page):
                child = node.children.get(tuple(token_ids[start : start + page]))
                if child is None:
                    break
                node = child
                node.last_access = tick
        if node.lock_ref == 0 and not node.children:
            self._push(node)
        return node.depth * page, node

    def unlocked_depth(self, node: RadixNode) -> int:
        """How many pages of ``node``'s path no request references (what locking it costs)."""
        count = 0
        while node.lock_ref == 0:
            count += 1
            node = node.parent  # type: ignore[assignment]  # root is always locked
        return count

    # -- references ----------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """Pin the path root..``node``: none of its pages can be evicted until ``unlock``."""
        while node is not self._root:
            if node.lock_ref == 0:
                self._evictable -= 1
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: RadixNode) -> None:
        """Release one ``lock`` of the same handle."""
        leaf = node
        while node is not self._root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += 1
            node = node.parent  # type: ignore[assignment]
        if leaf is not self._root and leaf.lock_ref == 0 and not leaf.children:
            self._push(leaf)

    # -- storing -------------------------------------------------------------------------

    def insert(self, token_ids: Sequence[int]) -> RadixNode:
        """Cache every full page of ``token_ids``; returns the handle of the deepest page.

        Pages already cached are refreshed; new ones are taken from free pages (a caller moving
        a request's own pages into the cache ``free``-s them first) and reported as one
        coalesced ``BlockStored``. When no free page is left the rest is not cached.
        """
        page = self._page_size
        end = len(token_ids) - len(token_ids) % page
        node = self._root
        self._tick += 1
        tick = self._tick
        run_start = -1
        run_parent: int | None = None
        run_hashes: list[int] = []
        emit = self._emit
        hash_page = self._hash_page
        for start in range(0, end, page):
            key: object = token_ids[start] if page == 1 else tuple(token_ids[start : start + page])
            child = node.children.get(key)
            if child is None:
                if self._free < 1:
                    break
                if emit:
                    digest, block_hash = hash_page(node.digest, token_ids, start)
                    run_hashes.append(block_hash)
                    child = RadixNode(key, node, node.depth + 1, digest, block_hash)
                else:
                    child = RadixNode(key, node, node.depth + 1, b"", None)
                node.children[key] = child
                self._free -= 1
                self._cached += 1
                self._evictable += 1
                if run_start < 0:
                    run_start = start
                    run_parent = node.hash
            child.last_access = tick
            node = child
        if node.lock_ref == 0 and not node.children:
            self._push(node)
        if run_start >= 0:
            self._inserts += 1
            if emit:
                run_end = run_start + len(run_hashes) * page
                self._record(
                    BlockStored(
                        block_hashes=tuple(run_hashes),
                        parent_block_hash=run_parent,
                        token_ids=tuple(token_ids[run_start:run_end]),
                        block_size=page,
                    )
                )
        return node

    # -- running requests' pages ---------------------------------------------------------

    def can_allocate(self, n_pages: int) -> bool:
        """Whether ``allocate(n_pages)`` would succeed (free plus evictable pages)."""
        return n_pages <= self._free + self._evictable

    def allocate(self, n_pages: int) -> bool:
        """Reserve pages for running requests, evicting LRU unreferenced leaves if needed.

        Returns False, changing nothing, when even evicting every unreferenced page is not
        enough.
        """
        if n_pages <= self._free:
            self._free -= n_pages
            self._allocated += n_pages
            return True
        if n_pages > self._free + self._evictable:
            return False
        self._evict(n_pages - self._free)
        if n_pages > self._free:  # only if the bookkeeping were wrong
            raise RuntimeError("radix cache accounting is inconsistent")
        self._free -= n_pages
        self._allocated += n_pages
        return True

    def free(self, n_pages: int) -> None:
        """Return pages reserved with ``allocate``."""
        if n_pages > self._allocated:
            raise ValueError(f"freeing {n_pages} pages but only {self._allocated} allocated")
        self._allocated -= n_pages
        self._free += n_pages

    def evict(self, n_pages: int) -> int:
        """Evict up to ``n_pages`` unreferenced pages (LRU leaves first); returns how many."""
        return self._evict(n_pages)

    def clear(self) -> None:
        """Drop every cached page (SGLang's flush) and record ``AllBlocksCleared``.

        Refused while a request references the cache: its pages could not be dropped.
        """
        if self._evictable != self._cached:
            raise RuntimeError("cannot clear the prefix cache while requests reference it")
        self._free += self._cached
        self._cached = 0
        self._evictable = 0
        self._root.children = {}
        self._heap = []
        self._inserts += 1
        if self._emit:
            self._record(AllBlocksCleared())

    def drain_events(self) -> list[KvEvent]:
        """The KV events recorded since the last call, oldest first."""
        events = self._events
        self._events = []
        return events

    # -- internals -----------------------------------------------------------------------

    def _push(self, node: RadixNode) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (node.last_access, self._seq, node))
        if len(self._heap) > 4 * self._cached + 1024:
            self._compact()

    def _compact(self) -> None:
        seen: set[int] = set()
        keep = []
        for entry in self._heap:
            node = entry[2]
            if (
                not node.evicted
                and not node.children
                and node.lock_ref == 0
                and entry[0] == node.last_access
                and id(node) not in seen
            ):
                seen.add(id(node))
                keep.append(entry)
        heapq.heapify(keep)
        self._heap = keep

    def _evict(self, n_pages: int) -> int:
        heap = self._heap
        root = self._root
        removed: list[int] = []
        count = 0
        while count < n_pages and heap:
            tick, _, node = heapq.heappop(heap)
            if node.evicted or node.children or node.lock_ref or tick != node.last_access:
                continue
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.evicted = True
            self._cached -= 1
            self._evictable -= 1
            self._free += 1
            count += 1
            if node.hash is not None:
                removed.append(node.hash)
            if parent is not root and not parent.children and parent.lock_ref == 0:
                self._seq += 1
                heapq.heappush(heap, (parent.last_access, self._seq, parent))
        if removed:
            self._record(BlockRemoved(block_hashes=tuple(removed)))
        return count

    def _record(self, event: KvEvent) -> None:
        """Append an event, coalescing with the previous one as SGLang 0.5.19+ does."""
        events = self._events
        if events:
            last = events[-1]
            if (
                type(event) is BlockStored
                and type(last) is BlockStored
                and event.parent_block_hash is not None
                and event.parent_block_hash == last.block_hashes[-1]
            ):
                events[-1] = BlockStored(
                    block_hashes=last.block_hashes + event.block_hashes,
                    parent_block_hash=last.parent_block_hash,
                    token_ids=last.token_ids + event.token_ids,
                    block_size=last.block_size,
                )
                return
            if type(event) is BlockRemoved and type(last) is BlockRemoved:
                events[-1] = BlockRemoved(block_hashes=last.block_hashes + event.block_hashes)
                return
        events.append(event)
