"""Which engines each source of engines wants in the fleet, turned into joins and leaves (sans-IO).

A source (`--engine-dns`, `--engine-dns-srv`, `--engine-file`) answers every interval with the
engines it names now. `SourceState` turns those answers into changes, with the rules an operator
relies on when a resolver or a file misbehaves:

- An engine joins as soon as an answer names it.
- An engine leaves only once successful answers have left it out for ``grace`` seconds
  (``--discovery-grace``); an answer that names it again meanwhile cancels that. Records that flap
  (present, missing, present) therefore never churn connections.
- A failed answer (resolver error, timeout, malformed file) changes nothing, and neither does an
  empty one from DNS (`keep_when_empty`): a DNS outage, or a Service briefly without ready
  endpoints, must not empty the fleet. The source is then *holding* its engines (`holding`).
- An answer that names an engine with another model or role is a leave of the old entry and a join
  of the new one, at once.

`EngineIds` hands out engine ids (``e0``, ``e1``, ...) in order of first appearance, never reusing
one within a process: ``/admin/engines/{id}``, logs and metric labels always mean one engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trio_direct.fleet.card import Role
from trio_direct.fleet.engine_url import parse_engine_url

__all__ = ["Address", "EngineIds", "EngineSpec", "SourceChanges", "SourceState", "address_of"]

#: An engine's identity across sources: its gRPC host (lower case) and port.
Address = tuple[str, int]


def address_of(url: str) -> Address:
    """The identity of the engine at `url` (`ValueError` for a malformed URL)."""
    host, port = parse_engine_url(url)
    return host.lower(), port


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine as a source names it: its URL and, optionally, the model pool and role it must have.

    ``model`` puts the engine in that model's pool whatever name it reports; ``role`` is checked
    against the role its probe reports (a mismatch keeps it out).
    """

    url: str
    model: str | None = None
    role: Role | None = None

    @property
    def address(self) -> Address:
        return address_of(self.url)

    def to_json(self) -> dict:
        return {"url": self.url, "model": self.model, "role": self.role}


@dataclass(frozen=True, slots=True)
class SourceChanges:
    """What one answer changes: engines to join and engines to leave (each at most once)."""

    added: tuple[EngineSpec, ...] = ()
    removed: tuple[EngineSpec, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(slots=True)
class SourceState:
    """One source's wanted engines, kept from its answers with a grace period (see the module doc)."""

    name: str
    grace: float
    #: An empty successful answer changes nothing (DNS); False where empty means "no engines" (a file).
    keep_when_empty: bool = True
    #: The last answer failed (or was empty and kept): the engines above are held, not confirmed.
    holding: bool = False
    #: Whether any answer (successful or not) was observed yet.
    answered: bool = False
    _current: dict[Address, EngineSpec] = field(default_factory=dict)
    #: Address -> when successful answers first left it out (its grace period runs from then).
    _missing_since: dict[Address, float] = field(default_factory=dict)

    @property
    def specs(self) -> list[EngineSpec]:
        """The engines this source wants now, in the order they first appeared."""
        return list(self._current.values())

    def observe(self, answer: Sequence[EngineSpec] | None, now: float) -> SourceChanges:
        """Apply one answer (None: the lookup failed) observed at `now` (seconds, any clock)."""
        self.answered = True
        if answer is None or (not answer and self.keep_when_empty):
            self.holding = True
            return SourceChanges()
        self.holding = False
        named = _unique(answer)
        added: list[EngineSpec] = []
        removed: list[EngineSpec] = []
        for address, spec in named.items():
            self._missing_since.pop(address, None)
            known = self._current.get(address)
            if known == spec:
                continue
            if known is not None:  # another model or role: the old entry leaves, the new one joins
                removed.append(known)
            self._current[address] = spec
            added.append(spec)
        for address in [a for a in self._current if a not in named]:
            since = self._missing_since.setdefault(address, now)
            if now - since >= self.grace:
                removed.append(self._current.pop(address))
                del self._missing_since[address]
        return SourceChanges(tuple(added), tuple(removed))

    def forget(self, address: Address) -> None:
        """Drop `address` without a change: the next answer that names it makes it join again
        (after the fleet let it go for failing its health checks while this source was holding)."""
        self._current.pop(address, None)
        self._missing_since.pop(address, None)


def _unique(answer: Iterable[EngineSpec]) -> dict[Address, EngineSpec]:
    """The answer by address, the first entry of a repeated address winning."""
    named: dict[Address, EngineSpec] = {}
    for spec in answer:
        named.setdefault(spec.address, spec)
    return named


class EngineIds:
    """Engine ids ``e{n}`` in order of first appearance, never reused within the process."""

    __slots__ = ("_next",)

    def __init__(self, first: int = 0) -> None:
        self._next = first

    def allocate(self) -> str:
        engine_id = f"e{self._next}"
        self._next += 1
        return engine_id
