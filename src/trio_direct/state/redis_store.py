"""The ``redis://`` (and ``rediss://``) state store: redis-py, every call in a worker thread.

Each entry is a string key with its own TTL (``PEXPIRE``); an item list is a hash (id -> value)
beside a list (the ids in order), both expiring together; a window counter is one key per window
(``INCRBY`` and ``PEXPIRE`` in one transaction), gone with its window; a slot table is a sorted set
of holders scored by lease end. Read-modify-write calls are Lua scripts, atomic on the server. The
client's socket timeouts equal the store's timeout, and redis-py reconnects after a restart.
Keys are prefixed ``trio-direct:`` so that the database can be shared.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from trio_direct.state.base import (
    STORE_TTL,
    StateStore,
    StoreSettings,
    check_size,
    redacted_url,
    resolve_ttl,
    window_position,
)
from trio_direct.state.threaded import ThreadRunner

__all__ = ["RedisStore"]

PREFIX = "trio-direct:"

_ADD_ITEMS = """
for i = 2, #ARGV, 2 do
  if redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[i]) end
end
if tonumber(ARGV[1]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1]); redis.call('PEXPIRE', KEYS[2], ARGV[1])
else
  redis.call('PERSIST', KEYS[1]); redis.call('PERSIST', KEYS[2])
end
return 1
"""

_DELETE_ITEM = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then redis.call('LREM', KEYS[2], 0, ARGV[1]); return 1 end
return 0
"""

_ACQUIRE_SLOT = """
local now, lease = tonumber(ARGV[1]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local holders = redis.call('ZCARD', KEYS[1])
local held = redis.call('ZSCORE', KEYS[1], ARGV[2])
if held or holders < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[2])
  local lease_ms = math.ceil(lease * 1000)
  if redis.call('PTTL', KEYS[1]) < lease_ms then redis.call('PEXPIRE', KEYS[1], lease_ms) end
  if not held then holders = holders + 1 end
  return {1, holders}
end
return {0, holders}
"""


class RedisStore:
    """The `StateStore` on Redis (see the module doc)."""

    def __init__(self, url: str, settings: StoreSettings, client: Any, down_errors: tuple[type[BaseException], ...]):
        self.url = redacted_url(url)
        self.settings = settings
        self.client = client
        self._run = ThreadRunner("redis", settings.timeout, down_errors)
        self._add_items = client.register_script(_ADD_ITEMS)
        self._delete_item = client.register_script(_DELETE_ITEM)
        self._acquire_slot = client.register_script(_ACQUIRE_SLOT)

    @staticmethod
    def _keys(key: str) -> tuple[str, str, str]:
        """The entry's key, its items' hash and their order's list."""
        return PREFIX + "e:" + key, PREFIX + "h:" + key, PREFIX + "l:" + key

    async def ping(self) -> None:
        await self._run(self.client.ping)

    async def get(self, key: str) -> bytes | None:
        return await self._run(lambda: self.client.get(self._keys(key)[0]))

    async def put(self, key: str, value: bytes, *, ttl: float | None = STORE_TTL) -> None:
        check_size(self.settings, value)
        seconds = resolve_ttl(self.settings, ttl)
        expiry = None if seconds is None else max(1, math.ceil(seconds * 1000))
        await self._run(lambda: self.client.set(self._keys(key)[0], value, px=expiry))

    async def delete(self, key: str) -> bool:
        return bool(await self._run(lambda: self.client.delete(*self._keys(key))))

    async def add_items(self, key: str, items: Sequence[tuple[str, bytes]], *, ttl: float | None = STORE_TTL) -> None:
        for _, value in items:
            check_size(self.settings, value)
        seconds = resolve_ttl(self.settings, ttl)
        expiry = 0 if seconds is None else max(1, math.ceil(seconds * 1000))
        args: list[Any] = [expiry]
        for item_id, value in items:
            args += [item_id, value]
        _, hash_key, list_key = self._keys(key)
        await self._run(lambda: self._add_items(keys=[hash_key, list_key], args=args))

    async def items(self, key: str) -> list[tuple[str, bytes]]:
        _, hash_key, list_key = self._keys(key)

        def read() -> list[tuple[str, bytes]]:
            pipe = self.client.pipeline(transaction=True)
            pipe.lrange(list_key, 0, -1)
            pipe.hgetall(hash_key)
            order, values = pipe.execute()
            out = []
            for raw in order:
                value = values.get(raw)
                if value is not None:
                    out.append((raw.decode(), value))
            return out

        return await self._run(read)

    async def delete_item(self, key: str, item_id: str) -> bool:
        _, hash_key, list_key = self._keys(key)
        return bool(await self._run(lambda: self._delete_item(keys=[hash_key, list_key], args=[item_id])))

    async def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:
        def add() -> tuple[int, float]:
            index, reset_in = window_position(time.time(), window_s)
            counter = f"{PREFIX}w:{key}:{index}"
            pipe = self.client.pipeline(transaction=True)
            pipe.incrby(counter, amount)
            pipe.pexpire(counter, max(1, math.ceil(reset_in * 1000)))
            total, _ = pipe.execute()
            return int(total), reset_in

        return await self._run(add)

    async def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:
        def acquire() -> tuple[bool, int]:
            acquired, holders = self._acquire_slot(
                keys=[PREFIX + "s:" + key], args=[time.time(), holder, limit, lease_s]
            )
            return bool(acquired), int(holders)

        return await self._run(acquire)

    async def release_slot(self, key: str, holder: str) -> None:
        await self._run(lambda: self.client.zrem(PREFIX + "s:" + key, holder))


@asynccontextmanager
async def open_redis(url: str, settings: StoreSettings) -> AsyncIterator[StateStore]:
    import redis

    client = redis.Redis.from_url(
        url, socket_timeout=settings.timeout, socket_connect_timeout=settings.timeout, health_check_interval=30
    )
    try:
        yield RedisStore(url, settings, client, (redis.RedisError, OSError))
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + settings.timeout):
            await trio.to_thread.run_sync(client.close, abandon_on_cancel=True)
