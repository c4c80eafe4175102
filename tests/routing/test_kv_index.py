"""The KV index answers "how much of this prompt does each worker cache" from engine events."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_direct.mock.kv_types import AllBlocksCleared, BlockRemoved, BlockStored, block_hash_chain
from trio_direct.mock.radix_cache import RadixCache
from trio_direct.routing.block_hash import RoutingKey, prefix_hashes
from trio_direct.routing.kv_index import KvIndex

A = RoutingKey("engine-a", 0)
B = RoutingKey("engine-b", 0)
C = RoutingKey("engine-b", 1)


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(150_000) for _ in range(n)]


def stored(token_ids, page_size, parent_tokens=()):
    """The BlockStored SGLang publishes for ``token_ids`` cached after ``parent_tokens``."""
    parent_hashes, digest = block_hash_chain(list(parent_tokens), page_size)
    hashes, _ = block_hash_chain(list(token_ids), page_size, digest)
    return BlockStored(
        block_hashes=tuple(hashes),
        parent_block_hash=parent_hashes[-1] if parent_hashes else None,
        token_ids=tuple(token_ids),
        block_size=page_size,
    )


def page_hash(prefix, page_size, page):
    return block_hash_chain(list(prefix), page_size)[0][page]


def feed(index: KvIndex, worker, cache: RadixCache) -> None:
    for event in cache.drain_events():
        index.apply(worker, event)


def index_with(*workers, block_size=16, page_size=16) -> KvIndex:
    index = KvIndex(block_size)
    for worker in workers:
        index.register_worker(worker, page_size)
    return index


# -- stores and matches ------------------------------------------------------------------


def test_a_cached_prompt_matches_in_full_blocks():
    index = index_with(A)
    prompt = tokens(1, 64 + 5)
    index.apply_stored(A, stored(prompt[:64], 16))
    assert index.find_matches(prompt) == {A: 4}
    assert index.find_matches(prompt[:40] + tokens(2, 40)) == {A: 2}
    assert index.find_matches(prompt[:15]) == {}
    assert index.find_matches(tokens(3, 64)) == {}
    assert index.num_blocks == 4 and index.held_blocks(A) == 4


def test_cached_pages_add_no_objects_for_the_garbage_collector():
    # A page-size-1 engine caches millions of pages; were each one a GC-tracked object, every
    # full collection would stall the event loop (100-150 ms at 800k pages).
    import gc

    index = index_with(A, page_size=1)
    prompt = tokens(7, 4096)
    gc.collect()
    before = len(gc.get_objects())
    index.apply_stored(A, stored(prompt[:2048], 1))
    index.apply_stored(A, stored(prompt[2048:], 1, parent_tokens=prompt[:2048]))
    assert index.find_matches(prompt) == {A: 4096 // 16}
    assert len(gc.get_objects()) - before < 50


def test_stores_continuing_a_chain_extend_the_match():
    index = index_with(A)
    prompt = tokens(1, 96)
    index.apply_stored(A, stored(prompt[:32], 16))
    index.apply_stored(A, stored(prompt[32:64], 16, prompt[:32]))
    index.apply_stored(A, stored(prompt[64:96], 16, prompt[:64]))
    assert index.find_matches(prompt) == {A: 6}


def test_a_shared_prefix_credits_both_workers_as_far_as_each_goes():
    index = index_with(A, B)
    system, q1, q2 = tokens(1, 48), tokens(2, 32), tokens(3, 32)
    index.apply_stored(A, stored(system + q1, 16))
    index.apply_stored(B, stored(system, 16))
    index.apply_stored(B, stored(q2, 16, system))
    assert index.find_matches(system + q1) == {A: 5, B: 3}
    assert index.find_matches(system + q2) == {A: 3, B: 5}
    assert index.num_blocks == 3 + 2 + 2


def test_branches_inside_one_worker_are_both_matched():
    index = index_with(A)
    trunk, left, right = tokens(1, 32), tokens(2, 32), tokens(3, 16)
    index.apply_stored(A, stored(trunk + left, 16))
    index.apply_stored(A, stored(right, 16, trunk))
    assert index.find_matches(trunk + left) == {A: 4}
    assert index.find_matches(trunk + right) == {A: 3}


def test_find_matches_hashes_reuses_one_hashing_of_the_prompt():
    index = index_with(A, B)
    prompt = tokens(1, 80)
    index.apply_stored(A, stored(prompt, 16))
    index.apply_stored(B, stored(prompt[:32], 16))
    hashes = prefix_hashes(prompt, 16)
    assert index.find_matches_hashes(hashes) == index.find_matches(prompt) == {A: 5, B: 2}
    assert index.find_matches_hashes([]) == {}


def test_long_prompts_are_matched_past_the_first_hashing_chunk():
    index = index_with(A, B)
    prompt = tokens(1, 16 * 300)
    index.apply_stored(A, stored(prompt, 16))
    index.apply_stored(B, stored(prompt[: 16 * 100], 16))
    assert index.find_matches(prompt + [1, 2, 3]) == {A: 300, B: 100}


def test_many_workers_each_credited_with_exactly_where_it_stops():
    rng = random.Random(5)
    prompt = tokens(1, 4 * 700)
    held = {RoutingKey(f"e{i}", rank): rng.randrange(1, 701) for i in range(20) for rank in (0, 1)}
    held[RoutingKey("e0", 0)] = held[RoutingKey("e0", 1)]  # two drop out together
    index = KvIndex(4)
    for worker, blocks in held.items():
        index.register_worker(worker, 2)
        index.apply_stored(worker, stored(prompt[: 4 * blocks], 2))
    assert index.find_matches(prompt) == held
    assert index.find_matches_hashes(prefix_hashes(prompt, 4)) == held
    cut = 4 * 333 + 1
    assert index.find_matches(prompt[:cut]) == {w: min(n, 333) for w, n in held.items()}


# -- removals ----------------------------------------------------------------------------


def test_removing_a_middle_page_drops_the_tail_for_that_worker_only():
    index = index_with(A, B)
    prompt = tokens(1, 128)
    index.apply_stored(A, stored(prompt, 16))
    index.apply_stored(B, stored(prompt, 16))
    index.apply_removed(A, BlockRemoved((page_hash(prompt, 16, 3),)))
    assert index.find_matches(prompt) == {A: 3, B: 8}
    assert index.held_blocks(A) == 3
    # The tail's own removals arrive later: nothing left to do, counted as unknown.
    index.apply_removed(A, BlockRemoved(tuple(block_hash_chain(prompt, 16)[0][4:])))
    assert index.find_matches(prompt) == {A: 3, B: 8}
    assert index.stats()["unknown_removals"] == 4


def test_removing_a_token_page_drops_the_routing_block_that_contains_it():
    index = index_with(A, block_size=16, page_size=1)
    prompt = tokens(1, 64)
    index.apply_stored(A, stored(prompt, 1))
    assert index.find_matches(prompt) == {A: 4}
    index.apply_removed(A, BlockRemoved((page_hash(prompt, 1, 37),)))
    assert index.find_matches(prompt) == {A: 2}
    # Re-storing the evicted tail from its parent page restores the match.
    index.apply_stored(A, stored(prompt[37:], 1, prompt[:37]))
    assert index.find_matches(prompt) == {A: 4}


def test_removing_a_branch_point_drops_every_branch_after_it():
    index = index_with(A, block_size=8, page_size=2)
    trunk, left, right = tokens(1, 6), tokens(2, 10), tokens(3, 10)
    index.apply_stored(A, stored(trunk + left, 2))
    index.apply_stored(A, stored(right, 2, trunk))
    assert index.find_matches(trunk + right) == {A: 2}
    index.apply_removed(A, BlockRemoved((page_hash(trunk, 2, 2),)))  # trunk tokens 4..5
    assert index.find_matches(trunk + left) == {}
    assert index.find_matches(trunk + right) == {}
    assert index.num_blocks == 0
    # The children went with it: storing under them is now an orphan.
    index.apply_stored(A, stored(tokens(4, 2), 2, trunk + right))
    assert index.stats()["orphan_stores"] == 1


def test_removing_everything_empties_the_index():
    index = index_with(A, B, C, block_size=16, page_size=4)
    stores = {}
    for i, worker in enumerate((A, B, C)):
        shared = tokens(100, 64)
        own = tokens(i, 4 * random.Random(i).randrange(1, 40))
        stores[worker] = shared + own
        index.apply_stored(worker, stored(shared, 4))
        index.apply_stored(worker, stored(own, 4, shared))
    assert index.num_blocks > 4
    for worker, prompt in stores.items():
        hashes = block_hash_chain(prompt, 4)[0]
        index.apply_removed(worker, BlockRemoved(tuple(reversed(hashes))))
    assert index.num_blocks == 0
    assert index.stats()["pages"] == 0
    assert all(index.held_blocks(w) == 0 for w in (A, B, C))


def test_the_same_tokens_under_two_engine_chains_stay_matched_until_both_go():
    # e.g. one prompt cached under two LoRA namespaces: different engine hashes, same tokens.
    index = index_with(A)
    prompt = tokens(1, 32)
    first = stored(prompt, 16)
    second = BlockStored((11, 12), None, tuple(prompt), 16)
    index.apply_stored(A, first)
    index.apply_stored(A, second)
    assert index.num_blocks == 2 and index.held_blocks(A) == 2
    index.apply_removed(A, BlockRemoved(first.block_hashes[:1]))
    assert index.find_matches(prompt) == {A: 2}
    index.apply_removed(A, BlockRemoved((11,)))
    assert index.find_matches(prompt) == {}
    assert index.num_blocks == 0


# -- clears, workers, bad events ---------------------------------------------------------


def test_clear_and_remove_worker():
    index = index_with(A, B)
    prompt = tokens(1, 64)
    index.apply_stored(A, stored(prompt, 16))
    index.apply_stored(B, stored(prompt, 16))
    index.apply(A, AllBlocksCleared())
    assert index.find_matches(prompt) == {B: 4}
    index.remove_worker(B)
    assert index.find_matches(prompt) == {}
    assert index.num_blocks == 0
    assert index.workers() == [A]
    # A worker registered later does not inherit anything of the removed one.
    index.register_worker(C, 16)
    index.apply_stored(C, stored(prompt[:16], 16))
    assert index.find_matches(prompt) == {C: 1}
    index.remove_worker(RoutingKey("never-registered"))


def test_events_after_a_clear_rebuild_from_the_root():
    index = index_with(A)
    prompt = tokens(1, 64)
    index.apply_stored(A, stored(prompt, 16))
    index.clear_worker(A)
    index.apply_stored(A, stored(prompt[32:], 16, prompt[:32]))  # parent gone with the clear
    assert index.stats()["orphan_stores"] == 1
    assert index.find_matches(prompt) == {}  # where the floating pages sit is unknown yet
    index.apply_stored(A, stored(prompt[:32], 16))  # the parent is stored after all
    assert index.find_matches(prompt) == {A: 4}
    assert index.inferred_blocks(A, prefix_hashes(prompt, 16), 4) == 0


def test_a_store_whose_parent_is_unknown_is_counted_and_ignored():
    index = index_with(A)
    prompt = tokens(1, 64)
    index.apply_stored(A, stored(prompt[32:], 16, prompt[:32]))  # missed the first event
    assert index.find_matches(prompt) == {}
    assert index.find_matches(prompt[32:]) == {}
    assert index.stats()["orphan_stores"] == 1
    assert index.num_blocks == 0


def test_a_replayed_store_is_counted_once_and_changes_nothing():
    index = index_with(A)
    prompt = tokens(1, 64)
    event = stored(prompt, 16)
    index.apply_stored(A, event)
    index.apply_stored(A, event)
    assert index.stats()["duplicate_stores"] == 1
    index.apply_removed(A, BlockRemoved(event.block_hashes[:1]))
    assert index.find_matches(prompt) == {}
    assert index.num_blocks == 0


def test_malformed_stores_are_counted_and_ignored():
    index = index_with(A)
    index.apply_stored(A, BlockStored((1, 2), None, tuple(range(16)), 16))  # 2 pages, 1 of tokens
    index.apply_stored(A, BlockStored((1, 1), None, tuple(range(32)), 16))  # self-referencing
    index.apply_stored(A, BlockStored((1,), None, (-1,) * 16, 16))  # not a u32 token
    index.apply_stored(A, BlockStored((), None, (), 16))  # nothing stored
    assert index.stats()["malformed_stores"] == 3
    assert index.num_blocks == 0 and index.stats()["pages"] == 0


def test_a_block_size_other_than_the_registered_page_size_is_rejected(caplog):
    index = index_with(A, block_size=16, page_size=16)
    prompt = tokens(1, 32)
    with caplog.at_level(logging.WARNING, logger="trio_direct.routing.kv_index"):
        index.apply_stored(A, stored(prompt, 1))
        index.apply_stored(A, stored(prompt, 1))
    assert index.stats()["bad_block_size"] == 2
    assert len(caplog.records) == 1  # one warning, not one per event
    assert index.find_matches(prompt) == {}


def test_routing_block_must_be_a_multiple_of_the_page_size():
    with pytest.raises(ValueError):
        KvIndex(0)
    index = KvIndex(16)
    for page_size in (0, 3, 32):
        with pytest.raises(ValueError):
            index.register_worker(A, page_size)
    index.register_worker(A, 8)
    index.apply_stored(A, stored(tokens(1, 16), 8))
    index.register_worker(A, 8)  # same configuration: nothing changes
    assert index.num_blocks == 1
    index.register_worker(A, 4)  # engine restarted with another page size: start over
    assert index.num_blocks == 0


def test_the_frontend_decoders_events_are_applied_by_type():
    from trio_direct.routing import kv_events

    index = index_with(A, block_size=4, page_size=2)
    index.apply(A, kv_events.BlockStored((1, 2, 3), None, (5, 6, 7, 8, 9, 10), 2))
    assert index.find_matches([5, 6, 7, 8, 9, 10, 11, 12]) == {A: 1}
    index.apply(A, kv_events.BlockRemoved((2,)))
    assert index.find_matches([5, 6, 7, 8]) == {}
    index.apply(A, kv_events.BlockStored((4,), 1, (7, 8), 2))
    assert index.find_matches([5, 6, 7, 8]) == {A: 1}
    index.apply(A, kv_events.AllBlocksCleared())
    assert index.num_blocks == 0


def test_events_for_unregistered_workers_are_counted_and_ignored():
    index = KvIndex(16)
    index.apply_stored(A, stored(tokens(1, 16), 16))
    index.apply_removed(A, BlockRemoved((1,)))
    index.clear_worker(A)
    assert index.stats()["unknown_worker_events"] == 3
    with pytest.raises(TypeError):
        index.apply(A, object())


# -- page-1 engines ----------------------------------------------------------------------


def conversation_prompts(seed: int, count: int) -> list[list[int]]:
    """Prompts sharing system prompts and earlier turns, as chat traffic does."""
    rng = random.Random(seed)
    systems = [tokens(seed * 100 + i, rng.randrange(20, 70)) for i in range(3)]
    prompts: list[list[int]] = []
    for _ in range(count):
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            base = base[: rng.randrange(len(base) + 1)]
        else:
            base = list(rng.choice(systems))
        prompts.append(base + [rng.randrange(50) for _ in range(rng.randrange(1, 60))])
    return prompts


def test_a_page_1_engine_indexes_like_a_page_16_engine():
    index = KvIndex(16)
    index.register_worker(A, 1)
    index.register_worker(B, 16)
    fine, coarse = RadixCache(100_000, page_size=1), RadixCache(100_000, page_size=16)
    prompts = conversation_prompts(1, 60)
    for prompt in prompts:
        fine.insert(prompt)
        coarse.insert(prompt)
        feed(index, A, fine)
        feed(index, B, coarse)
    assert index.held_blocks(A) == index.held_blocks(B) == index.num_blocks > 0
    for probe in prompts + conversation_prompts(2, 30):
        matches = index.find_matches(probe)
        assert matches.get(A) == matches.get(B)
        assert matches.get(A, 0) == coarse.match_prefix(probe)[0] // 16


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_index_follows_an_evicting_engine(page_size):
    index = KvIndex(16)
    index.register_worker(A, page_size)
    cache = RadixCache(600 // page_size, page_size=page_size)
    rng = random.Random(page_size)
    prompts = conversation_prompts(3, 120)
    for i, prompt in enumerate(prompts):
        cache.evict(rng.randrange(len(prompt) // page_size + 1))
        cache.insert(prompt)
        if i % 17 == 5:
            cache.clear()
        feed(index, A, cache)
        for probe in (prompt, rng.choice(prompts)):
            assert index.find_matches(probe).get(A, 0) == cache.match_prefix(probe)[0] // 16
    stats = index.stats()
    assert stats["orphan_stores"] == stats["duplicate_stores"] == stats["unknown_removals"] == 0


# -- against a brute-force model ---------------------------------------------------------


class Model:
    """Per worker: engine page hash -> (parent hash, page tokens); no cleverness at all.

    A page whose chain ends at a parent never stored floats: it matches nothing until that
    parent is located (``anchors``: parent hash -> the prefix through it), which then also
    holds its prefix as long as the parent page is not removed.
    """

    def __init__(self, page_sizes: dict[str, int]) -> None:
        self.page_sizes = page_sizes
        self.pages: dict[str, dict[int, tuple[int | None, tuple[int, ...]]]] = {w: {} for w in page_sizes}
        self.anchors: dict[str, dict[int, list[int]]] = {w: {} for w in page_sizes}

    def store(self, worker: str, event: BlockStored) -> None:
        pages, size = self.pages[worker], self.page_sizes[worker]
        hashes = event.block_hashes
        if event.block_size != size or len(event.token_ids) != len(hashes) * size:
            return
        if len(set(hashes)) != len(hashes) or any(h in pages for h in hashes):
            return
        parent = event.parent_block_hash
        for i, value in enumerate(hashes):
            pages[value] = (parent, tuple(event.token_ids[i * size : (i + 1) * size]))
            parent = value
            self.anchors[worker].pop(value, None)  # the real page replaces the inferred prefix

    def remove(self, worker: str, hashes) -> None:
        pages = self.pages[worker]
        for value in hashes:
            if value in pages:
                doomed = {h for h in pages if value in self.ancestry(worker, h)[0]}
            else:
                doomed = {h for h in pages if self.ancestry(worker, h)[1] == value}
                self.anchors[worker].pop(value, None)
            for h in doomed:
                del pages[h]

    def ancestry(self, worker: str, value: int | None) -> tuple[list[int], int | None]:
        """The chain from ``value`` up, and the parent it ends at (None: the root)."""
        chain, pages = [], self.pages[worker]
        while value is not None and value in pages:
            chain.append(value)
            value = pages[value][0]
        return chain, value

    def floating_parents(self, worker: str) -> list[int]:
        return sorted({top for h in self.pages[worker] if (top := self.ancestry(worker, h)[1]) is not None})

    def path(self, worker: str, value: int) -> list[int] | None:
        pages = self.pages[worker]
        chain, top = self.ancestry(worker, value)
        if top is None:
            out: list[int] = []
        elif top in self.anchors[worker]:
            out = list(self.anchors[worker][top])
        else:
            return None
        for h in reversed(chain):
            out.extend(pages[h][1])
        return out

    def paths(self, worker: str) -> list[list[int]]:
        found = [path for h in self.pages[worker] if (path := self.path(worker, h)) is not None]
        return found + [list(prefix) for prefix in self.anchors[worker].values()]

    def overlaps(self, prompt: list[int], block_size: int) -> dict[str, int]:
        result = {}
        for worker in self.pages:
            best = 0
            for path in self.paths(worker):
                common = 0
                for x, y in zip(path, prompt):
                    if x != y:
                        break
                    common += 1
                best = max(best, common // block_size)
            if best:
                result[worker] = best
        return result


PAGE_SIZES = {"p1": 1, "p2": 2, "p4": 4}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_matches_agree_with_a_brute_force_model(data):
    block_size = 4
    index = KvIndex(block_size)
    for worker, size in PAGE_SIZES.items():
        index.register_worker(worker, size)
    model = Model(PAGE_SIZES)
    next_hash = iter(range(1, 10**9))
    alphabet = st.integers(0, 2)
    for _ in range(data.draw(st.integers(1, 25), label="steps")):
        worker = data.draw(st.sampled_from(sorted(PAGE_SIZES)), label="worker")
        size = PAGE_SIZES[worker]
        known = sorted(model.pages[worker])
        action = data.draw(
            st.sampled_from(["store", "store", "store", "remove", "clear", "odd", "odd", "locate"]), label="action"
        )
        if action == "store":
            parent = data.draw(st.sampled_from([None, *known]) if known else st.none())
            n = data.draw(st.integers(1, 6))
            token_ids = tuple(data.draw(st.lists(alphabet, min_size=n * size, max_size=n * size)))
            event = BlockStored(tuple(next(next_hash) for _ in range(n)), parent, token_ids, size)
        elif action == "remove" and known:
            hashes = data.draw(st.lists(st.sampled_from(known), min_size=1, max_size=3))
            index.apply_removed(worker, BlockRemoved(tuple(hashes)))
            model.remove(worker, hashes)
            event = None
        elif action == "clear":
            index.clear_worker(worker)
            model.pages[worker] = {}
            model.anchors[worker] = {}
            event = None
        elif action == "locate":
            unlocated = [p for p in model.floating_parents(worker) if p not in model.anchors[worker]]
            event = None
            if unlocated:
                parent = data.draw(st.sampled_from(unlocated))
                pages_before = data.draw(st.integers(1, 3))
                prefix = data.draw(st.lists(alphabet, min_size=pages_before * size, max_size=pages_before * size))
                assert index.locate_anchor(worker, parent, prefix)
                model.anchors[worker][parent] = prefix
        else:  # an orphan, a floating parent stored late, a duplicate or a wrong-size store
            odd = data.draw(st.sampled_from(["orphan", "late parent", "duplicate", "size"]))
            tok = tuple(data.draw(st.lists(alphabet, min_size=size, max_size=size)))
            floating = model.floating_parents(worker)
            if odd == "orphan":
                event = BlockStored((next(next_hash),), data.draw(st.sampled_from([-5, -6])), tok, size)
            elif odd == "late parent" and floating:
                event = BlockStored((data.draw(st.sampled_from(floating)),), None, tok, size)
            elif odd == "duplicate" and known:
                event = BlockStored((known[0],), None, tok, size)
            else:
                event = BlockStored((next(next_hash),), None, tok * 3, size * 3)
        if event is not None:
            index.apply_stored(worker, event)
            model.store(worker, event)

        probes = [path for w in model.pages for path in model.paths(w)]
        probes.append(data.draw(st.lists(alphabet, max_size=24), label="probe"))
        for probe in probes:
            for prompt in (probe, probe + [0, 1, 2, 0, 1]):
                assert index.find_matches(prompt) == model.overlaps(prompt, block_size)
        assert index.stats()["pages"] == sum(len(p) for p in model.pages.values())
    for worker in PAGE_SIZES:
        gone = [*model.pages[worker], *model.floating_parents(worker), *model.anchors[worker]]
        index.apply_removed(worker, BlockRemoved(tuple(gone)))
    assert index.num_blocks == 0
    assert index.stats()["pages"] == index.stats()["anchors"] == index.stats()["inferred_blocks"] == 0


# -- history the index never saw --------------------------------------------------------------


SYSTEM = tokens(7, 700)


def warm_engine(page_size: int, *prompts) -> RadixCache:
    """An engine that cached ``prompts`` before this index subscribed (its events are gone)."""
    cache = RadixCache(100_000, page_size)
    for prompt in prompts:
        cache.insert(prompt)
    cache.drain_events()
    return cache


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_store_onto_an_unseen_prefix_is_located_from_the_prompt_routed_there(page_size):
    cache = warm_engine(page_size, SYSTEM + tokens(1, 40))
    index = index_with(A, B, page_size=page_size)
    prompt = SYSTEM + tokens(2, 50)
    index.note_routed(A, prompt)
    cache.insert(prompt)  # the engine computes what it did not cache, stored onto the unseen page
    feed(index, A, cache)
    assert index.stats()["orphan_stores"] == 1 and index.stats()["anchors_located"] == 1
    blocks = len(prompt) // 16
    assert index.find_matches(prompt) == {A: blocks}
    # The system prompt's blocks are known only by inference; the rest was seen stored.
    follow_up = SYSTEM + tokens(3, 30)
    shared = len(SYSTEM) // 16
    assert index.find_matches(follow_up) == {A: shared}
    assert index.inferred_blocks(A, prefix_hashes(follow_up, 16), shared) == shared
    assert index.inferred_blocks(A, prefix_hashes(prompt, 16), blocks) < blocks


def test_a_located_prefix_goes_when_the_engine_evicts_it():
    cache = warm_engine(16, SYSTEM)
    index = index_with(A)
    prompt = SYSTEM + tokens(2, 64)
    index.note_routed(A, prompt)
    cache.insert(prompt)
    feed(index, A, cache)
    assert index.find_matches(prompt)
    cache.evict(10**6)  # leaves first: the stored run, then the pages the index never saw
    feed(index, A, cache)
    assert index.find_matches(prompt) == {} and index.num_blocks == 0
    stats = index.stats()
    assert stats["anchors"] == stats["inferred_blocks"] == stats["pages"] == 0
    assert stats["anchors_removed"] == 1


def test_a_store_no_routed_prompt_explains_floats_and_matches_nothing():
    cache = warm_engine(16, SYSTEM)
    index = index_with(A)
    prompt = SYSTEM + tokens(2, 64)
    index.note_routed(A, tokens(9, 500))  # another prompt: the store is not in it
    cache.insert(prompt)  # e.g. routed there by another frontend
    feed(index, A, cache)
    stats = index.stats()
    assert stats["orphan_stores"] == 1 and stats["anchors_located"] == 0
    assert stats["floating_pages"] == 64 // 16
    assert index.find_matches(prompt) == {}
    # ...until this frontend routes a prompt that holds it.
    index.note_routed(A, prompt + tokens(4, 20))
    assert index.find_matches(prompt) == {A: len(prompt) // 16}


def test_a_store_that_fits_two_places_is_placed_by_the_engines_hash_or_not_at_all():
    system = SYSTEM[:688]  # whole pages: the store is exactly the tail
    tail = tokens(2, 64)
    other = tokens(5, 160) + tail  # the same tokens after another prefix
    cache = warm_engine(16, system)
    index = index_with(A)
    index.note_routed(A, system + tail)
    index.note_routed(A, other)
    cache.insert(system + tail)
    feed(index, A, cache)  # SGLang's hash of the store's parent names the system prompt
    assert index.find_matches(system + tail) == {A: len(system + tail) // 16}
    assert index.find_matches(other) == {}

    index = index_with(A)  # an engine whose hashes are not SGLang's: no proof, no guess
    index.note_routed(A, system + tail)
    index.note_routed(A, other)
    index.apply_stored(A, BlockStored((11, 12, 13, 14), 10, tuple(tail), 16))
    assert index.stats()["anchors_located"] == 0
    assert index.find_matches(system + tail) == {}


def test_per_page_stores_are_located_once_the_run_is_long_enough():
    """SGLang before 0.5.19 publishes one BlockStored per page."""
    cache = warm_engine(1, SYSTEM)
    index = index_with(A, page_size=1)
    repeated = tokens(2, 3)
    prompt = SYSTEM + repeated + tokens(3, 5) + repeated + tokens(4, 100)
    index.note_routed(A, prompt)
    cache.insert(prompt)
    (coalesced,) = cache.drain_events()
    assert isinstance(coalesced, BlockStored)
    parent = coalesced.parent_block_hash
    for i, value in enumerate(coalesced.block_hashes):
        page = BlockStored((value,), parent, coalesced.token_ids[i : i + 1], 1)
        index.apply_stored(A, page)
        parent = value
    assert index.find_matches(prompt) == {A: len(prompt) // 16}


def test_the_parent_page_stored_late_takes_over_from_the_inferred_prefix():
    index = index_with(A)
    prompt = tokens(1, 64)
    index.note_routed(A, prompt)
    index.apply_stored(A, stored(prompt[32:], 16, prompt[:32]))
    assert index.inferred_blocks(A, prefix_hashes(prompt, 16), 4) == 2
    index.apply_stored(A, stored(prompt[:32], 16))  # a replay brought the parent's own store
    assert index.find_matches(prompt) == {A: 4}
    assert index.inferred_blocks(A, prefix_hashes(prompt, 16), 4) == 0
    assert index.stats()["anchors"] == 0
