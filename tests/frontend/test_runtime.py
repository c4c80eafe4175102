"""Which engines a request goes to: aggregated, or a prefill + decode pair."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trio_direct.config import ServeConfig, routing_settings
from trio_direct.core.model_pool import ModelPool, check_roles
from trio_direct.fleet.fleet import Engine, Fleet, FleetError, FleetModel
from trio_direct.kv_sync.subscriber import KvEventSubscriber
from trio_direct.routing.busy import BusyThreshold, EngineLoads
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.routing.simple import NoWorkerAvailable

#: The fleet's model, which routing never reads.
MODEL = FleetModel("m", "m", "m", block_size=None, context_length=None, tool_call_parser=None, reasoning_parser=None)


def engine(engine_id: str, role: str, url: str = "") -> Engine:
    card: Any = SimpleNamespace(role=role, dp_size=1, url=url or f"grpc://{engine_id}:1")
    return Engine(engine_id, card, client=SimpleNamespace(api="native", name=engine_id))


def frontend(engines: list[Engine], **config) -> ModelPool:
    settings = ServeConfig(**config)
    routing = RoutingPolicy(settings.router_mode, enforce_disagg=settings.enforce_disagg)
    no_tokenizer: Any = None  # routing never tokenizes
    return ModelPool(
        settings, Fleet(engines, model=MODEL), routing, tokenizer=no_tokenizer, chat_template_override=None
    )


def pair(route) -> tuple[str, str]:
    """The prefill and decode engines of a disaggregated route."""
    assert route.prefill is not None
    return route.prefill.engine.id, route.decode.engine.id


def test_aggregated_engines_take_turns():
    front = frontend([engine("e0", "aggregated"), engine("e1", "aggregated")])
    routes = [front.choose_route() for _ in range(4)]
    assert [r.decode.engine.id for r in routes] == ["e0", "e1", "e0", "e1"]
    assert all(r.prefill is None for r in routes)
    assert not front.disaggregated


def test_prefill_and_decode_pools_are_paired_and_each_round_robin():
    front = frontend([engine("p0", "prefill"), engine("p1", "prefill"), engine("d0", "decode"), engine("d1", "decode")])
    pairs = [pair(front.choose_route()) for _ in range(4)]
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


WRONG_PREFILL = r"e1 \(grpc://b:1\) was given with --prefill-engine-url, but reports role 'decode'.*--engine-url"


def test_roles_come_from_the_probe_and_prefill_engine_url_asserts_prefill():
    fleet = Fleet(
        [
            engine("e0", "prefill", "grpc://a:1"),
            engine("e1", "decode", "grpc://b:1"),
            engine("e2", "prefill", "grpc://c:1"),
        ],
        model=MODEL,
    )
    check_roles(fleet, [])  # without --prefill-engine-url the probe alone decides
    check_roles(fleet, ["grpc://a:1", "grpc://c:1"])
    check_roles(fleet, ["grpc://a:1"])  # e2, a prefill engine given with --engine-url, serves as prefill
    with pytest.raises(FleetError, match=WRONG_PREFILL):
        check_roles(fleet, ["grpc://a:1", "grpc://b:1", "grpc://c:1"])


def test_a_prefill_engine_given_with_engine_url_serves_as_prefill():
    pool = frontend(
        [engine("p0", "prefill", "grpc://a:1"), engine("d0", "decode", "grpc://b:1")], prefill_engine_url=[]
    )
    check_roles(pool.fleet, pool.config.prefill_engine_url)
    route = pool.choose_route()
    assert pair(route) == ("p0", "d0")


# --- engines that join after start-up --------------------------------------------------------------


def test_a_joining_engine_given_with_prefill_engine_url_must_be_prefill():
    front = frontend([engine("e0", "prefill", "grpc://a:1")], prefill_engine_url=["grpc://a:1", "grpc://b:1"])
    front.check_join(engine("e1", "prefill", "grpc://b:1"))
    with pytest.raises(FleetError, match=WRONG_PREFILL):
        front.check_join(engine("e1", "decode", "grpc://b:1"))
    front.check_join(engine("e2", "prefill", "grpc://c:1"))  # given with --engine-url: used as it reports
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
    card: Any = SimpleNamespace(
        role=role,
        dp_size=1,
        url=f"grpc://{engine_id}:1",
        block_size=page,
        kv_block_size=page,
        kv_events=kv_events,
        api="native",
    )
    return Engine(engine_id, card, client=SimpleNamespace(api="native", name=engine_id))


def test_kv_routing_indexes_a_joining_engine_and_refuses_one_whose_page_does_not_fit():
    from trio_direct.fleet.card import KvEventSource
    from trio_direct.kv_sync.feeds import KvFeeds
    from trio_direct.routing.load_aware import LoadAwareRouting

    fleet = Fleet([kv_engine("e0", page=4)], model=MODEL)
    kv = LoadAwareRouting([e.card for e in fleet.engines], routing_settings(ServeConfig(router_mode="kv")))
    feeds = KvFeeds(kv, fleet)
    assert kv.index is not None
    assert kv.block_size == 16 and kv.index.stats()["workers"] == 1
    with pytest.raises(ValueError, match="page size 3 does not divide the routing block 16"):
        kv.check_join(kv_engine("e1", page=3).card)
    kv.check_join(kv_engine("e1", "decode", page=3).card)  # decode engines are not indexed
    joined = kv_engine("e1", page=8, kv_events=(KvEventSource(0, "tcp://127.0.0.1:1"),))
    kv.check_join(joined.card)
    feeds.engine_joined(joined)  # before `run`: its subscription starts with the others
    assert kv.index.stats()["workers"] == 2
    assert [s.engine for s in feeds.subscribers] == ["e1"]


# --- engines that come back with another card (kv mode) -------------------------------------------


def changed(card, **changes):
    return SimpleNamespace(**vars(card) | changes)


async def test_kv_routing_follows_an_engine_back_on_new_kv_event_endpoints(nursery):
    import trio
    from support import wait_until

    from trio_direct.fleet.card import KvEventSource
    from trio_direct.kv_sync.feeds import KvFeeds
    from trio_direct.mock.kv_publisher import KvEventsConfig, open_kv_publishers
    from trio_direct.routing.block_hash import RoutingKey
    from trio_direct.routing.kv_events import BlockRemoved, BlockStored
    from trio_direct.routing.load_aware import LoadAwareRouting

    engine = kv_engine("e0", kv_events=(KvEventSource(0, "tcp://127.0.0.1:1"),))  # where it published before
    fleet = Fleet([engine], model=MODEL)
    kv = LoadAwareRouting([engine.card], routing_settings(ServeConfig(router_mode="kv")))
    feeds = KvFeeds(kv, fleet)
    assert kv.index is not None
    front = frontend([engine], router_mode="kv")
    front.kv_feeds = feeds
    await nursery.start(feeds.run)
    [before] = feeds.subscribers
    assert isinstance(before, KvEventSubscriber)
    config = KvEventsConfig.from_dict({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv"})
    async with open_kv_publishers(config, 1) as publishers:
        publisher = publishers[0]
        source = KvEventSource(0, publisher.bound_endpoint, "kv")
        old, engine.card = engine.card, changed(engine.card, kv_events=(source,))
        front.engine_changed(engine, old)
        [subscriber] = feeds.subscribers
        assert isinstance(subscriber, KvEventSubscriber)
        assert subscriber is not before and subscriber.sources == (source,)
        with trio.fail_after(10):  # a SUB joins late: publish until it has everything
            while subscriber.last_applied(0) != publisher.next_seq - 1:
                publisher.publish([BlockRemoved(block_hashes=(-1,))])
                await trio.sleep(0.02)
        tokens = tuple(range(16))
        publisher.publish([BlockStored((1, 2, 3, 4), None, tokens, 4)])
        await wait_until(lambda: subscriber.last_applied(0) == publisher.next_seq - 1)
        assert kv.index.find_matches(tokens) == {RoutingKey("e0", None): 1}
    await wait_until(lambda: not before._ranks)  # the old subscription ended: its socket is closed
    assert feeds.stats()["subscribers"]["e0"]["events"] > 0


def test_kv_routing_re_registers_ranks_when_the_dp_size_changes_and_keeps_a_same_endpoint_subscription(caplog):
    import logging

    from trio_direct.fleet.card import KvEventSource
    from trio_direct.kv_sync.feeds import KvFeeds
    from trio_direct.routing.block_hash import RoutingKey
    from trio_direct.routing.load_aware import LoadAwareRouting

    engine = kv_engine("e0", kv_events=(KvEventSource(0, "tcp://127.0.0.1:1"),))
    kv = LoadAwareRouting([engine.card], routing_settings(ServeConfig(router_mode="kv")))
    feeds = KvFeeds(kv, Fleet([engine], model=MODEL))
    assert kv.index is not None
    [first] = feeds.subscribers

    old, engine.card = engine.card, changed(engine.card, url="grpc://elsewhere:1")
    feeds.engine_changed(engine, old)  # nothing KV routing depends on changed
    assert feeds.subscribers == [first]

    ranks = (KvEventSource(0, "tcp://127.0.0.1:2"), KvEventSource(1, "tcp://127.0.0.1:3"))
    old, engine.card = engine.card, changed(engine.card, dp_size=2, kv_events=ranks)
    with caplog.at_level(logging.INFO, logger="trio_direct.kv_sync.feeds"):
        feeds.engine_changed(engine, old)
    [line] = [r.getMessage() for r in caplog.records if "came back" in r.getMessage()]
    assert "tcp://127.0.0.1:2, tcp://127.0.0.1:3 (was tcp://127.0.0.1:1" in line and "re-subscribed" in line
    assert kv.index.workers() == [RoutingKey("e0", 0), RoutingKey("e0", 1)]
    [subscriber] = feeds.subscribers
    assert isinstance(subscriber, KvEventSubscriber)
    assert subscriber is not first and subscriber.sources == ranks

    old, engine.card = engine.card, changed(engine.card, role="decode", dp_size=1, kv_events=())
    feeds.engine_changed(engine, old)  # decode engines are routed by load alone
    assert kv.index.workers() == [] and feeds.subscribers == []


# --- engines that leave the fleet ----------------------------------------------------------------


async def test_an_engine_that_left_leaves_the_kv_index_the_routers_and_its_subscription(nursery):
    from support import wait_until

    from trio_direct import metrics
    from trio_direct.fleet.card import KvEventSource
    from trio_direct.kv_sync.feeds import KvFeeds
    from trio_direct.routing.block_hash import RoutingKey
    from trio_direct.routing.kv_events import BlockStored
    from trio_direct.routing.load_aware import LoadAwareRouting

    leaving = kv_engine("e0", kv_events=(KvEventSource(0, "tcp://127.0.0.1:1"),))
    staying = kv_engine("e1", kv_events=(KvEventSource(0, "tcp://127.0.0.1:2"),))
    for engine in (leaving, staying):  # what the fleet model is computed from
        vars(engine.card).update(served_model_name="m", model_path="m", tokenizer_path="m", context_length=None,
                                 tool_call_parser=None, reasoning_parser=None, is_embedding=False,
                                 supports_images=False)  # fmt: skip
    front = frontend([leaving, staying], router_mode="kv")
    kv = LoadAwareRouting([leaving.card, staying.card], routing_settings(ServeConfig(router_mode="kv")))
    front.routing.kv = kv
    front.kv_feeds = KvFeeds(kv, front.fleet)
    await nursery.start(front.kv_feeds.run)
    [subscription, _] = front.kv_feeds.subscribers
    assert isinstance(subscription, KvEventSubscriber) and kv.index is not None
    tokens = tuple(range(16))
    kv.index.apply(RoutingKey("e0", None), BlockStored((1, 2, 3, 4), None, tokens, 4))
    assert kv.held_blocks("e0", leaving.card) == 1
    front.choose_route(tokens, "r1")  # its load, counted until released
    metrics.ROUTED.labels("e0", "aggregated").inc()

    front.fleet.withdraw(leaving)
    assert {front.choose_route(tokens, None).decode.engine.id for _ in range(3)} == {"e1"}
    front.engine_left(leaving)
    assert kv.index.workers() == [RoutingKey("e1", None)] and kv.held_blocks("e0", leaving.card) == 0
    assert [s.engine for s in front.kv_feeds.subscribers] == ["e1"]
    await wait_until(lambda: not subscription._ranks)  # its subscription ended: the socket is closed
    front.release("r1")  # a request that was routed there ends later: nothing left to release
    assert 'trio_direct_routing_decisions_total{engine="e0"' not in metrics.exposition().decode()


def test_a_busy_decode_engine_is_not_paired_and_no_prefill_starts_while_every_decode_engine_is_busy():
    front = frontend([engine("p0", "prefill"), engine("d0", "decode"), engine("d1", "decode")])
    threshold = BusyThreshold.parse("2")
    assert threshold is not None
    front.busy = EngineLoads(threshold)  # as serve sets it for --engine-busy-threshold 2
    by_id = {e.id: e for e in front.fleet.engines}
    front.apply_load(by_id["d0"], [{"num_running_reqs": 2, "num_waiting_reqs": 0}])
    assert front.headroom() == 2  # d1 takes two more; the prefill engine is idle
    assert {front.choose_route().decode.engine.id for _ in range(3)} == {"d1"}  # d0 is not paired
    front.apply_load(by_id["d1"], [{"num_running_reqs": 1, "num_waiting_reqs": 1}])
    assert front.headroom() == 0  # admission holds new requests: no prefill starts for a busy decode engine
    front.apply_load(by_id["d0"], [{"num_running_reqs": 0, "num_waiting_reqs": 0}])
    assert front.headroom() == 2
