"""Round-robin and random routing over whatever workers are healthy right now."""

from __future__ import annotations

from collections import Counter

import pytest

from trio_direct.routing.simple import NoWorkerAvailable, RandomRouter, RoundRobinRouter


def test_round_robin_takes_each_worker_in_turn():
    router = RoundRobinRouter()
    workers = ["a", "b", "c"]
    assert [router.choose(workers) for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_round_robin_stays_fair_when_the_worker_list_changes():
    router = RoundRobinRouter()
    counts = Counter(router.choose(["a", "b", "c"]) for _ in range(5))
    counts.update(router.choose(["a", "c"]) for _ in range(6))  # b went unhealthy
    counts.update(router.choose(["a", "b", "c", "d"]) for _ in range(400))  # b is back, d joined
    assert counts["b"] >= 100 and counts["d"] == 100
    assert max(counts.values()) - min(counts.values()) <= 8


def test_random_is_roughly_uniform_and_reproducible_with_a_seed():
    workers = ["a", "b", "c", "d"]
    first, second = RandomRouter(seed=7), RandomRouter(seed=7)
    assert [first.choose(workers) for _ in range(20)] == [second.choose(workers) for _ in range(20)]
    router = RandomRouter(seed=1)
    counts = Counter(router.choose(workers) for _ in range(4000))
    assert set(counts) == set(workers)
    assert all(800 < n < 1200 for n in counts.values())


@pytest.mark.parametrize("router", [RoundRobinRouter(), RandomRouter()])
def test_no_workers_is_a_clear_error(router):
    with pytest.raises(NoWorkerAvailable):
        router.choose([])
