"""Without KV events, the router remembers where it sent each prefix, for a while."""

from __future__ import annotations

import random
from collections.abc import Hashable

import pytest

from trio_direct.routing.approximate_index import ApproximateIndex
from trio_direct.routing.block_hash import RoutingKey, prefix_hashes

A = RoutingKey("engine-a", 0)
B = RoutingKey("engine-b", 0)
BS = 16


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(150_000) for _ in range(n)]


def hashes(prompt: list[int]) -> list[int]:
    return prefix_hashes(prompt, BS)


def test_a_routed_prefix_matches_on_its_worker_only():
    index = ApproximateIndex(BS, ttl=120)
    system = tokens(0, 6 * BS)
    index.insert(A, hashes(system + tokens(1, 4 * BS)), now=0)
    assert index.find_matches_hashes(hashes(system + tokens(2, 3 * BS)), now=1) == {A: 6}
    assert index.find_matches(system + tokens(1, 4 * BS) + tokens(9, BS), now=1) == {A: 10}
    assert index.find_matches_hashes(hashes(tokens(3, 8 * BS)), now=1) == {}
    assert index.find_matches_hashes([], now=1) == {}


def test_each_worker_matches_as_far_as_its_own_prefix_goes():
    index = ApproximateIndex(BS, ttl=120)
    system = tokens(0, 4 * BS)
    index.insert(A, hashes(system + tokens(1, 2 * BS)), now=0)
    index.insert(B, hashes(system), now=0)
    assert index.find_matches_hashes(hashes(system + tokens(1, 5 * BS)), now=1) == {A: 6, B: 4}


def test_prefixes_expire_after_the_ttl_and_refresh_when_routed_again():
    index = ApproximateIndex(BS, ttl=120)
    prompt = hashes(tokens(1, 8 * BS))
    index.insert(A, prompt, now=0)
    index.insert(B, prompt[:3], now=100)
    assert index.find_matches_hashes(prompt, now=119.9) == {A: 8, B: 3}
    assert index.find_matches_hashes(prompt, now=120) == {B: 3}
    assert len(index) == 3  # A's entries purged on the way
    index.insert(B, prompt[:3], now=200)  # routed there again: good for another ttl
    assert index.find_matches_hashes(prompt, now=319) == {B: 3}
    assert index.find_matches_hashes(prompt, now=320) == {}
    assert len(index) == 0


def test_refreshing_a_shorter_prefix_lets_the_tail_expire_first():
    index = ApproximateIndex(BS, ttl=10)
    prompt = hashes(tokens(1, 6 * BS))
    index.insert(A, prompt, now=0)
    index.insert(A, prompt[:2], now=5)
    assert index.find_matches_hashes(prompt, now=9) == {A: 6}
    assert index.find_matches_hashes(prompt, now=12) == {A: 2}


def test_memory_is_bounded_and_the_oldest_prefixes_go_first():
    index = ApproximateIndex(BS, ttl=1000, max_blocks=10)
    old, new = hashes(tokens(1, 6 * BS)), hashes(tokens(2, 6 * BS))
    index.insert(A, old, now=0)
    index.insert(B, new, now=1)
    assert len(index) == 10
    # the old prompt lost its deepest blocks, never its head
    assert index.find_matches_hashes(old, now=2) == {A: 4}
    assert index.find_matches_hashes(new, now=2) == {B: 6}
    for step in range(50):
        index.insert(A, hashes(tokens(100 + step, 3 * BS)), now=3 + step)
        assert len(index) <= 10


def test_removing_a_worker_forgets_its_prefixes():
    index = ApproximateIndex(BS, ttl=120)
    prompt = hashes(tokens(1, 4 * BS))
    index.insert(A, prompt, now=0)
    index.insert(B, prompt, now=0)
    index.remove_worker(A)
    assert index.find_matches_hashes(prompt, now=1) == {B: 4}
    assert len(index) == 4
    index.remove_worker(RoutingKey("unknown"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0, "ttl": 1},
        {"block_size": 16, "ttl": 0},
        {"block_size": 16, "ttl": 1, "max_blocks": 0},
    ],
)
def test_bad_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ApproximateIndex(**kwargs)


def test_matches_agree_with_a_plain_model_of_routed_prefixes():
    rng = random.Random(11)
    ttl = 30.0
    index = ApproximateIndex(BS, ttl=ttl)
    small = ApproximateIndex(BS, ttl=ttl, max_blocks=40)
    stems = [tokens(seed, 6 * BS) for seed in range(4)]
    last_routed: dict[tuple[int, RoutingKey], float] = {}
    now = 0.0
    for step in range(400):
        now += rng.random() * 3
        stem = rng.choice(stems)
        prompt = hashes(stem[: rng.randrange(1, 7) * BS] + tokens(step, rng.randrange(3) * BS))
        if rng.random() < 0.5:
            worker = rng.choice([A, B])
            index.insert(worker, prompt, now)
            small.insert(worker, prompt, now)
            for value in prompt:
                last_routed[value, worker] = now
            continue
        expected: dict[Hashable, int] = {}
        for worker in (A, B):
            depth = 0
            while depth < len(prompt):
                if last_routed.get((prompt[depth], worker), -ttl) + ttl <= now:
                    break
                depth += 1
            if depth:
                expected[worker] = depth
        assert index.find_matches_hashes(prompt, now) == expected
        bounded = small.find_matches_hashes(prompt, now)
        assert all(0 < depth <= expected.get(worker, 0) for worker, depth in bounded.items())
        assert len(small) <= 40
