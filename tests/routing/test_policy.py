"""Which worker serves a request under each policy, sessions included (no I/O, no engines)."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

from trio_direct.config import ServeConfig, routing_settings
from trio_direct.routing.affinity import SessionAffinity
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.load_aware import PRESETS, LoadAwareRouting, cost_settings
from trio_direct.routing.policy import Candidates, RoutingPolicy

WORKERS = [RoutingKey(f"e{i}") for i in range(3)]


def candidates(workers=WORKERS) -> Candidates[RoutingKey]:
    return Candidates(aggregated=list(workers), prefill=[], decode=[], key=lambda w: w)


def card(engine_id: str = "e0", role: str = "aggregated"):
    return SimpleNamespace(
        role=role, dp_size=1, block_size=16, kv_block_size=16, kv_events=(), url=f"grpc://{engine_id}"
    )


def kv_routing(mode: str = "kv", **config) -> LoadAwareRouting:
    return LoadAwareRouting([card()], routing_settings(ServeConfig(router_mode=mode, **config)))


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(64)]


# -- sessions ------------------------------------------------------------------------------------


def test_a_session_sticks_to_its_engine_in_round_robin_mode():
    policy = RoutingPolicy("round-robin", affinity=SessionAffinity(60))
    first = policy.choose(candidates(), (), "r0", session_key="chat-1")
    others = [policy.choose(candidates(), (), f"x{i}").decode for i in range(4)]
    again = [policy.choose(candidates(), (), f"r{i}", session_key="chat-1") for i in range(1, 5)]
    assert len(set(others)) == 3, "requests without a session still take turns"
    assert {r.decode for r in again} == {first.decode} and all(r.sticky for r in again)
    assert not first.sticky


def test_a_session_moves_when_its_engine_is_unhealthy_and_stays_on_the_new_one():
    policy = RoutingPolicy("round-robin", affinity=SessionAffinity(60))
    first = policy.choose(candidates(), (), "r0", session_key="chat-1").decode
    healthy = [w for w in WORKERS if w != first]
    moved = policy.choose(candidates(healthy), (), "r1", session_key="chat-1").decode
    assert moved != first
    assert policy.choose(candidates(), (), "r2", session_key="chat-1").decode == moved


def test_weighing_a_route_for_debug_pins_nothing():
    policy = RoutingPolicy("round-robin", affinity=SessionAffinity(60))
    policy.choose(candidates(), (), None, session_key="chat-1")
    assert policy.affinity is not None and policy.affinity.get("chat-1") is None


def test_in_kv_mode_a_session_overrides_the_cost_and_leaves_a_busy_engine():
    kv = kv_routing(router_session_busy_fraction=0.9)
    policy = RoutingPolicy("kv", kv=kv, affinity=SessionAffinity(60))
    first = policy.choose(candidates(), prompt(0), "r0", session_key="s")
    pinned = first.decode
    # load elsewhere is lower, yet the session stays (its prefix is cached there)
    kv.router.active.set_external_load(pinned, running=5, waiting=0, used_tokens=100 * 16, max_tokens=1000 * 16)
    route = policy.choose(candidates(), prompt(1), "r1", session_key="s")
    assert route.decision is not None
    assert route.decode == pinned and route.sticky and route.decision.reason == "session affinity"
    assert kv.router.active.worker_of("r1") == pinned, "the pinned request counts as load there"
    # its KV cache fills up: the session goes elsewhere, and stays there
    kv.router.active.set_external_load(pinned, running=50, waiting=9, used_tokens=950 * 16, max_tokens=1000 * 16)
    moved = policy.choose(candidates(), prompt(2), "r2", session_key="s").decode
    assert moved != pinned
    assert policy.choose(candidates(), prompt(3), "r3", session_key="s").decode == moved


def test_disaggregated_requests_are_routed_without_affinity():
    policy = RoutingPolicy("round-robin", affinity=SessionAffinity(60))
    pd = Candidates(aggregated=[], prefill=WORKERS[:2], decode=WORKERS[2:], key=lambda w: w, disaggregated=True)
    routes = [policy.choose(pd, (), f"r{i}", session_key="s") for i in range(4)]
    assert {r.prefill for r in routes} == set(WORKERS[:2])


# -- load-only policies ----------------------------------------------------------------------------


def test_least_load_takes_the_engine_with_the_fewest_requests_everyone_sent():
    kv = kv_routing("least-load")
    policy = RoutingPolicy("least-load", kv=kv)
    assert kv.index is None and kv.stats()["mode"] == "load"
    kv.router.active.set_external_load(WORKERS[0], running=4, waiting=0, used_tokens=0)
    kv.router.active.set_external_load(WORKERS[1], running=1, waiting=1, used_tokens=0)
    kv.router.active.set_external_load(WORKERS[2], running=3, waiting=0, used_tokens=0)
    chosen = [policy.choose(candidates(), prompt(i), f"r{i}").decode for i in range(4)]
    # e1 (2 requests) first; at equal requests the engine with fewer KV blocks in use
    assert chosen == [WORKERS[1], WORKERS[2], WORKERS[1], WORKERS[0]]
    route = policy.choose(candidates(), prompt(9), None)
    assert route.decision is not None
    assert route.decision.mode == "load" and route.decision.chosen.requests == 4


def test_power_of_two_takes_the_less_loaded_of_two_and_spreads_load():
    kv = kv_routing("power-of-two")
    policy = RoutingPolicy("power-of-two", kv=kv)
    kv.router.active.set_external_load(WORKERS[0], running=50, waiting=0, used_tokens=0)
    chosen = Counter(policy.choose(candidates(), prompt(i), f"r{i}").decode for i in range(60))
    assert chosen[WORKERS[0]] == 0, "the busiest engine loses every draw it is in"
    assert chosen[WORKERS[1]] > 10 and chosen[WORKERS[2]] > 10
    decision = policy.choose(candidates(), prompt(99), None).decision
    assert decision is not None and decision.reason.startswith("less loaded of two drawn")


# -- cost presets ------------------------------------------------------------------------------------


def test_the_default_preset_weighs_prefill_and_dynamos_is_one_to_one():
    assert cost_settings(routing_settings(ServeConfig())) == PRESETS["ttft"]
    assert cost_settings(routing_settings(ServeConfig(router_preset="dynamo"))).prefill_load_scale == 1.0
    explicit = cost_settings(routing_settings(ServeConfig(router_preset="dynamo", router_prefill_load_scale=4.0)))
    assert (explicit.prefill_load_scale, explicit.overlap_score_credit) == (4.0, 1.0)
    assert kv_routing(router_temperature=0.5).router.config.temperature == 0.5
    assert kv_routing().stats()["cost"]["prefill_load_scale"] == PRESETS["ttft"].prefill_load_scale
