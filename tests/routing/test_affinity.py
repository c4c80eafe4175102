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


def test_a_new_session_picks_the_same_engine_on_every_frontend_and_moves_only_when_its_engine_leaves():
    from trio_direct.routing.affinity import rendezvous_choice

    engines = [f"10.0.0.{i}:30000/None" for i in range(4)]
    sessions = [f"chat-{i}" for i in range(200)]
    chosen = {s: engines[rendezvous_choice(s, engines)] for s in sessions}
    # another frontend lists the engines in another order: the same engine for every session
    assert all(engines[::-1][rendezvous_choice(s, engines[::-1])] == chosen[s] for s in sessions)
    assert len(set(chosen.values())) == 4  # sessions spread over every engine
    left = engines[1:]
    for s in sessions:
        after = left[rendezvous_choice(s, left)]
        assert after == chosen[s] or chosen[s] == engines[0]  # only the leaving engine's sessions move
    assert rendezvous_choice("chat", []) == -1
