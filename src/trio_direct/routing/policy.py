"""Which workers serve a request: an aggregated engine, or a prefill + decode pair (sans-IO).

The caller passes the healthy workers of each role on every call, so an engine that goes down
simply stops being offered. With prefill engines in the fleet, a request is served disaggregated
when a healthy prefill and a healthy decode worker exist; otherwise aggregated engines serve it,
unless ``--enforce-disagg`` says to refuse. A decode engine never serves alone.

Round-robin and random take turns per pool; in kv mode the prefill (or aggregated) pool is weighed
by prefix overlap and load, the decode pool by load; least-load and power-of-two weigh load alone
(`LoadAwareRouting` serves all three). A route chosen with a request id counts as load until `release`
(and its prefill share until `first_token`).

A request with a session key (`SessionAffinity`) goes to the aggregated engine its session went
to last, unless that engine is no longer offered (unhealthy) or is busy (`LoadAwareRouting.busy`: KV
cache use over `--engine-busy-threshold`); a session with no such engine goes to its rendezvous
engine among those offered and not busy (`rendezvous_choice`, the same on every frontend), and
its session follows it. Disaggregated requests are routed without affinity: their prefix lives with the
prefill engine KV-aware routing picks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from trio_direct.routing.affinity import SessionAffinity, rendezvous_choice
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.kv_router import Decision
from trio_direct.routing.load_aware import LoadAwareRouting
from trio_direct.routing.policies import routing_policy
from trio_direct.routing.simple import NoWorkerAvailable, RoundRobinRouter, Router

__all__ = ["Candidates", "Route", "RoutingPolicy"]

W = TypeVar("W")


@dataclass(frozen=True, slots=True)
class Candidates(Generic[W]):
    """The healthy workers of each role, and how a worker is known to KV routing."""

    aggregated: Sequence[W]
    prefill: Sequence[W]
    decode: Sequence[W]
    key: Callable[[W], RoutingKey]
    #: Prefill engines are configured (healthy or not): the fleet serves disaggregated.
    disaggregated: bool = False
    #: A worker's name that every frontend gives it alike (its engine's address and rank), for the
    #: sessions' rendezvous choice; None: `key`'s text.
    name: Callable[[W], str] | None = None


@dataclass(frozen=True, slots=True)
class Route(Generic[W]):
    """The workers of one request: `decode` generates; `prefill` is set for disaggregated serving."""

    decode: W
    prefill: W | None = None
    #: kv mode: why the (prefill or aggregated) worker was chosen, and the decode worker.
    decision: Decision | None = None
    decode_decision: Decision | None = None
    #: The request's session was pinned to this engine (session affinity held).
    sticky: bool = False


class RoutingPolicy:
    """The fleet's routing: the `mode`'s list-only router, or load-aware routing (`kv`).

    Raises `UnknownRoutingPolicy` for a mode that is not registered. A load-aware mode routes through
    `kv`; built without one (a unit test of the pool's plumbing) it takes turns.
    """

    def __init__(
        self,
        mode: str = "round-robin",
        *,
        enforce_disagg: bool = False,
        kv: LoadAwareRouting | None = None,
        affinity: SessionAffinity | None = None,
    ) -> None:
        kind = routing_policy(mode)
        self.mode = mode
        self.enforce_disagg = enforce_disagg
        self.kv = kv
        self.affinity = affinity
        self._router: Router = kind.simple() if kind.simple is not None else RoundRobinRouter()
        self._prefill_router: Router = RoundRobinRouter()
        self._decode_router: Router = RoundRobinRouter()

    def choose(
        self,
        candidates: Candidates[W],
        token_ids: Sequence[int] = (),
        request_id: str | None = None,
        session_key: str | None = None,
    ) -> Route[W]:
        """Where a request goes; raises `NoWorkerAvailable` when nothing healthy can serve it.

        Without a `request_id` nothing is recorded (`GET /debug/routing`), the session's pin
        included.
        """
        kv = self.kv
        if candidates.disaggregated:
            prefill, decode = candidates.prefill, candidates.decode
            if prefill and decode:
                if kv is not None:
                    prefill_worker, decision = kv.choose(kv.router, prefill, candidates.key, token_ids, request_id)
                    decode_worker, decode_decision = kv.choose(
                        kv.decode_router, decode, candidates.key, token_ids, request_id
                    )
                    return Route(decode_worker, prefill_worker, decision, decode_decision)
                return Route(self._decode_router.choose(decode), self._prefill_router.choose(prefill))
            if self.enforce_disagg:
                raise NoWorkerAvailable("no healthy prefill and decode engine pair (--enforce-disagg)")
        aggregated = candidates.aggregated
        if not aggregated:
            raise NoWorkerAvailable("no healthy engine")
        pinned, held = self._pinned(session_key, aggregated, candidates)
        if kv is not None:
            worker, decision = kv.choose(kv.router, aggregated, candidates.key, token_ids, request_id, pinned)
            route = Route(worker, None, decision, sticky=held)
        elif pinned is not None:
            route = Route(next(w for w in aggregated if candidates.key(w) == pinned), None, sticky=held)
        else:
            route = Route(self._router.choose(aggregated), None)
        if session_key is not None and self.affinity is not None and request_id is not None:
            self.affinity.remember(session_key, candidates.key(route.decode))
        return route

    def _pinned(
        self, session_key: str | None, workers: Sequence[W], candidates: Candidates[W]
    ) -> tuple[RoutingKey | None, bool]:
        """(the session's engine, whether its pin held): the engine it sticks to, if offered and not
        busy; else its rendezvous engine among the offered ones that are not busy (the same choice
        on every frontend); (None, False) without a session or affinity."""
        if session_key is None or self.affinity is None:
            return None, False
        key = candidates.key
        pinned = self.affinity.get(session_key)
        if pinned is not None and any(key(w) == pinned for w in workers) and not self._busy(pinned):
            return pinned, True  # type: ignore[return-value]
        free = [w for w in workers if not self._busy(key(w))]
        if not free:
            return None, False
        name = candidates.name or (lambda w: str(key(w)))
        return key(free[rendezvous_choice(session_key, [name(w) for w in free])]), False

    def _busy(self, pinned: object) -> bool:
        return self.kv is not None and isinstance(pinned, RoutingKey) and self.kv.busy(pinned)

    def can_route(self, candidates: Candidates[W]) -> bool:
        """Whether `choose` would find a route now (health), recording nothing."""
        if candidates.disaggregated and candidates.prefill and candidates.decode:
            return True
        if candidates.disaggregated and self.enforce_disagg:
            return False
        return bool(candidates.aggregated)

    def first_token(self, request_id: str) -> None:
        """The request's first output arrived: its prefill no longer loads its engine."""
        if self.kv is not None:
            self.kv.first_token(request_id)

    def release(self, request_id: str) -> None:
        """The request ended (completion, abort or error): its load leaves its engines."""
        if self.kv is not None:
            self.kv.free(request_id)
