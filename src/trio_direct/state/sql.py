"""The SQL state stores: ``sqlite:///PATH`` (one host) and ``postgresql://...`` (several hosts).

Both keep the same five tables (`SCHEMA`), created or migrated at start-up (`MIGRATIONS`, applied
under a lock so that processes starting together migrate once), and run every call as one
transaction in a worker thread (`ThreadRunner`), bounded by the store's timeout:

- SQLite: one connection per process, in WAL mode (readers never wait for the writer; every
  ``--workers`` process of a host opens the same file), ``synchronous=FULL`` so that what a
  response acknowledged survives a power cut, a busy timeout for the other processes' writes, and
  ``BEGIN IMMEDIATE`` for every call that writes (reads take no lock).
- PostgreSQL: psycopg 3 with a `psycopg_pool.ConnectionPool` (each connection checked before use,
  so a restarted server costs no failed call), ``statement_timeout`` and ``connect_timeout`` set to
  the store's timeout; slots take a transaction-scoped advisory lock on their key. While the server
  is down the pool's reconnection attempts back off (1 s, 2 s, 4 s... by default, for up to five
  minutes), which after a long outage would keep a frontend answering 503 for about as long again
  once the server is back; `RECONNECT_WINDOW` ends each series of attempts early, and the next call
  that needs a connection starts a new one at once, so attempts are never much more than a second
  apart and a frontend serves again within about a second of the server accepting connections.

Expired rows are skipped by every read and deleted by a sweep every `SWEEP_INTERVAL` seconds.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

import trio

from trio_direct.state.base import (
    STORE_TTL,
    StateStore,
    StoreSettings,
    StoreUnavailable,
    check_size,
    redacted_url,
    resolve_ttl,
    window_position,
)
from trio_direct.state.threaded import ThreadRunner

__all__ = ["MIGRATIONS", "RECONNECT_WINDOW", "SCHEMA_VERSION", "SqlStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds between deletions of expired rows.
SWEEP_INTERVAL = 60.0

#: Seconds a PostgreSQL pool keeps retrying one lost connection (`psycopg_pool`'s
#: ``reconnect_timeout``) before giving it up; a call that needs a connection then asks for a new
#: one at once. Two seconds allow attempts at about 0, 1 and 2 s: never more than ~1.1 s apart.
RECONNECT_WINDOW = 2.0

#: Schema versions in order, each the statements that bring the previous one to it. `{blob}` is the
#: dialect's binary type. A new version appends an entry; none is ever edited.
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE IF NOT EXISTS td_entries (key TEXT PRIMARY KEY, value {blob} NOT NULL, "
        "expires_at DOUBLE PRECISION)",
        "CREATE TABLE IF NOT EXISTS td_items (key TEXT NOT NULL, item_id TEXT NOT NULL, seq BIGINT NOT NULL, "
        "value {blob} NOT NULL, expires_at DOUBLE PRECISION, PRIMARY KEY (key, item_id))",
        "CREATE INDEX IF NOT EXISTS td_items_order ON td_items (key, seq)",
        "CREATE TABLE IF NOT EXISTS td_windows (key TEXT PRIMARY KEY, window_index BIGINT NOT NULL, "
        "total BIGINT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
        "CREATE TABLE IF NOT EXISTS td_slots (key TEXT NOT NULL, holder TEXT NOT NULL, "
        "expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (key, holder))",
    ],
]
SCHEMA_VERSION = len(MIGRATIONS)

_LIVE = "(expires_at IS NULL OR expires_at > ?)"


class Dialect:
    """What differs between SQLite and PostgreSQL: placeholders, types, locks, connections."""

    name = "sql"
    blob = "BLOB"

    def sql(self, text: str) -> str:
        return text

    def connection(self, write: bool = True) -> AbstractContextManager[Any]:
        """A connection in a transaction, committed on a clean exit, rolled back on an error;
        `write`: the transaction writes (SQLite takes the file's write lock at once)."""
        raise NotImplementedError

    def lock(self, cursor: Any, key: str) -> None:
        """Serialize read-modify-write calls on `key` until the transaction ends."""

    def next_seq(self) -> str:
        """An SQL expression for an item's position (one `?`: the list's key); `add_items` holds
        the list's lock, so no two writers compute the same one."""
        return "(SELECT COALESCE(MAX(seq), 0) + 1 FROM td_items WHERE key = ?)"

    def close(self) -> None:
        pass


class SqlStore:
    """The `StateStore` on SQL (see the module doc); `dialect` says which database."""

    def __init__(
        self, url: str, settings: StoreSettings, dialect: Dialect, down_errors: tuple[type[BaseException], ...]
    ):
        self.url = redacted_url(url)
        self.settings = settings
        self.dialect = dialect
        self._run = ThreadRunner(dialect.name, settings.timeout, down_errors)
        self._migrated = False

    # ---- plumbing -----------------------------------------------------------------------------------

    async def _call(self, work: Callable[[Any, float], T], *, write: bool = True) -> T:
        """Run `work(cursor, now)` in one transaction in a thread (migrating first if not done yet)."""
        migrate = not self._migrated

        def transaction() -> T:
            if migrate:
                self._migrate()
            with self.dialect.connection(write) as connection:
                cursor = connection.cursor()
                return work(cursor, time.time())

        result = await self._run(transaction)
        self._migrated = True
        return result

    def _execute(self, cursor: Any, text: str, args: Sequence[Any] = ()) -> Any:
        cursor.execute(self.dialect.sql(text), tuple(args))
        return cursor

    def _migrate(self) -> None:
        with self.dialect.connection() as connection:
            cursor = connection.cursor()
            self.dialect.lock(cursor, "td_schema")
            self._execute(cursor, "CREATE TABLE IF NOT EXISTS td_schema (version INTEGER NOT NULL)")
            row = self._execute(cursor, "SELECT MAX(version) FROM td_schema").fetchone()
            version = row[0] if row is not None and row[0] is not None else 0
            for number in range(version + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[number - 1]:
                    self._execute(cursor, statement.format(blob=self.dialect.blob))
                self._execute(cursor, "INSERT INTO td_schema (version) VALUES (?)", (number,))
                log.info("state store %s: schema migrated to version %d", self.url, number)

    async def migrate(self) -> None:
        """Create or migrate the schema now (`StoreUnavailable` if the database is down)."""
        await self._run(self._migrate)
        self._migrated = True

    async def sweep(self) -> int:
        """Delete expired rows; how many."""

        def work(cursor: Any, now: float) -> int:
            count = 0
            for table in ("td_entries", "td_items", "td_windows", "td_slots"):
                count += self._execute(cursor, f"DELETE FROM {table} WHERE expires_at <= ?", (now,)).rowcount
            return count

        return await self._call(work)

    async def run_sweeper(self) -> None:
        while True:
            await trio.sleep(SWEEP_INTERVAL)
            with suppress(StoreUnavailable):
                await self.sweep()

    # ---- StateStore ---------------------------------------------------------------------------------

    async def ping(self) -> None:
        await self._call(lambda cursor, now: self._execute(cursor, "SELECT 1").fetchone(), write=False)

    async def get(self, key: str) -> bytes | None:
        def work(cursor: Any, now: float) -> bytes | None:
            row = self._execute(
                cursor, f"SELECT value FROM td_entries WHERE key = ? AND {_LIVE}", (key, now)
            ).fetchone()
            return bytes(row[0]) if row is not None else None

        return await self._call(work, write=False)

    async def put(self, key: str, value: bytes, *, ttl: float | None = STORE_TTL) -> None:
        check_size(self.settings, value)
        ttl = resolve_ttl(self.settings, ttl)

        def work(cursor: Any, now: float) -> None:
            expires = None if ttl is None else now + ttl
            self._execute(
                cursor,
                "INSERT INTO td_entries (key, value, expires_at) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE "
                "SET value = excluded.value, expires_at = excluded.expires_at",
                (key, value, expires),
            )

        await self._call(work)

    async def delete(self, key: str) -> bool:
        def work(cursor: Any, now: float) -> bool:
            live = self._execute(cursor, f"SELECT COUNT(*) FROM td_entries WHERE key = ? AND {_LIVE}", (key, now))
            found = live.fetchone()[0]
            live = self._execute(cursor, f"SELECT COUNT(*) FROM td_items WHERE key = ? AND {_LIVE}", (key, now))
            found += live.fetchone()[0]
            self._execute(cursor, "DELETE FROM td_entries WHERE key = ?", (key,))
            self._execute(cursor, "DELETE FROM td_items WHERE key = ?", (key,))
            return found > 0

        return await self._call(work)

    async def add_items(self, key: str, items: Sequence[tuple[str, bytes]], *, ttl: float | None = STORE_TTL) -> None:
        for _, value in items:
            check_size(self.settings, value)
        ttl = resolve_ttl(self.settings, ttl)

        def work(cursor: Any, now: float) -> None:
            expires = None if ttl is None else now + ttl
            self.dialect.lock(cursor, "items:" + key)
            self._execute(cursor, f"DELETE FROM td_items WHERE key = ? AND NOT {_LIVE}", (key, now))
            for item_id, value in items:
                self._execute(
                    cursor,
                    f"INSERT INTO td_items (key, item_id, seq, value, expires_at) VALUES (?, ?, {self.dialect.next_seq()}, ?, ?) "
                    "ON CONFLICT (key, item_id) DO UPDATE SET value = excluded.value",
                    (key, item_id, key, value, expires),
                )
            self._execute(cursor, "UPDATE td_items SET expires_at = ? WHERE key = ?", (expires, key))

        await self._call(work)

    async def items(self, key: str) -> list[tuple[str, bytes]]:
        def work(cursor: Any, now: float) -> list[tuple[str, bytes]]:
            rows = self._execute(
                cursor, f"SELECT item_id, value FROM td_items WHERE key = ? AND {_LIVE} ORDER BY seq", (key, now)
            ).fetchall()
            return [(item_id, bytes(value)) for item_id, value in rows]

        return await self._call(work, write=False)

    async def delete_item(self, key: str, item_id: str) -> bool:
        def work(cursor: Any, now: float) -> bool:
            deleted = self._execute(
                cursor, f"DELETE FROM td_items WHERE key = ? AND item_id = ? AND {_LIVE}", (key, item_id, now)
            )
            return deleted.rowcount > 0

        return await self._call(work)

    async def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        def work(cursor: Any, now: float) -> tuple[int, float]:
            index, reset_in = window_position(now, window_s)
            row = self._execute(
                cursor,
                "INSERT INTO td_windows (key, window_index, total, expires_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET total = CASE WHEN td_windows.window_index = excluded.window_index "
                "THEN td_windows.total + excluded.total ELSE excluded.total END, "
                "window_index = excluded.window_index, expires_at = excluded.expires_at RETURNING total",
                (key, index, amount, now + reset_in),
            ).fetchone()
            return int(row[0]), reset_in

        return await self._call(work)

    async def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        def work(cursor: Any, now: float) -> tuple[bool, int]:
            self.dialect.lock(cursor, "slots:" + key)
            self._execute(cursor, "DELETE FROM td_slots WHERE key = ? AND expires_at <= ?", (key, now))
            holders = {row[0] for row in self._execute(cursor, "SELECT holder FROM td_slots WHERE key = ?", (key,))}
            acquired = holder in holders or len(holders) < limit
            if acquired:
                self._execute(
                    cursor,
                    "INSERT INTO td_slots (key, holder, expires_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (key, holder) DO UPDATE SET expires_at = excluded.expires_at",
                    (key, holder, now + lease_s),
                )
                holders.add(holder)
            return acquired, len(holders)

        return await self._call(work)

    async def release_slot(self, key: str, holder: str) -> None:
        await self._call(
            lambda cursor, now: self._execute(
                cursor, "DELETE FROM td_slots WHERE key = ? AND holder = ?", (key, holder)
            )
        )


# ---- SQLite ---------------------------------------------------------------------------------------


class SqliteDialect(Dialect):
    """One connection per process, used by one thread at a time; writes take the file's lock at
    `BEGIN IMMEDIATE`, so read-modify-write calls need no lock of their own."""

    name = "sqlite"

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            self._connection = connection
        return self._connection

    @contextmanager
    def connection(self, write: bool = True) -> Iterator[Any]:
        with self._lock:
            connection = self._connect()
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def sqlite_path(url: str) -> str:
    """``sqlite:///var/lib/x.db`` -> ``/var/lib/x.db``; ``sqlite://x.db`` -> ``x.db`` (relative)."""
    path = url.split("://", 1)[1]
    if not path:
        raise ValueError(f"--state-store {url!r}: give a file, as sqlite:///PATH")
    return path


@asynccontextmanager
async def open_sqlite(url: str, settings: StoreSettings) -> AsyncIterator[StateStore]:
    dialect = SqliteDialect(sqlite_path(url), settings.timeout)
    store = SqlStore(url, settings, dialect, (sqlite3.Error, OSError))
    try:
        await _migrate_or_warn(store)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run_sweeper)
            yield store
            nursery.cancel_scope.cancel()
    finally:
        dialect.close()


# ---- PostgreSQL -----------------------------------------------------------------------------------


class PostgresDialect(Dialect):
    name = "postgresql"
    blob = "BYTEA"

    def __init__(self, pool: Any, timeout: float) -> None:
        self.pool = pool
        self.timeout = timeout

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    @contextmanager
    def connection(self, write: bool = True) -> Iterator[Any]:
        with self.pool.connection(timeout=self.timeout) as connection:
            yield connection

    def lock(self, cursor: Any, key: str) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))

    def close(self) -> None:
        self.pool.close(timeout=self.timeout)


@asynccontextmanager
async def open_postgres(url: str, settings: StoreSettings) -> AsyncIterator[StateStore]:
    import psycopg
    import psycopg_pool

    timeout = settings.timeout
    pool = psycopg_pool.ConnectionPool(
        url,
        min_size=1,
        max_size=8,
        open=False,
        timeout=timeout,
        check=psycopg_pool.ConnectionPool.check_connection,
        reconnect_timeout=RECONNECT_WINDOW,
        kwargs={
            "connect_timeout": max(2, math.ceil(timeout)),
            "options": f"-c statement_timeout={int(timeout * 1000)}",
        },
    )
    pool.open(wait=False)
    dialect = PostgresDialect(pool, timeout)
    store = SqlStore(url, settings, dialect, (psycopg.Error, psycopg_pool.PoolTimeout))
    try:
        await _migrate_or_warn(store)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run_sweeper)
            yield store
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout + 1):
            await trio.to_thread.run_sync(dialect.close, abandon_on_cancel=True)


async def _migrate_or_warn(store: SqlStore) -> None:
    """Migrate now; a database that is down is migrated on its first call instead."""
    try:
        await store.migrate()
    except StoreUnavailable as error:
        log.warning(
            "state store %s is not reachable at start-up (%s): requests that need it get 503 until it is",
            store.url,
            error,
        )
