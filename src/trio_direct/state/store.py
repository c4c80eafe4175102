"""The state store: one interface (`StateStore`) over memory, SQLite, PostgreSQL and Redis,
opened from a ``--state-store`` URL by `open_state_store`.

The backends are a table by URL scheme (`BACKENDS`); an unknown scheme fails at start-up listing
the known ones. See `trio_direct.state.base` for the data model every backend implements.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from trio_direct.state.base import (
    DEFAULT_TTL,
    STORE_TTL,
    EntryTooLarge,
    StateStore,
    StoreSettings,
    StoreUnavailable,
    UnknownStore,
    redacted_url,
    window_position,
)
from trio_direct.state.memory import open_memory
from trio_direct.state.redis_store import open_redis
from trio_direct.state.sql import open_postgres, open_sqlite

__all__ = [
    "BACKENDS",
    "DEFAULT_TTL",
    "STORE_TTL",
    "EntryTooLarge",
    "StateStore",
    "StoreSettings",
    "StoreUnavailable",
    "UnknownStore",
    "check_url",
    "open_state_store",
    "redacted_url",
    "window_position",
]

#: A backend's opener: the URL and settings in, the open store for the context's duration.
Opener = Callable[[str, StoreSettings], AbstractAsyncContextManager[StateStore]]

#: URL scheme -> backend (``memory`` has no ``://``). The drivers (psycopg, redis-py) are imported
#: only when their backend opens.
BACKENDS: dict[str, Opener] = {
    "memory": open_memory,
    "sqlite": open_sqlite,
    "postgresql": open_postgres,
    "postgres": open_postgres,
    "redis": open_redis,
    "rediss": open_redis,
}


def scheme_of(url: str) -> str:
    if "://" not in url:
        return url.strip().lower()
    return url.split("://", 1)[0].lower()


def check_url(url: str) -> None:
    """`UnknownStore` unless a backend serves `url` (checked at start-up, before anything runs)."""
    scheme = scheme_of(url)
    if scheme == "sqlite" and not url.split("://", 1)[-1]:
        raise UnknownStore(f"--state-store {url!r}: give the database file, as sqlite:///PATH")
    if scheme not in BACKENDS:
        raise UnknownStore(
            f"--state-store {redacted_url(url)!r}: unknown kind {scheme!r}; known: "
            + ", ".join(s if s == "memory" else f"{s}://..." for s in sorted(BACKENDS))
        )


@asynccontextmanager
async def open_state_store(url: str, settings: StoreSettings | None = None) -> AsyncIterator[StateStore]:
    """Open the store `url` names for the duration of the context (`UnknownStore` for an unknown kind).

    A backend that is down at start-up still opens: its calls raise `StoreUnavailable` until it is
    up (a frontend serves chat while its database restarts)."""
    check_url(url)
    async with BACKENDS[scheme_of(url)](url, settings or StoreSettings()) as store:
        yield store
