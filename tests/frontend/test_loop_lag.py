"""Event-loop lag: a stall of the frontend's loop shows in /metrics and, past a threshold, in the log."""

from __future__ import annotations

import logging
from functools import partial

import httpx
import pytest
import trio
from support import start_frontend
from trio.testing import wait_all_tasks_blocked

from trio_direct.frontend.loop_lag import LagTracker, StallWarning, monitor_loop_lag
from trio_direct.metrics import REGISTRY


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_tracker_keeps_the_worst_lag_and_ignores_early_wakeups():
    tracker = LagTracker()
    for now, lag in enumerate([0.001, 0.04, -0.0005, 0.002]):
        assert tracker.observe(lag, float(now)) is None
    assert tracker.worst == 0.04
    assert tracker.samples == 4


def test_a_stall_over_the_threshold_is_warned_about_at_most_once_per_period_with_a_count_of_the_rest():
    tracker = LagTracker(warn_after=0.25, warn_every=10.0)
    assert tracker.observe(0.25, 0.0) is None  # at the threshold: not a stall
    assert tracker.observe(0.3, 1.0) == StallWarning(0.3, 0)
    assert tracker.observe(0.5, 2.0) is None
    assert tracker.observe(0.4, 5.0) is None
    assert tracker.observe(0.1, 11.5) is None  # not a stall: counts nothing
    assert tracker.observe(0.26, 12.0) == StallWarning(0.26, 2)
    assert tracker.observe(0.9, 13.0) is None
    assert tracker.worst == 0.9


async def test_a_blocked_loop_shows_in_the_metrics_and_the_log(mock_clock, nursery, caplog):
    count = sample("trio_direct_event_loop_lag_seconds_count")
    over_quarter = count - sample("trio_direct_event_loop_lag_seconds_bucket", le="0.25")
    tracker = await nursery.start(partial(monitor_loop_lag, 0.02, busy=lambda: True))
    await wait_all_tasks_blocked()
    with caplog.at_level(logging.WARNING, logger="trio_direct.frontend.loop_lag"):
        mock_clock.jump(0.3)  # the loop "was busy" 300 ms: the 20 ms timer fires 280 ms late
        await wait_all_tasks_blocked()
    assert tracker.worst == pytest.approx(0.28)
    assert sample("trio_direct_event_loop_lag_seconds_count") == count + 1
    after = sample("trio_direct_event_loop_lag_seconds_count") - sample(
        "trio_direct_event_loop_lag_seconds_bucket", le="0.25"
    )
    assert after == over_quarter + 1
    assert sample("trio_direct_event_loop_lag_max_seconds") >= 0.279
    assert [r.getMessage() for r in caplog.records] == ["event loop stalled 280 ms (every stream waited)"]
    mock_clock.jump(0.02)  # an on-time wake-up: counted, no warning
    await wait_all_tasks_blocked()
    assert sample("trio_direct_event_loop_lag_seconds_count") == count + 2
    assert tracker.worst == pytest.approx(0.28)


async def test_with_nothing_in_flight_the_timer_wakes_rarely_and_speeds_up_once_requests_are_in_flight(
    mock_clock, nursery
):
    busy = False
    count = sample("trio_direct_event_loop_lag_seconds_count")
    tracker = await nursery.start(partial(monitor_loop_lag, 0.02, idle_interval=0.5, busy=lambda: busy))
    for _ in range(25):  # half a second in 20 ms steps: idle, one wake-up
        mock_clock.jump(0.02)
        await wait_all_tasks_blocked()
    assert tracker.samples == 1
    busy = True  # a request arrived: the monitor notices at its next wake-up, at most 0.5 s later,
    for _ in range(50):  # and then wakes every 20 ms: ~25 times in the second half of this second
        mock_clock.jump(0.02)
        await wait_all_tasks_blocked()
    assert 22 <= tracker.samples <= 28
    mock_clock.jump(0.6)  # a stall while busy: measured in full
    await wait_all_tasks_blocked()
    assert tracker.worst == pytest.approx(0.58)
    busy = False
    mock_clock.jump(0.02)
    await wait_all_tasks_blocked()
    samples = tracker.samples
    mock_clock.jump(0.9)  # idle again; a stall over a wake-up is still measured in full
    await wait_all_tasks_blocked()
    assert tracker.samples == samples + 1 and tracker.worst == pytest.approx(0.58)
    assert sample("trio_direct_event_loop_lag_seconds_count") == count + tracker.samples


def test_the_default_busy_signal_is_the_in_flight_gauge():
    from trio_direct import metrics
    from trio_direct.frontend import loop_lag

    assert not loop_lag._requests_in_flight()
    metrics.IN_FLIGHT.inc()
    try:
        assert loop_lag._requests_in_flight()
    finally:
        metrics.IN_FLIGHT.dec()


async def test_a_serving_frontend_reports_its_loop_lag(mock_engine_factory, nursery):
    engine = await mock_engine_factory()
    base = await start_frontend(nursery, "--engine-url", f"grpc://{engine.host}:{engine.port}")

    async def scrape() -> dict[str, float]:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            text = (await client.get("/metrics")).text
        return {
            name: float(value)
            for name, _, value in (line.rpartition(" ") for line in text.splitlines())
            if name.startswith("trio_direct_event_loop_lag")
        }

    first = await scrape()
    assert "trio_direct_event_loop_lag_max_seconds" in first
    with trio.fail_after(10):
        while (await scrape())["trio_direct_event_loop_lag_seconds_count"] <= first[
            "trio_direct_event_loop_lag_seconds_count"
        ]:
            await trio.sleep(0.05)
