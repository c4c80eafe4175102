"""The ``memory`` state store: one process's dictionaries (tests, and operators who keep nothing).

Nothing is shared with other processes and nothing survives a restart. Memory is bounded: past
`StoreSettings.memory_max_bytes` the entries and item lists written longest ago go first. The
tables are plain synchronous code (`MemoryTables`, clock injectable); `MemoryStore` is its async face.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from trio_direct.state.base import (
    STORE_TTL,
    StateStore,
    StoreSettings,
    check_size,
    resolve_ttl,
    window_position,
)

__all__ = ["MemoryStore", "MemoryTables"]


@dataclass(slots=True)
class _Entry:
    value: bytes = b""
    has_value: bool = False
    items: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    expires: float | None = None

    @property
    def size(self) -> int:
        return len(self.value) + sum(len(k) + len(v) for k, v in self.items.items())


class MemoryTables:
    """Entries, item lists, windows and slots of one process (sans-IO)."""

    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        #: key -> (window index, total, window end); key -> holder -> lease end.
        self._windows: dict[str, tuple[int, int, float]] = {}
        self._slots: dict[str, dict[str, float]] = {}
        self._calls = 0

    def _live(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires is not None and entry.expires <= self.clock():
            self._drop(key)
            return None
        return entry

    def _drop(self, key: str) -> _Entry | None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry

    def _written(self, key: str, entry: _Entry, before: int, ttl: float | None) -> None:
        ttl = resolve_ttl(self.settings, ttl)
        entry.expires = None if ttl is None else self.clock() + ttl
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._bytes += entry.size - before
        while len(self._entries) > 1 and (
            self._bytes > self.settings.memory_max_bytes or len(self._entries) > self.settings.memory_max_entries
        ):
            oldest = next(iter(self._entries))
            if oldest == key:
                break
            self._drop(oldest)

    def get(self, key: str) -> bytes | None:
        entry = self._live(key)
        return entry.value if entry is not None and entry.has_value else None

    def put(self, key: str, value: bytes, ttl: float | None = STORE_TTL) -> None:
        check_size(self.settings, value)
        entry = self._live(key) or _Entry()
        before = entry.size if key in self._entries else 0
        entry.value, entry.has_value = value, True
        self._written(key, entry, before, ttl)

    def delete(self, key: str) -> bool:
        return self._live(key) is not None and self._drop(key) is not None

    def add_items(self, key: str, items: Sequence[tuple[str, bytes]], ttl: float | None = STORE_TTL) -> None:
        for _, value in items:
            check_size(self.settings, value)
        entry = self._live(key) or _Entry()
        before = entry.size if key in self._entries else 0
        for item_id, value in items:
            entry.items[item_id] = value
        self._written(key, entry, before, ttl)

    def items(self, key: str) -> list[tuple[str, bytes]]:
        entry = self._live(key)
        return list(entry.items.items()) if entry is not None else []

    def delete_item(self, key: str, item_id: str) -> bool:
        entry = self._live(key)
        if entry is None or item_id not in entry.items:
            return False
        value = entry.items.pop(item_id)
        self._bytes -= len(item_id) + len(value)
        return True

    def _purge(self, now: float) -> None:
        """Every 1024 counter calls, drop the windows that ended and the slot tables nobody holds
        (as the other backends' rows and keys expire)."""
        self._calls += 1
        if self._calls % 1024:
            return
        self._windows = {k: w for k, w in self._windows.items() if w[2] > now}
        self._slots = {k: h for k, h in self._slots.items() if any(end > now for end in h.values())}

    def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        now = self.clock()
        self._purge(now)
        index, reset_in = window_position(now, window_s)
        current, total, _ = self._windows.get(key, (index, 0, 0.0))
        total = (total if current == index else 0) + amount
        self._windows[key] = (index, total, now + reset_in)
        return total, reset_in

    def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        now = self.clock()
        self._purge(now)
        holders = {h: expiry for h, expiry in self._slots.get(key, {}).items() if expiry > now}
        acquired = holder in holders or len(holders) < limit
        if acquired:
            holders[holder] = now + lease_s
        self._slots[key] = holders
        return acquired, len(holders)

    def release_slot(self, key: str, holder: str) -> None:
        holders = self._slots.get(key)
        if holders is not None:
            holders.pop(holder, None)
            if not holders:
                del self._slots[key]


class MemoryStore:
    """`MemoryTables` behind the `StateStore` interface (never unavailable)."""

    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        self.url = "memory"
        self.settings = settings
        self.tables = MemoryTables(settings, clock)

    async def ping(self) -> None:
        return None

    async def get(self, key: str) -> bytes | None:
        return self.tables.get(key)

    async def put(self, key: str, value: bytes, *, ttl: float | None = STORE_TTL) -> None:
        self.tables.put(key, value, ttl)

    async def delete(self, key: str) -> bool:
        return self.tables.delete(key)

    async def add_items(self, key: str, items: Sequence[tuple[str, bytes]], *, ttl: float | None = STORE_TTL) -> None:
        self.tables.add_items(key, items, ttl)

    async def items(self, key: str) -> list[tuple[str, bytes]]:
        return self.tables.items(key)

    async def delete_item(self, key: str, item_id: str) -> bool:
        return self.tables.delete_item(key, item_id)

    async def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        return self.tables.add_to_window(key, amount, window_s)

    async def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        return self.tables.acquire_slot(key, holder, limit, lease_s)

    async def release_slot(self, key: str, holder: str) -> None:
        self.tables.release_slot(key, holder)


@asynccontextmanager
async def open_memory(url: str, settings: StoreSettings) -> AsyncIterator[StateStore]:
    yield MemoryStore(settings)
