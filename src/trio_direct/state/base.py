"""The state store's vocabulary: the `StateStore` protocol, its errors and settings, and what
every backend shares (sans-IO). `trio_direct.state.store` opens one from a URL.

The state store is what every frontend process of a deployment shares, behind one interface.

Stored responses (`previous_response_id`, `GET /v1/responses/{id}`), conversations and their
items, the engines the admin API added or removed, and the counters of rate limits live here, so
that every worker of a host (``--workers N``) and every replica sees the same: a response stored
through one process is continued, retrieved and deleted through any other, and survives restarts
(except with ``memory``).

Every call is bounded by the store's timeout and raises
`StoreUnavailable` when the backend cannot answer: the API answers 503 for the requests that need
the store, and the others never touch it.

The data model is deliberately small, so that every backend implements it natively:

- **entries**: bytes by key, each expiring ``ttl`` seconds after its last write (``None``: never);
- **item lists**: ordered ``(item_id, bytes)`` under a key (an item added again under its id is
  replaced in place); the whole list expires ``ttl`` after its last addition;
- **fixed-window counters** (`add_to_window`) and **leased slots** (`acquire_slot`,
  `release_slot`), atomic across processes, for request-rate and concurrency limits.

Entries and items above ``max_entry_bytes`` are refused with `EntryTooLarge`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "DEFAULT_TTL",
    "EntryTooLarge",
    "StateStore",
    "StoreSettings",
    "StoreUnavailable",
    "UnknownStore",
    "check_size",
    "redacted_url",
    "resolve_ttl",
    "window_position",
]

#: Stored responses and conversations are kept 30 days after their last write, as OpenAI keeps them.
DEFAULT_TTL = 30 * 24 * 3600.0


class StoreUnavailable(Exception):
    """The backend did not answer within the timeout, or answered with an error (it is down)."""


class EntryTooLarge(ValueError):
    """A value above the store's per-entry byte cap."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes is above the state store's limit of {limit} bytes per entry")
        self.size = size
        self.limit = limit


class UnknownStore(ValueError):
    """A `--state-store` URL no backend serves."""


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """What every backend is opened with."""

    #: Seconds an entry lives after its last write (`--state-store-ttl`).
    ttl: float = DEFAULT_TTL
    #: Largest entry or item, in bytes (`--state-store-max-entry-bytes`).
    max_entry_bytes: int = 16 * 1024 * 1024
    #: Seconds one call may take before it fails with `StoreUnavailable`.
    timeout: float = 5.0
    #: memory only: bounds on all entries together (least recently written go first).
    memory_max_bytes: int = 256 * 1024 * 1024
    memory_max_entries: int = 100_000


#: The `ttl` argument's default: the store's own `StoreSettings.ttl`.
class _StoreTtl:
    def __repr__(self) -> str:
        return "STORE_TTL"


STORE_TTL: float | None = _StoreTtl()  # type: ignore[assignment]


class StateStore(Protocol):
    """One deployment's shared state (see the module doc). Every method may raise `StoreUnavailable`."""

    #: The store's URL with any password masked, for logs.
    url: str
    settings: StoreSettings

    async def ping(self) -> None:
        """Raise `StoreUnavailable` unless the backend answers now."""

    async def get(self, key: str) -> bytes | None:
        """The entry under `key`; None if there is none (or it expired)."""

    async def put(self, key: str, value: bytes, *, ttl: float | None = STORE_TTL) -> None:
        """Store `value` under `key` (replacing it) for `ttl` seconds (None: for ever). `EntryTooLarge`
        above the byte cap."""

    async def delete(self, key: str) -> bool:
        """Remove the entry and the item list under `key`; whether there was either."""

    async def add_items(self, key: str, items: Sequence[tuple[str, bytes]], *, ttl: float | None = STORE_TTL) -> None:
        """Append `items` (id, value) to the list under `key`, atomically; an id already there is
        replaced in place. The list then lives `ttl` seconds. `EntryTooLarge` for an item above the cap."""

    async def items(self, key: str) -> list[tuple[str, bytes]]:
        """The list under `key`, oldest first ([] if none)."""

    async def delete_item(self, key: str, item_id: str) -> bool:
        """Remove one item; whether it was there."""

    async def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        """Add `amount` to `key`'s counter of the current fixed window (``floor(now / window_s)``),
        atomically across processes: (the window's total after the add, seconds until it resets).
        A counter expires with its window."""

    async def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        """Atomically drop `key`'s holders whose lease expired, then take a slot for `holder` if fewer
        than `limit` hold one (a holder that holds one already renews its lease): (acquired, holders now)."""

    async def release_slot(self, key: str, holder: str) -> None:
        """Give `holder`'s slot of `key` back (nothing if it holds none)."""


def window_position(now: float, window_s: float) -> tuple[int, float]:
    """The fixed window `now` falls in, and the seconds until it ends (sans-IO, shared by backends)."""
    if not window_s > 0:
        raise ValueError("window_s must be > 0")
    index = math.floor(now / window_s)
    return index, max((index + 1) * window_s - now, 0.0)


def check_size(settings: StoreSettings, value: bytes) -> None:
    if len(value) > settings.max_entry_bytes:
        raise EntryTooLarge(len(value), settings.max_entry_bytes)


def resolve_ttl(settings: StoreSettings, ttl: float | None) -> float | None:
    """`STORE_TTL` as the store's own; a non-positive ttl as none (kept for ever)."""
    if isinstance(ttl, _StoreTtl):
        ttl = settings.ttl
    return ttl if ttl is not None and ttl > 0 else None


def redacted_url(url: str) -> str:
    """`url` with its password replaced by ``***`` (for logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))
