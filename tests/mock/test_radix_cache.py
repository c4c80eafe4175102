"""The mock engine's prefix cache: SGLang block hashes, prefix reuse, LRU eviction, events."""

from __future__ import annotations

import pytest

from trio_direct.mock.kv_types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    block_hash_chain,
)
from trio_direct.mock.radix_cache import RadixCache

# kv-events.md §6 test vectors (SGLang 0.5.9+ chained SHA-256, no namespace).
VECTOR_PAGE_2 = [3817746824117602890, -4216701448867210342]
VECTOR_PAGE_1 = [
    7470307888890966271,
    -1634645291211865391,
    7325169757385981536,
    -4123756397210254169,
]


def test_block_hash_chain_reproduces_sglang_vectors() -> None:
    assert block_hash_chain([1, 2, 3, 4], 2)[0] == VECTOR_PAGE_2
    assert block_hash_chain([1, 2, 3, 4], 1)[0] == VECTOR_PAGE_1


def test_block_hash_chain_continues_from_a_parent_digest_and_ignores_the_tail() -> None:
    first, digest = block_hash_chain([1, 2], 2)
    rest, _ = block_hash_chain([3, 4, 5], 2, digest)
    assert first + rest == VECTOR_PAGE_2


def test_block_hash_chain_rejects_ids_it_cannot_encode() -> None:
    with pytest.raises(ValueError):
        block_hash_chain([1 << 32], 1)


def test_insert_emits_one_coalesced_block_stored_with_sglang_hashes() -> None:
    cache = RadixCache(num_blocks=16, page_size=2)
    cache.insert([1, 2, 3, 4, 5])  # the half page (5) is not cached
    assert cache.drain_events() == [
        BlockStored(
            block_hashes=tuple(VECTOR_PAGE_2),
            parent_block_hash=None,
            token_ids=(1, 2, 3, 4),
            block_size=2,
        )
    ]
    assert cache.cached_pages == 2
    assert cache.drain_events() == []


def test_insert_of_an_extension_names_the_cached_parent() -> None:
    cache = RadixCache(num_blocks=16, page_size=2)
    cache.insert([1, 2, 3, 4])
    cache.drain_events()
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8])
    cache.insert([1, 2, 9, 9])  # a branch after the first page
    stored_ext, stored_branch = cache.drain_events()
    assert isinstance(stored_ext, BlockStored) and isinstance(stored_branch, BlockStored)
    assert stored_ext.parent_block_hash == VECTOR_PAGE_2[1]
    assert stored_ext.token_ids == (5, 6, 7, 8)
    assert list(stored_ext.block_hashes) == block_hash_chain([1, 2, 3, 4, 5, 6, 7, 8], 2)[0][2:]
    assert stored_branch.parent_block_hash == VECTOR_PAGE_2[0]
    assert stored_branch.token_ids == (9, 9)
    assert len(stored_ext.token_ids) == len(stored_ext.block_hashes) * stored_ext.block_size


def test_consecutive_stores_of_one_chain_are_merged_like_sglang() -> None:
    cache = RadixCache(num_blocks=16, page_size=1)
    cache.insert([1, 2])
    cache.insert([1, 2, 3, 4])
    assert cache.drain_events() == [
        BlockStored(tuple(VECTOR_PAGE_1), None, (1, 2, 3, 4), 1),
    ]


def test_match_prefix_returns_the_longest_cached_full_page_prefix() -> None:
    cache = RadixCache(num_blocks=16, page_size=2)
    assert cache.match_prefix([1, 2, 3])[0] == 0
    cache.insert([1, 2, 3, 4, 5, 6])
    assert cache.match_prefix([1, 2, 3, 4, 9, 9])[0] == 4
    assert cache.match_prefix([1, 2, 3, 4, 5])[0] == 4  # 5 alone is not a full page
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])[0] == 6
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], max_tokens=5)[0] == 4
    assert cache.match_prefix([7, 7])[0] == 0


def test_allocate_evicts_least_recently_used_leaves_first() -> None:
    cache = RadixCache(num_blocks=4, page_size=1)
    cache.insert([1, 2])
    cache.insert([3, 4])
    hashes_a, _ = block_hash_chain([1, 2], 1)
    hashes_b, _ = block_hash_chain([3, 4], 1)
    cache.drain_events()
    cache.match_prefix([1, 2])  # A is now more recent than B
    assert cache.free_pages == 0

    assert cache.allocate(1)
    assert cache.drain_events() == [BlockRemoved((hashes_b[1],))]  # B's leaf first
    assert cache.allocate(2)
    # B's first page, then A's leaf: one removal per eviction pass, leaves before parents.
    assert cache.drain_events() == [BlockRemoved((hashes_b[0], hashes_a[1]))]
    assert cache.match_prefix([1, 2])[0] == 1
    assert cache.match_prefix([3])[0] == 0
    assert (cache.allocated_pages, cache.cached_pages, cache.free_pages) == (3, 1, 0)


def test_locked_pages_survive_eviction() -> None:
    cache = RadixCache(num_blocks=4, page_size=1)
    cache.insert([1, 2])
    _, handle = cache.match_prefix([1, 2])
    cache.lock(handle)
    cache.insert([3, 4])
    cache.drain_events()
    assert cache.evictable_pages == 2

    assert not cache.allocate(3)  # would need a locked page: refused, nothing evicted
    assert cache.drain_events() == []
    assert cache.cached_pages == 4

    assert cache.allocate(2)
    assert cache.drain_events() == [BlockRemoved(tuple(reversed(block_hash_chain([3, 4], 1)[0])))]
    assert cache.match_prefix([1, 2])[0] == 2
    assert cache.match_prefix([3, 4])[0] == 0

    cache.unlock(handle)
    cache.free(2)
    assert cache.allocate(4)
    assert cache.cached_pages == 0
    removed = cache.drain_events()
    assert removed == [BlockRemoved(tuple(reversed(block_hash_chain([1, 2], 1)[0])))]


def test_a_shared_prefix_stays_while_any_branch_is_locked() -> None:
    cache = RadixCache(num_blocks=8, page_size=1)
    node = cache.insert([1, 2, 3])
    cache.insert([1, 2, 9])
    cache.lock(node)
    assert cache.evictable_pages == 1  # only the 9 branch
    assert cache.unlocked_depth(node) == 0
    assert cache.evict(5) == 1
    assert cache.match_prefix([1, 2, 3])[0] == 3
    cache.unlock(node)
    assert cache.unlocked_depth(node) == 3
    assert cache.evict(5) == 3


def test_insert_takes_only_free_pages() -> None:
    cache = RadixCache(num_blocks=3, page_size=1)
    assert cache.allocate(1)
    node = cache.insert([1, 2, 3, 4])
    assert node.depth == 2
    assert cache.used_pages == 3
    (stored,) = cache.drain_events()
    assert isinstance(stored, BlockStored) and stored.token_ids == (1, 2)


def test_clear_flushes_everything_unless_referenced() -> None:
    cache = RadixCache(num_blocks=8, page_size=1)
    node = cache.insert([1, 2, 3])
    cache.lock(node)
    with pytest.raises(RuntimeError):
        cache.clear()
    cache.unlock(node)
    cache.drain_events()
    cache.clear()
    assert cache.drain_events() == [AllBlocksCleared()]
    assert cache.cached_pages == 0 and cache.free_pages == 8
    assert cache.match_prefix([1, 2, 3])[0] == 0


def test_free_more_than_allocated_is_a_bug() -> None:
    cache = RadixCache(num_blocks=4)
    assert cache.allocate(2)
    with pytest.raises(ValueError):
        cache.free(3)


def test_events_can_be_switched_off() -> None:
    cache = RadixCache(num_blocks=4, page_size=1, emit_events=False)
    cache.insert([1, 2, 3, 4])
    assert cache.allocate(2)
    assert cache.drain_events() == []
    assert cache.cached_pages == 2


def test_many_touches_keep_eviction_exact() -> None:
    """Repeated hits on one prefix must not evict it ahead of a colder one."""
    cache = RadixCache(num_blocks=64, page_size=1)
    cache.insert([100, 101])
    for i in range(20):
        cache.insert([i, 200 + i])
    for _ in range(3000):  # many stale heap entries
        cache.match_prefix([100, 101])
    cache.evict(40)  # everything but the hot prefix
    assert cache.match_prefix([100, 101])[0] == 2
    assert cache.cached_pages == 2
