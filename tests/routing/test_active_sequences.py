"""The router counts each worker's load from the moment it routes a request until it ends."""

from __future__ import annotations

import random

from trio_direct.routing.active_sequences import ActiveSequences, ExternalLoad
from trio_direct.routing.block_hash import RoutingKey, prefix_hashes

A = RoutingKey("engine-a", 0)
B = RoutingKey("engine-a", 1)
BS = 16


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(150_000) for _ in range(n)]


def add(active: ActiveSequences, rid: str, worker, prompt: list[int], overlap: int = 0) -> None:
    active.add(rid, worker, prefix_hashes(prompt, BS), len(prompt), overlap)


def test_a_routed_request_counts_as_prefill_decode_and_one_request():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 10 * BS + 3), overlap=4)
    assert active.prefill_tokens(A) == 6 * BS + 3  # the cached 4 blocks need no prefill
    assert active.decode_blocks(A) == 10
    assert active.active_requests(A) == 1
    assert active.prefill_tokens(B) == active.decode_blocks(B) == active.active_requests(B) == 0
    assert active.worker_of("r1") == A and "r1" in active and len(active) == 1


def test_first_token_releases_prefill_but_keeps_decode_load():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 8 * BS))
    add(active, "r2", A, tokens(2, 2 * BS))
    active.first_token("r1")
    active.first_token("r1")  # repeated: no double release
    assert active.prefill_tokens(A) == 2 * BS
    assert active.decode_blocks(A) == 10
    active.first_token("nobody")


def test_free_is_idempotent_and_unknown_ids_are_ignored():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 8 * BS))
    add(active, "r2", A, tokens(2, 4 * BS))
    active.free("r1")
    active.free("r1")
    active.free("never-routed")
    assert active.decode_blocks(A) == 4 and active.prefill_tokens(A) == 4 * BS
    assert active.active_requests(A) == 1
    active.free("r2")
    assert active.prefill_tokens(A) == active.decode_blocks(A) == active.active_requests(A) == 0
    assert len(active) == 0 and active.worker_of("r2") is None


def test_requests_sharing_a_prefix_on_one_worker_share_its_blocks():
    active = ActiveSequences(BS)
    system = tokens(0, 6 * BS)
    add(active, "r1", A, system + tokens(1, 2 * BS))
    add(active, "r2", A, system + tokens(2, 3 * BS))
    assert active.decode_blocks(A) == 6 + 2 + 3
    assert active.active_overlap(A, prefix_hashes(system + tokens(3, 5 * BS), BS)) == 6
    assert active.active_overlap(B, prefix_hashes(system, BS)) == 0
    # the same prefix on another worker is that worker's own KV
    add(active, "r3", B, system + tokens(4, BS))
    assert active.decode_blocks(B) == 7
    active.free("r1")
    assert active.decode_blocks(A) == 6 + 3  # r2 still holds the shared prefix
    active.free("r2")
    assert active.decode_blocks(A) == 0 and active.active_overlap(A, prefix_hashes(system, BS)) == 0


def test_generated_tokens_add_a_decode_block_per_filled_block():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 2 * BS + 10))  # 6 tokens left in the last block
    assert active.decode_blocks(A) == 2
    active.grow("r1", 5)
    assert active.decode_blocks(A) == 2
    active.grow("r1", 1)
    assert active.decode_blocks(A) == 3
    active.grow("r1", 2 * BS)
    assert active.decode_blocks(A) == 5
    active.grow("nobody", 100)
    active.free("r1")
    assert active.decode_blocks(A) == 0


def test_adding_a_request_again_moves_it():
    active = ActiveSequences(BS)
    prompt = tokens(1, 4 * BS)
    add(active, "r1", A, prompt)
    add(active, "r1", B, prompt)  # retried elsewhere
    assert active.active_requests(A) == 0 and active.decode_blocks(A) == 0
    assert active.active_requests(B) == 1 and active.worker_of("r1") == B


def test_polled_engine_load_adds_what_others_had_there_to_own_tracking():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 10 * BS))
    # another frontend keeps the engine busier than this router knows; the poll includes r1
    active.set_external_load(A, running=7, waiting=2, used_tokens=50 * BS + 1, waiting_tokens=900 + 10 * BS)
    assert active.decode_blocks(A) == 51
    assert active.active_requests(A) == 9
    assert active.prefill_tokens(A) == 900 + 10 * BS
    assert active.decode_blocks(A, own_only=True) == 10
    assert active.external_load(A) == ExternalLoad(7, 2, 50 * BS + 1, 900 + 10 * BS)
    # routed since the poll: counted at once, on top of the others' share
    add(active, "r2", A, tokens(2, 4 * BS))
    assert active.active_requests(A) == 10 and active.decode_blocks(A) == 55
    active.free("r1")  # finished since the poll: its share leaves too
    assert active.active_requests(A) == 9 and active.decode_blocks(A) == 45
    # a stale poll below what this router routed does not hide its own requests
    active.set_external_load(A, running=0, waiting=0, used_tokens=0, own_at_poll=active.own_load(A))
    assert active.decode_blocks(A) == 4 and active.active_requests(A) == 1
    assert active.prefill_tokens(A) == 4 * BS  # no waiting_tokens polled: own only
    active.clear_external_load(A)
    assert active.external_load(A) is None


def test_two_replicas_polling_one_engine_see_the_same_load():
    """Each routes half of the requests; after a poll both see all of them, and their own since."""
    one, two = ActiveSequences(BS), ActiveSequences(BS)
    for i in range(6):
        add(one if i % 2 else two, f"r{i}", A, tokens(i, 4 * BS))
    engine: dict = {"running": 6, "waiting": 0, "used_tokens": 24 * BS}
    for replica in (one, two):
        replica.set_external_load(A, **engine)
    assert one.active_requests(A) == two.active_requests(A) == 6
    assert one.decode_blocks(A) == two.decode_blocks(A) == 24
    add(one, "r6", A, tokens(6, 4 * BS))
    assert one.active_requests(A) == 7 and two.active_requests(A) == 6


def test_a_removed_worker_forgets_its_requests_and_polls():
    active = ActiveSequences(BS)
    add(active, "r1", A, tokens(1, 4 * BS))
    add(active, "r2", B, tokens(2, 4 * BS))
    active.set_external_load(A, running=3, waiting=0, used_tokens=1000)
    active.remove_worker(A)
    assert (active.decode_blocks(A), active.active_requests(A)) == (0, 0)
    assert active.worker_of("r1") is None and active.worker_of("r2") == B
    active.free("r1")  # the request ends later: no-op
    active.first_token("r1")
    assert active.active_requests(B) == 1
    active.remove_worker(RoutingKey("unknown"))


def test_load_returns_to_zero_after_any_interleaving_of_lifecycles():
    rng = random.Random(5)
    active = ActiveSequences(BS)
    shared = tokens(0, 3 * BS)
    live: list[str] = []
    for step in range(300):
        if live and rng.random() < 0.45:
            rid = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                active.first_token(rid)
            active.grow(rid, rng.randrange(40))
            active.free(rid)
        else:
            rid = f"r{step}"
            prompt = (shared if rng.random() < 0.5 else []) + tokens(step, rng.randrange(80))
            add(active, rid, rng.choice([A, B]), prompt, overlap=rng.randrange(3))
            live.append(rid)
    for rid in live:
        active.free(rid)
    for worker in (A, B):
        assert active.decode_blocks(worker) == 0
        assert active.prefill_tokens(worker) == 0
        assert active.active_requests(worker) == 0
    assert len(active) == 0
