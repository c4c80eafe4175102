"""Session affinity: a session's requests stick to one engine while the session is active."""

from __future__ import annotations

import pytest

from trio_direct.routing.affinity import SessionAffinity


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_session_sticks_until_it_was_idle_for_the_ttl():
    clock = Clock()
    table = SessionAffinity(60, clock=clock)
    assert table.get("chat-1") is None
    table.remember("chat-1", "e0")
    clock.now += 59
    assert table.get("chat-1") == "e0"
    table.remember("chat-1", "e0")  # each request renews it
    clock.now += 59
    assert table.get("chat-1") == "e0"
    clock.now += 1
    assert table.get("chat-1") is None and len(table) == 0


def test_the_table_is_bounded_and_expired_sessions_leave_as_new_ones_come():
    clock = Clock()
    table = SessionAffinity(10, max_sessions=3, clock=clock)
    for i in range(5):
        table.remember(f"s{i}", "e0")
    assert len(table) == 3 and table.get("s0") is None and table.get("s4") == "e0"
    clock.now += 11
    table.remember("new", "e1")
    assert len(table) == 1


@pytest.mark.parametrize("ttl", [0, -1, float("nan")])
def test_a_ttl_must_be_positive(ttl):
    with pytest.raises(ValueError):
        SessionAffinity(ttl)
