"""Which engines a request goes to: aggregated, or a prefill + decode pair."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trio_direct.config import ServeConfig
from trio_direct.fleet.fleet import Engine, Fleet, FleetError
from trio_direct.frontend.runtime import Frontend, check_roles
from trio_direct.routing.simple import NoWorkerAvailable, RoundRobinRouter


def engine(engine_id: str, role: str, url: str = "") -> Engine:
    card = SimpleNamespace(role=role, dp_size=1, url=url or f"grpc://{engine_id}:1")
    return Engine(engine_id, card, client=SimpleNamespace(api="native", name=engine_id))


def frontend(engines: list[Engine], **config) -> Frontend:
    return Frontend(ServeConfig(**config), Fleet(engines, model=None), RoundRobinRouter(), tokenizer=None, chat_template_override=None)


def test_aggregated_engines_take_turns():
    front = frontend([engine("e0", "aggregated"), engine("e1", "aggregated")])
    routes = [front.choose_route() for _ in range(4)]
    assert [r.decode.engine.id for r in routes] == ["e0", "e1", "e0", "e1"]
    assert all(r.prefill is None for r in routes)
    assert not front.disaggregated


def test_prefill_and_decode_pools_are_paired_and_each_round_robin():
    front = frontend([engine("p0", "prefill"), engine("p1", "prefill"), engine("d0", "decode"), engine("d1", "decode")])
    pairs = [(r.prefill.engine.id, r.decode.engine.id) for r in (front.choose_route() for _ in range(4))]
    assert pairs == [("p0", "d0"), ("p1", "d1"), ("p0", "d0"), ("p1", "d1")]
    assert front.disaggregated and front.healthy()


def test_without_a_healthy_prefill_engine_aggregated_engines_serve_unless_disaggregation_is_enforced():
    prefill, decode, aggregated = engine("p0", "prefill"), engine("d0", "decode"), engine("a0", "aggregated")
    prefill.healthy = False
    relaxed = frontend([prefill, decode, aggregated])
    route = relaxed.choose_route()
    assert route.prefill is None and route.decode.engine.id == "a0"
    strict = frontend([prefill, decode, aggregated], enforce_disagg=True)
    with pytest.raises(NoWorkerAvailable, match="enforce-disagg"):
        strict.choose_route()
    assert not strict.healthy()


def test_a_decode_engine_never_serves_alone():
    prefill, decode = engine("p0", "prefill"), engine("d0", "decode")
    prefill.healthy = False
    with pytest.raises(NoWorkerAvailable):
        frontend([prefill, decode]).choose_route()


def test_roles_must_match_the_flags_they_were_given_with():
    fleet = Fleet(
        [engine("e0", "prefill", "grpc://a:1"), engine("e1", "decode", "grpc://b:1"), engine("e2", "prefill", "grpc://c:1")],
        model=None,
    )
    check_roles(fleet, [])  # without --prefill-engine-url the probe alone decides
    check_roles(fleet, ["grpc://a:1", "grpc://c:1"])
    with pytest.raises(FleetError, match=r"e2 \(grpc://c:1\) reports role 'prefill'.*--engine-url"):
        check_roles(fleet, ["grpc://a:1"])
    with pytest.raises(FleetError, match=r"e1 \(grpc://b:1\) reports role 'decode'.*--prefill-engine-url"):
        check_roles(fleet, ["grpc://a:1", "grpc://b:1", "grpc://c:1"])


# --- engines that join after start-up --------------------------------------------------------------


def test_a_joining_engine_is_checked_against_the_flag_it_was_given_with():
    front = frontend([engine("e0", "prefill", "grpc://a:1")], prefill_engine_url=["grpc://a:1", "grpc://b:1"])
    front.check_join(engine("e1", "prefill", "grpc://b:1"))
    with pytest.raises(FleetError, match=r"e1 \(grpc://b:1\) reports role 'decode'.*--prefill-engine-url"):
        front.check_join(engine("e1", "decode", "grpc://b:1"))
    with pytest.raises(FleetError, match=r"e2 \(grpc://c:1\) reports role 'prefill'.*--engine-url"):
        front.check_join(engine("e2", "prefill", "grpc://c:1"))
    frontend([engine("e0", "aggregated")]).check_join(engine("e1", "prefill"))  # no flag: the probe decides


def test_debug_routing_lists_pending_engines_and_never_routes_to_them():
    from trio_direct.fleet.fleet import PendingEngine

    front = frontend([engine("e0", "aggregated")])
    front.fleet.pending.append(PendingEngine("e1", "grpc://late:1", "cannot connect"))
    report = front.explain_route()
    assert report["pending"] == [{"engine": "e1", "url": "grpc://late:1", "reason": "cannot connect"}]
    assert [w["engine"] for w in report["workers"]] == ["e0"]
    assert {front.choose_route().decode.engine.id for _ in range(3)} == {"e0"}


def kv_engine(engine_id: str, role: str = "aggregated", page: int = 4, kv_events=()) -> Engine:
    card = SimpleNamespace(
        role=role, dp_size=1, url=f"grpc://{engine_id}:1", block_size=page, kv_block_size=page, kv_events=kv_events
    )
    return Engine(engine_id, card, client=SimpleNamespace(api="native", name=engine_id))


def test_kv_routing_indexes_a_joining_engine_and_refuses_one_whose_page_does_not_fit():
    from trio_direct.fleet.card import KvEventSource
    from trio_direct.frontend.kv_routing import KvRouting

    fleet = Fleet([kv_engine("e0", page=4)], model=None)
    kv = KvRouting(fleet, ServeConfig(router_mode="kv"))
    assert kv.block_size == 16 and kv.index.stats()["workers"] == 1
    with pytest.raises(ValueError, match="page size 3 does not divide the routing block 16"):
        kv.check_join(kv_engine("e1", page=3))
    kv.check_join(kv_engine("e1", "decode", page=3))  # decode engines are not indexed
    joined = kv_engine("e1", page=8, kv_events=(KvEventSource(0, "tcp://127.0.0.1:1"),))
    kv.check_join(joined)
    kv.engine_joined(joined)  # before `run`: its subscription starts with the others
    assert kv.index.stats()["workers"] == 2
    assert [s.engine for s in kv.subscribers] == ["e1"]
