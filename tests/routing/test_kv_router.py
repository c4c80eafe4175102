"""The KV router sends a prompt where its prefix is cached, unless load says otherwise."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Hashable

import pytest

from trio_direct.mock.kv_types import BlockStored, block_hash_chain
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.kv_index import KvIndex
from trio_direct.routing.kv_router import Decision, KvRouter, KvRouterConfig
from trio_direct.routing.simple import NoWorkerAvailable

A = RoutingKey("e0", 0)
B = RoutingKey("e1", 0)
C = RoutingKey("e2", 0)
WORKERS = [A, B, C]
BS = 16


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(150_000) for _ in range(n)]


def cache(index: KvIndex | None, worker, token_ids: list[int]) -> None:
    """``worker``'s engine reports ``token_ids`` cached (one page per routing block)."""
    assert index is not None
    hashes, _ = block_hash_chain(token_ids, BS)
    index.apply(worker, BlockStored(tuple(hashes), None, tuple(token_ids), BS))


def router_with(*workers, rng_seed: int = 0, **config) -> KvRouter:
    index = KvIndex(BS)
    for worker in workers or WORKERS:
        index.register_worker(worker, BS)
    return KvRouter(KvRouterConfig(block_size=BS, **config), index, rng=random.Random(rng_seed))


def candidate(decision: Decision, worker):
    return next(c for c in decision.candidates if c.worker == worker)


# -- overlap -----------------------------------------------------------------------------


def test_a_shared_prefix_goes_to_the_worker_that_caches_it():
    router = router_with()
    system = tokens(0, 8 * BS)
    cache(router.index, B, system)
    for seed in range(10):
        decision = router.route(f"r{seed}", system + tokens(seed + 1, 2 * BS), WORKERS)
        router.free(f"r{seed}")
        assert decision.worker == B
        assert decision.overlap_blocks == 8 and decision.prompt_blocks == 10
        assert decision.reason == "lowest cost"


def test_dp_ranks_are_separate_workers():
    rank0, rank1 = RoutingKey("e0", 0), RoutingKey("e0", 1)
    router = router_with(rank0, rank1)
    system = tokens(0, 6 * BS)
    cache(router.index, rank1, system)
    decision = router.route("r1", system + tokens(1, BS), [rank0, rank1])
    assert decision.worker == rank1
    assert candidate(decision, rank0).overlap_blocks == 0
    # rank 1's load is not rank 0's
    assert router.active.active_requests(rank1) == 1
    assert router.active.active_requests(rank0) == 0


def test_credit_zero_ignores_the_cache():
    router = router_with(overlap_score_credit=0.0)
    system = tokens(0, 8 * BS)
    cache(router.index, B, system)
    decision = router.decide(system, WORKERS)
    assert {c.overlap_blocks for c in decision.candidates} == {0}
    assert len({c.cost for c in decision.candidates}) == 1


# -- load --------------------------------------------------------------------------------


def test_load_breaks_ties_between_equally_cold_workers():
    router = router_with()
    chosen = [router.route(f"r{i}", tokens(i, 5 * BS), WORKERS).worker for i in range(3)]
    assert sorted(chosen, key=str) == WORKERS


def test_load_outweighs_a_small_overlap():
    router = router_with()
    system = tokens(0, 2 * BS)
    cache(router.index, A, system)
    router.route("long", tokens(99, 60 * BS), [A])  # A is busy with a long request
    router.first_token("long")
    decision = router.decide(system + tokens(1, 4 * BS), WORKERS)
    assert decision.worker != A
    assert candidate(decision, A).overlap_blocks == 2
    assert "passed over for load" in decision.reason


def test_a_hot_prefix_spreads_once_its_worker_gets_busy():
    router = router_with()
    system = tokens(0, 4 * BS)
    cache(router.index, A, system)
    counts = Counter(router.route(f"r{i}", system + tokens(i + 1, 4 * BS), WORKERS).worker for i in range(30))
    assert counts[A] == max(counts.values())  # the cache still earns A the largest share
    assert all(counts[w] >= 5 for w in WORKERS)
    # requests past prefill keep their KV: load still spreads after their first tokens
    for i in range(30):
        router.first_token(f"r{i}")
    counts = Counter(router.route(f"s{i}", system + tokens(i + 100, 4 * BS), WORKERS).worker for i in range(30))
    assert all(counts[w] >= 5 for w in WORKERS)


def test_first_token_releases_prefill_load():
    router = router_with()
    router.route("r1", tokens(1, 20 * BS), [A])
    probe = tokens(2, 2 * BS)
    busy = candidate(router.decide(probe, [A, B]), A)
    assert busy.prefill_blocks == 2 + 20
    assert busy.decode_blocks == 20 + 2
    router.first_token("r1")
    done = candidate(router.decide(probe, [A, B]), A)
    assert done.prefill_blocks == 2
    assert done.decode_blocks == 20 + 2  # its KV stays until it ends


def test_free_is_idempotent_and_clears_load():
    router = router_with()
    router.route("r1", tokens(1, 10 * BS), [A])
    router.free("r1")
    router.free("r1")
    router.free("never-routed")
    router.first_token("r1")
    decision = router.decide(tokens(2, 3 * BS), WORKERS)
    assert {(c.prefill_blocks, c.decode_blocks) for c in decision.candidates} == {(3, 3)}


def test_prompt_blocks_already_active_on_a_worker_add_no_decode_load():
    router = router_with()
    system = tokens(0, 8 * BS)
    router.route("r1", system + tokens(1, BS), [A])
    decision = router.decide(system + tokens(2, 2 * BS), [A, B])
    # A: its 9 active blocks + 2 new; B: 10 new
    assert candidate(decision, A).decode_blocks == 11
    assert candidate(decision, B).decode_blocks == 10


def test_engine_polled_load_counts_as_decode_load():
    router = router_with()
    system = tokens(0, 2 * BS)
    cache(router.index, A, system)
    prompt = system + tokens(1, 4 * BS)
    assert router.decide(prompt, WORKERS).worker == A
    # another frontend is filling A's KV
    router.active.set_external_load(A, running=12, waiting=3, used_tokens=100 * BS)
    decision = router.decide(prompt, WORKERS)
    assert decision.worker != A
    assert candidate(decision, A).decode_blocks == 100 + 6


def test_decide_records_nothing_and_route_records_once():
    router = router_with()
    prompt = tokens(1, 4 * BS)
    first = router.decide(prompt, WORKERS)
    again = router.decide(prompt, WORKERS)
    assert first.candidates == again.candidates
    assert len(router.active) == 0
    decision = router.route("r1", prompt, WORKERS)
    assert router.active.worker_of("r1") == decision.worker


def test_a_removed_worker_loses_its_load():
    router = router_with()
    router.route("r1", tokens(1, 10 * BS), [A])
    router.remove_worker(A)
    router.free("r1")
    assert router.active.decode_blocks(A) == 0


# -- selection ---------------------------------------------------------------------------


def test_no_workers_is_a_clear_error():
    with pytest.raises(NoWorkerAvailable):
        router_with().decide(tokens(1, 32), [])


def test_one_worker_is_the_only_candidate():
    decision = router_with().decide(tokens(1, 32), [A])
    assert decision.worker == A and decision.reason == "only candidate"


def test_temperature_zero_is_reproducible_with_a_seed_and_breaks_ties_at_random():
    def choices(seed: int) -> list[Hashable]:
        router = router_with(rng_seed=seed)
        return [router.decide(tokens(i, 3 * BS), WORKERS).worker for i in range(60)]

    assert choices(7) == choices(7)
    counts = Counter(choices(7))
    assert all(counts[w] >= 8 for w in WORKERS)  # not "first worker wins"
    decision = router_with().decide(tokens(1, 3 * BS), WORKERS)
    assert decision.reason == "lowest cost, tie of 3 broken at random"
    assert all(c.probability is None for c in decision.candidates)


def test_temperature_samples_in_proportion_to_normalised_cost():
    router = router_with(temperature=1.0, rng_seed=3)
    # costs c, c + 10, c + 20 normalise to 0, 0.5, 1
    router.active.set_external_load(B, running=1, waiting=0, used_tokens=10 * BS)
    router.active.set_external_load(C, running=1, waiting=0, used_tokens=20 * BS)
    prompt = tokens(1, BS)
    first = router.decide(prompt, WORKERS)
    probabilities = {c.worker: c.probability for c in first.candidates}
    weights = {A: 1.0, B: 2.718281828**-0.5, C: 2.718281828**-1}
    total = sum(weights.values())
    for worker in WORKERS:
        assert probabilities[worker] == pytest.approx(weights[worker] / total)
    n = 6000
    counts = Counter(router.decide(prompt, WORKERS).worker for _ in range(n))
    for worker in WORKERS:
        assert counts[worker] / n == pytest.approx(weights[worker] / total, abs=0.03)


def test_temperature_extremes_approach_greedy_and_uniform():
    cold = router_with(temperature=0.01, rng_seed=1)
    hot = router_with(temperature=100.0, rng_seed=1)
    for router in (cold, hot):
        router.active.set_external_load(B, running=1, waiting=0, used_tokens=10 * BS)
    prompt = tokens(1, BS)
    assert Counter(cold.decide(prompt, [A, B]).worker for _ in range(500))[A] == 500
    share = Counter(hot.decide(prompt, [A, B]).worker for _ in range(2000))[A] / 2000
    assert share == pytest.approx(0.5, abs=0.05)
    even = router_with(temperature=1.0).decide(prompt, WORKERS)
    assert [c.probability for c in even.candidates] == pytest.approx([1 / 3] * 3)


# -- approximate mode --------------------------------------------------------------------


def test_approximate_mode_learns_from_its_own_routing_and_forgets_after_ttl():
    now = [1000.0]
    router = KvRouter(
        KvRouterConfig(block_size=BS, use_kv_events=False, ttl_secs=120),
        rng=random.Random(0),
        clock=lambda: now[0],
    )
    assert router.index is None
    system = tokens(0, 6 * BS)
    first = router.route("r1", system + tokens(1, BS), WORKERS)
    assert first.overlap_blocks == 0 and first.mode == "approximate"
    router.free("r1")
    for i in range(5):
        now[0] += 10
        decision = router.route(f"s{i}", system + tokens(i + 2, BS), WORKERS)
        router.free(f"s{i}")
        assert decision.worker == first.worker
        assert decision.overlap_blocks == 6
    now[0] += 121
    late = router.decide(system + tokens(9, BS), WORKERS)
    assert {c.overlap_blocks for c in late.candidates} == {0}


# -- explaining --------------------------------------------------------------------------


def test_explain_and_to_json_list_every_candidate():
    router = router_with()
    system = tokens(0, 12 * BS)
    cache(router.index, B, system)
    router.route("busy", tokens(5, 3 * BS), [A])
    decision = router.route("r123", system + tokens(1, 28 * BS), WORKERS)
    line = decision.explain()
    assert line.startswith("kv route r123 -> e1/0: overlap 12/40 blocks")
    for label in ("e0/0", "e1/0", "e2/0"):
        assert label in line
    a, b = candidate(decision, A), candidate(decision, B)
    assert f"cost {a.cost:.1f}" in line and f"cost {b.cost:.1f}" in line
    data = json.loads(json.dumps(decision.to_json()))
    assert data["request_id"] == "r123" and data["worker"] == "e1/0"
    assert (data["prompt_blocks"], data["overlap_blocks"]) == (40, 12)
    assert [c["worker"] for c in data["candidates"]] == ["e0/0", "e1/0", "e2/0"]
    first = data["candidates"][0]
    assert first["engine_id"] == "e0" and first["dp_rank"] == 0
    assert first["decode_blocks"] == 3 + 40 and first["prefill_blocks"] == 3 + 40
    assert data["candidates"][1]["overlap_blocks"] == 12
    assert data["candidates"][1]["cost"] == pytest.approx(28 + 40)


def test_engines_without_dp_are_labelled_by_name():
    router = router_with(RoutingKey("solo"))
    assert "-> solo:" in router.decide(tokens(1, 32), [RoutingKey("solo")]).explain()


# -- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"temperature": -1.0},
        {"ttl_secs": 0.0},
        {"overlap_score_credit": -0.5},
        {"prefill_load_scale": -1.0},
    ],
)
def test_bad_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        KvRouterConfig(**kwargs)


def test_index_block_size_must_match():
    with pytest.raises(ValueError):
        KvRouter(KvRouterConfig(block_size=16), KvIndex(32))


# -- what the frontend never saw stored ---------------------------------------------------------


def test_each_candidate_says_whether_its_overlap_was_seen_stored_or_inferred():
    from trio_direct.mock.radix_cache import RadixCache

    router = router_with()
    system = tokens(0, 20 * BS)
    warm = RadixCache(10_000, BS)
    warm.insert(system)
    warm.drain_events()  # cached before this router subscribed
    cache(router.index, C, system[: 4 * BS])  # C's store was seen from the root
    first = system + tokens(1, 3 * BS)
    assert router.route("r0", first, [A]).worker == A  # the prompt this router sent there
    router.free("r0")
    warm.insert(first)
    assert router.index is not None
    assert router.index is not None
    for event in warm.drain_events():
        router.index.apply(A, event)
    decision = router.decide(system + tokens(2, 2 * BS), WORKERS)
    by_worker = {c["worker"]: c for c in decision.to_json()["candidates"]}
    assert decision.worker == A and decision.reason == "lowest cost"
    assert by_worker["e0/0"]["overlap_blocks"] == 20
    assert by_worker["e0/0"]["overlap_source"] == "inferred"
    assert by_worker["e0/0"]["overlap_inferred_blocks"] == 20
    assert by_worker["e2/0"]["overlap_source"] == "stored" and by_worker["e2/0"]["overlap_stored_blocks"] == 4
    assert by_worker["e1/0"]["overlap_source"] is None
    assert "(20 inferred)" in decision.explain()
    follow_up = router.decide(first + tokens(3, BS), WORKERS)
    assert candidate(follow_up, A).overlap_source == "stored+inferred"
    json.dumps(decision.to_json())


def test_a_pinned_worker_is_chosen_whatever_its_cost():
    router = router_with()
    system = tokens(0, 8 * BS)
    cache(router.index, B, system)
    decision = router.route("r0", system, WORKERS, pinned=C)
    assert decision.worker == C and decision.reason.startswith("session affinity; longest prefix (8 blocks on e1/0)")
    assert router.active.worker_of("r0") == C
    assert router.decide(system, WORKERS, pinned=RoutingKey("gone")).worker == B
