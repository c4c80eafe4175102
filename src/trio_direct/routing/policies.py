"""The routing policies, one table: the only place ``--router-mode`` names are spelled (sans-IO).

A policy is either a router that looks at the list of healthy workers alone (round-robin, random:
`simple`), or load-aware routing (`LoadAwareRouting`) with a `selection` over the load it tracks: ``cost``
(prefix overlap and load: ``kv``), ``least-load`` or ``power-of-two``. `RoutingPolicy` builds a pool's
routing from the entry; an unknown name fails with the list of known ones (`UnknownRoutingPolicy`),
never falling back to another policy. Adding a policy is one `register` call (CONTRIBUTING.md, "Add a
routing policy").

`RoutingSettings` is what routing needs from the serve settings: routing/ does not know the command
line (``ServeConfig.routing()`` builds it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trio_direct.routing.simple import RandomRouter, RoundRobinRouter, Router

__all__ = [
    "RoutingPolicyKind",
    "RoutingSettings",
    "UnknownRoutingPolicy",
    "register",
    "routing_policy",
    "routing_policy_names",
]


class UnknownRoutingPolicy(ValueError):
    """A name no routing policy is registered under; the message lists the known ones."""


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """The routing knobs of one frontend (flags ``--router-*``, ``--enforce-disagg``, ``--kv-cache-block-size``)."""

    mode: str = "round-robin"
    enforce_disagg: bool = False
    #: The routing block; None: the smallest multiple of every engine's page size that is >= 16.
    kv_cache_block_size: int | None = None
    #: The KV cost's preset (`load_aware.PRESETS`), and the weights given explicitly over it.
    preset: str = "ttft"
    overlap_score_credit: float | None = None
    prefill_load_scale: float | None = None
    temperature: float | None = None
    #: kv: index the engines' KV events (else: an approximate index of own decisions, `ttl_secs`).
    kv_events: bool = True
    ttl_secs: float = 120.0
    #: KV cache use at which a session's engine counts as busy and the session moves.
    session_busy_fraction: float = 0.95


@dataclass(frozen=True, slots=True)
class RoutingPolicyKind:
    """One ``--router-mode``: a list-only router (`simple`), or load-aware routing's `selection`."""

    name: str
    simple: Callable[[], Router] | None = None
    #: `KvRouterConfig.selection` for a load-aware policy: ``cost``, ``least-load`` or ``power-of-two``.
    selection: str | None = None

    @property
    def load_aware(self) -> bool:
        """Whether the policy needs `LoadAwareRouting` (load tracking, and for ``cost`` the prefix index)."""
        return self.selection is not None


_REGISTRY: dict[str, RoutingPolicyKind] = {}


def register(kind: RoutingPolicyKind) -> RoutingPolicyKind:
    """Add a routing policy; exactly one of `simple` and `selection` must be given."""
    if (kind.simple is None) == (kind.selection is None):
        raise ValueError(f"routing policy {kind.name!r}: give a simple router or a load-aware selection")
    if kind.name in _REGISTRY:
        raise ValueError(f"routing policy {kind.name!r} is already taken")
    _REGISTRY[kind.name] = kind
    return kind


def routing_policy(name: str) -> RoutingPolicyKind:
    """The policy called `name`; raises `UnknownRoutingPolicy` listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownRoutingPolicy(
            f"unknown router mode {name!r} (known: {', '.join(routing_policy_names())})"
        ) from None


def routing_policy_names() -> tuple[str, ...]:
    """Every ``--router-mode``, in the order they were registered."""
    return tuple(_REGISTRY)


register(RoutingPolicyKind("round-robin", simple=RoundRobinRouter))
register(RoutingPolicyKind("random", simple=RandomRouter))
register(RoutingPolicyKind("kv", selection="cost"))
register(RoutingPolicyKind("least-load", selection="least-load"))
register(RoutingPolicyKind("power-of-two", selection="power-of-two"))
