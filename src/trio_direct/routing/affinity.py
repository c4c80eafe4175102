"""Session affinity: requests that carry one session key stick to the engine that served it (sans-IO).

A chat client that sends its conversation id (``X-Session-ID``, or the OpenAI ``user`` field with
``--router-affinity-from-user``) gets every turn on the same engine, where its earlier turns are
cached, whatever the routing mode: KV-aware routing finds that engine by itself when the engines
publish KV events, round-robin and the load-only policies never would.

The table maps a session key to the routing key of its engine for ``ttl`` seconds after the
session's last request (each request renews it). The caller decides when a pin is not to be
honoured (engine unhealthy, over its load threshold) and then records the new engine. Memory is
bounded: past ``max_sessions`` the sessions idle longest go first.

A session with no live pin (its first request, or one whose engine left) goes to its
*rendezvous* engine (`rendezvous_choice`: the highest hash of session key and engine address among
the engines offered), which every frontend computes alike: the workers of a host and the replicas
of a deployment send one session to one engine without sharing the table.

Sans-IO: the clock is injectable (``time.monotonic`` by default).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import xxhash

__all__ = ["DEFAULT_MAX_SESSIONS", "SessionAffinity", "rendezvous_choice"]

DEFAULT_MAX_SESSIONS = 100_000


class SessionAffinity:
    """Session key -> the worker its requests go to, while the session is active."""

    __slots__ = ("_clock", "_max", "_sessions", "ttl")

    def __init__(
        self, ttl: float, *, max_sessions: int = DEFAULT_MAX_SESSIONS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not ttl > 0:
            raise ValueError("ttl must be > 0")
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.ttl = ttl
        self._max = max_sessions
        self._clock = clock
        # session key -> (worker, expiry), least recently used first
        self._sessions: OrderedDict[str, tuple[Hashable, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session: str) -> Hashable | None:
        """The worker ``session`` is pinned to, ``None`` if none (or it expired)."""
        entry = self._sessions.get(session)
        if entry is None:
            return None
        worker, expiry = entry
        if expiry <= self._clock():
            del self._sessions[session]
            return None
        return worker

    def remember(self, session: str, worker: Hashable) -> None:
        """Pin ``session`` to ``worker`` for ``ttl`` seconds from now."""
        now = self._clock()
        sessions = self._sessions
        sessions[session] = (worker, now + self.ttl)
        sessions.move_to_end(session)
        while len(sessions) > self._max:
            sessions.popitem(last=False)
        # Expired sessions at the old end go as new ones come: the table never holds many.
        while sessions:
            _, (_, expiry) = next(iter(sessions.items()))
            if expiry > now:
                break
            sessions.popitem(last=False)


def rendezvous_choice(session: str, names: Sequence[str]) -> int:
    """The index of `session`'s engine among `names` (stable engine names, e.g. addresses): the
    highest hash of (session, name). The same on every frontend for the same names; when an engine
    leaves, only its own sessions move (rendezvous hashing). -1 for no names."""
    best, best_score = -1, -1
    for index, name in enumerate(names):
        score = xxhash.xxh3_64_intdigest(f"{session}\x00{name}".encode())
        if score > best_score:
            best, best_score = index, score
    return best
