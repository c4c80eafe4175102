"""Busy engines: the threshold, the load it counts, and the workers routing is offered."""

from __future__ import annotations

import pytest

from trio_direct.routing.busy import UNLIMITED, BusyThreshold, EngineLoads


def test_the_threshold_flag():
    assert BusyThreshold.parse("") is None
    assert BusyThreshold.parse("64") == BusyThreshold(64, None)
    assert BusyThreshold.parse("0.9") == BusyThreshold(None, 0.9)
    assert BusyThreshold.parse("85%") == BusyThreshold(None, 0.85)
    assert BusyThreshold.parse("64, 0.9") == BusyThreshold(64, 0.9)
    for bad in ("0", "1.5", "x", "-3"):
        with pytest.raises(ValueError):
            BusyThreshold.parse(bad)


def poll(running: int, waiting: int = 0, usage: float = 0.0) -> dict:
    return {"num_running_reqs": running, "num_waiting_reqs": waiting, "token_usage": usage}


def test_load_is_the_larger_of_the_poll_and_our_own_requests():
    loads = EngineLoads(BusyThreshold(4))
    loads.routed("r1", ["a"])
    loads.routed("r2", ["a"])
    assert loads.requests("a") == 2 and loads.room("a") == 2
    loads.apply_poll("a", poll(1, 2))  # others' requests too: 3 in all by the poll
    assert loads.requests("a") == 3
    loads.apply_poll("a", poll(0))  # a poll behind our routing: our count stands
    assert loads.requests("a") == 2
    loads.released("r1")
    loads.released("r2")
    loads.released("r2")  # twice is harmless
    assert loads.requests("a") == 0


def test_busy_workers_get_nothing_new_while_another_is_not_busy():
    loads = EngineLoads(BusyThreshold(2))
    loads.apply_poll("a", poll(2))
    assert loads.busy("a") and not loads.busy("b")
    assert loads.prefer_idle(["a", "b"], str) == ["b"]
    loads.apply_poll("b", poll(1, 1))
    assert loads.prefer_idle(["a", "b"], str) == ["a", "b"]  # all busy: all offered (admission holds new ones)
    assert loads.headroom(["a", "b"], str) == 0
    loads.forget("a")
    assert loads.headroom(["a", "b"], str) == 2


def test_kv_usage_makes_a_worker_busy_regardless_of_requests():
    loads = EngineLoads(BusyThreshold(None, 0.9))
    loads.apply_poll("a", poll(0, usage=0.95))
    loads.apply_poll("b", poll(500, usage=0.5))
    assert loads.busy("a") and loads.room("b") == UNLIMITED
    assert loads.headroom(["b"], str) == UNLIMITED and loads.headroom(["a"], str) == 0


def test_a_prefill_leg_stops_counting_on_its_engine_at_the_first_token():
    loads = EngineLoads(BusyThreshold(1))
    loads.routed("r", ["prefill", "decode"])
    assert loads.busy("prefill") and loads.busy("decode")
    loads.first_token("r")
    assert not loads.busy("prefill") and loads.busy("decode")
    loads.released("r")
    assert not loads.busy("decode")
