"""Health checking: engines that were not up at start-up join once up and agreeing; engines that come
back with a changed card are checked again and reported."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import trio
from support import wait_until

from trio_direct.fleet.fleet import Engine, Fleet, FleetError
from trio_direct.fleet.health import EngineHealth
from trio_direct.mock.server import MockEngineConfig, run_mock_engine


def url(running) -> str:
    return f"http://127.0.0.1:{running.port}"


async def fleet_with_one_pending(start_mock, pool, port: int) -> Fleet:
    up = await start_mock(served_model_name="tiny")
    fleet = await Fleet.connect([url(up), f"127.0.0.1:{port}"], pool, wait_timeout=10, join_grace=0)
    assert [p.id for p in fleet.pending] == ["e1"]
    return fleet


async def test_a_pending_engine_joins_once_it_is_up(start_mock, pool, unused_port):
    fleet = await fleet_with_one_pending(start_mock, pool, unused_port)
    joined: list[Engine] = []
    health = EngineHealth(fleet, pool, timeout=1.0, on_join=joined.append)
    pending = fleet.pending[0]
    assert await health.try_join(pending) is None
    assert "cannot connect" in pending.reason and fleet.pending == [pending]

    await start_mock(served_model_name="tiny", port=unused_port)
    engine = await health.try_join(pending)
    assert engine is not None and joined == [engine]
    assert [e.id for e in fleet.engines] == ["e0", "e1"] and not fleet.pending
    assert engine.card.port == unused_port and engine.healthy
    assert [w.engine.id for w in fleet.workers()] == ["e0", "e1"]
    await health.check(engine)  # watched like any engine from now on
    assert engine.healthy


async def test_a_pending_engine_serving_another_model_is_refused_loudly_once(start_mock, pool, unused_port, caplog):
    fleet = await fleet_with_one_pending(start_mock, pool, unused_port)
    joined: list[Engine] = []
    health = EngineHealth(fleet, pool, timeout=1.0, on_join=joined.append)
    await start_mock(served_model_name="other", port=unused_port)
    with caplog.at_level(logging.ERROR, logger="trio_direct.fleet.health"):
        for _ in range(3):
            assert await health.try_join(fleet.pending[0]) is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "logged once, not at every probe"
    assert "engine e1" in errors[0].getMessage() and "served_model_name 'other'" in errors[0].getMessage()
    assert "stays out of routing" in errors[0].getMessage()
    assert [e.id for e in fleet.engines] == ["e0"] and [p.id for p in fleet.pending] == ["e1"]
    assert not joined


async def test_the_frontend_check_can_refuse_a_joining_engine(start_mock, pool, unused_port):
    fleet = await fleet_with_one_pending(start_mock, pool, unused_port)

    def wrong_flag(engine: Engine) -> None:
        raise FleetError(f"engine {engine.id} reports role {engine.card.role!r}; given with --prefill-engine-url")

    health = EngineHealth(fleet, pool, timeout=1.0, check_join=wrong_flag)
    await start_mock(served_model_name="tiny", port=unused_port)
    assert await health.try_join(fleet.pending[0]) is None
    assert "--prefill-engine-url" in fleet.pending[0].reason
    assert [e.id for e in fleet.engines] == ["e0"]


async def test_the_health_loop_probes_pending_engines_and_then_watches_them(start_mock, pool, unused_port, nursery):
    fleet = await fleet_with_one_pending(start_mock, pool, unused_port)
    downs: list[Engine] = []
    health = EngineHealth(fleet, pool, interval=0.05, timeout=0.5, failures_to_down=1, on_down=downs.append)
    await nursery.start(health.run)
    await trio.sleep(0.2)
    assert [p.id for p in fleet.pending] == ["e1"]

    late = trio.CancelScope()

    async def serve_late(*, task_status=trio.TASK_STATUS_IGNORED):
        with late:
            config = MockEngineConfig(served_model_name="tiny", port=unused_port, speedup=math.inf)
            await run_mock_engine(config, task_status=task_status)

    await nursery.start(serve_late)
    await wait_until(lambda: not fleet.pending, timeout=10)
    joined = fleet.engines[1]
    assert joined.id == "e1" and joined.healthy
    late.cancel()  # the joined engine goes away: its health watch notices
    await wait_until(lambda: downs == [joined], timeout=10)
    assert not joined.healthy


# --- an engine that comes back with a changed card ------------------------------------------------

KV_EVENTS = '{"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": "kv"}'


async def engine_that_restarts(nursery, port: int):
    """Start a mock on `port`; returns a function that stops it and starts it again with `options`."""
    running = trio.CancelScope()

    async def serve(options, *, task_status=trio.TASK_STATUS_IGNORED):
        with running:
            config = MockEngineConfig(served_model_name="tiny", port=port, speedup=math.inf, **options)
            await run_mock_engine(config, task_status=task_status)

    await nursery.start(serve, {})

    async def restart(**options) -> None:
        nonlocal running
        running.cancel()
        running = trio.CancelScope()
        await nursery.start(serve, options)

    return restart


async def test_an_engine_back_with_new_kv_events_endpoints_is_reported_with_its_old_card(pool, unused_port, nursery):
    restart = await engine_that_restarts(nursery, unused_port)
    fleet = await Fleet.connect([f"127.0.0.1:{unused_port}"], pool, wait_timeout=10, join_grace=0)
    [engine] = fleet.engines
    assert engine.card.kv_events == ()
    changes: list[tuple[Engine, object]] = []
    health = EngineHealth(fleet, pool, timeout=1.0, on_change=lambda e, old: changes.append((e, old)))
    health.unreachable(engine, "killed")
    first = engine.card

    await restart(kv_events_config=KV_EVENTS)
    await health.check(engine)
    assert engine.healthy and engine.card.kv_events, "back, with its new card applied"
    assert changes == [(engine, first)]
    await health.check(engine)
    assert len(changes) == 1, "an engine that stays up is not reported again"


async def test_an_engine_back_with_a_card_the_frontend_refuses_stays_down(pool, unused_port, nursery, caplog):
    restart = await engine_that_restarts(nursery, unused_port)
    fleet = await Fleet.connect([f"127.0.0.1:{unused_port}"], pool, wait_timeout=10, join_grace=0)
    [engine] = fleet.engines
    first = engine.card

    def refuse(candidate: Engine) -> None:
        assert candidate.card.kv_events and engine.card is first, "checked before it is applied"
        raise FleetError("its page size 3 does not divide the routing block 16")

    changes: list[Engine] = []
    health = EngineHealth(fleet, pool, timeout=1.0, check_join=refuse, on_change=lambda e, old: changes.append(e))
    health.unreachable(engine, "killed")
    await restart(kv_events_config=KV_EVENTS)
    with caplog.at_level(logging.ERROR, logger="trio_direct.fleet.health"):
        await health.check(engine)
        await health.check(engine)  # checked again every interval, refused again, logged once
    assert not engine.healthy and engine.card is first and not changes
    assert (
        caplog.text.count("frontend refuses: its page size 3 does not divide the routing block 16; it stays down") == 1
    )
    assert not fleet.workers()


class _BusyEngineClient:
    """An engine whose health checks never answer in time, streaming output or not."""

    name = "busy:1"
    last_output_at = -math.inf

    async def health(self, *, timeout: float = 5.0) -> bool:
        await trio.sleep_forever()


async def test_an_engine_streaming_output_is_busy_not_down_when_health_checks_time_out():
    client = _BusyEngineClient()
    engine = Engine("e0", SimpleNamespace(url="busy:1"), client)  # type: ignore[arg-type]
    health = EngineHealth(Fleet([engine], model=None), pool=None, interval=5.0, timeout=0.05)  # type: ignore[arg-type]
    for _ in range(3):  # tokens keep arriving: unanswered checks are load, not failure
        client.last_output_at = trio.current_time()
        await health.check(engine)
    assert engine.healthy
    client.last_output_at = trio.current_time() - 60  # silent for a minute: now it counts
    await health.check(engine)
    await health.check(engine)
    assert not engine.healthy


class _OpenCalls:
    """The frontend's open calls as the health check asks about them: `count` quiet calls."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.failed: list[str] = []

    def quiet_calls(self, client, since: float) -> int:
        return self.count if client.last_output_at < since else 0

    def fail_calls(self, client, since: float, reason: str) -> int:
        self.failed.append(reason)
        return self.count


async def test_an_unanswered_check_while_open_calls_produce_nothing_marks_the_engine_hung_at_once():
    client = _BusyEngineClient()
    client.last_output_at = trio.current_time() - 1  # it streamed a moment ago, then nothing
    engine = Engine("e0", SimpleNamespace(url="hung:1"), client)  # type: ignore[arg-type]
    calls, downs = _OpenCalls(3), list[Engine]()
    health = EngineHealth(
        Fleet([engine], model=None),  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        interval=5.0,
        timeout=0.05,
        calls=calls,
        on_down=downs.append,
    )
    await health.check(engine)  # one check is enough: no failures_to_down to wait for
    assert not engine.healthy and downs == [engine]
    assert len(calls.failed) == 1 and "hung" in calls.failed[0] and "3 open call(s)" in calls.failed[0]


async def test_an_unanswered_check_is_not_a_hang_without_open_calls_or_with_output_during_it():
    client = _BusyEngineClient()
    engine = Engine("e0", SimpleNamespace(url="busy:1"), client)  # type: ignore[arg-type]
    idle = EngineHealth(Fleet([engine], model=None), pool=None, timeout=0.05, calls=_OpenCalls(0))  # type: ignore[arg-type]
    await idle.check(engine)  # no open call: one failed check of two, as before
    assert engine.healthy
    streaming = _OpenCalls(3)
    health = EngineHealth(Fleet([engine], model=None), pool=None, timeout=0.05, calls=streaming)  # type: ignore[arg-type]

    async def output_during_the_check() -> None:
        await trio.sleep(0.01)
        client.last_output_at = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(output_during_the_check)
        await health.check(engine)
    assert engine.healthy and streaming.failed == []


async def test_a_check_asked_for_by_the_watch_runs_at_once_in_the_engines_own_watch(autojump_clock, nursery):
    """Calls that asked for their answer whole are quiet until their end: the watch asks for a
    check of their engine now (`check_soon`) rather than at its next interval, and an unanswered
    one finds the engine hung and fails its calls. Checks are never doubled."""
    client = _BusyEngineClient()
    client.last_output_at = -math.inf
    engine = Engine("e0", SimpleNamespace(url="hung:1"), client)  # type: ignore[arg-type]
    calls = _OpenCalls(2)
    calls.on_quiet = []  # type: ignore[attr-defined]  # as `StreamWatch` offers it
    health = EngineHealth(
        Fleet([engine], model=None),  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        interval=600.0,
        timeout=2.0,
        calls=calls,
    )
    assert calls.on_quiet == [health.check_soon]  # type: ignore[attr-defined]
    await nursery.start(health.run)
    await trio.sleep(1.0)
    started = trio.current_time()
    health.check_soon(client)
    health.check_soon(client)  # asked twice: one check
    health.check_soon(object())  # another engine's client: nothing here
    await trio.sleep(2.5)
    assert not engine.healthy and len(calls.failed) == 1 and "hung" in calls.failed[0]
    assert trio.current_time() - started < 600
