"""The `StateStore` contract, the same on every backend: memory, SQLite, PostgreSQL, Redis."""

from __future__ import annotations

import uuid

import pytest
import trio

from trio_direct.state.memory import MemoryTables
from trio_direct.state.store import (
    EntryTooLarge,
    StoreSettings,
    StoreUnavailable,
    UnknownStore,
    check_url,
    open_state_store,
    redacted_url,
    window_position,
)

SETTINGS = StoreSettings(ttl=3600, max_entry_bytes=4096, timeout=5.0)


def unique(name: str) -> str:
    """Keys of their own: the servers are shared by the whole session."""
    return f"{name}-{uuid.uuid4().hex}"


async def test_entries_round_trip_and_expire(store_url: str) -> None:
    async with open_state_store(store_url, SETTINGS) as store:
        key = unique("resp")
        assert await store.get(key) is None
        await store.put(key, b'{"id": 1}')
        assert await store.get(key) == b'{"id": 1}'
        await store.put(key, b"\x00binary\xff")
        assert await store.get(key) == b"\x00binary\xff"
        assert await store.delete(key) is True
        assert await store.get(key) is None
        assert await store.delete(key) is False
        short = unique("short")
        await store.put(short, b"x", ttl=0.3)
        forever = unique("forever")
        await store.put(forever, b"y", ttl=None)
        await trio.sleep(1.2)
        assert await store.get(short) is None
        assert await store.get(forever) == b"y"
        with pytest.raises(EntryTooLarge):
            await store.put(unique("big"), b"x" * 5000)


async def test_item_lists_keep_order_replace_in_place_and_delete(store_url: str) -> None:
    async with open_state_store(store_url, SETTINGS) as store:
        key = unique("conv")
        assert await store.items(key) == []
        await store.add_items(key, [("a", b"1"), ("b", b"2")])
        await store.add_items(key, [("c", b"3"), ("a", b"1'")])
        assert await store.items(key) == [("a", b"1'"), ("b", b"2"), ("c", b"3")]
        assert await store.delete_item(key, "b") is True
        assert await store.delete_item(key, "b") is False
        assert await store.items(key) == [("a", b"1'"), ("c", b"3")]
        await store.put(key, b"meta")
        assert await store.delete(key) is True
        assert await store.items(key) == []
        assert await store.get(key) is None
        with pytest.raises(EntryTooLarge):
            await store.add_items(key, [("big", b"x" * 5000)])


async def test_concurrent_item_appends_lose_nothing(store_url: str) -> None:
    async with open_state_store(store_url, SETTINGS) as store:
        key = unique("race")
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(store.add_items, key, [(f"i{i}", b"%d" % i)])
        assert sorted(item_id for item_id, _ in await store.items(key)) == sorted(f"i{i}" for i in range(20))


async def test_add_to_window_counts_atomically_and_resets(store_url: str) -> None:
    async with open_state_store(store_url, SETTINGS) as store:
        key = unique("rpm")
        totals: list[int] = []

        async def add() -> None:
            total, reset_in = await store.add_to_window(key, 2, 60.0)
            assert 0 < reset_in <= 60.0
            totals.append(total)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(add)
        assert sorted(totals) == list(range(2, 21, 2))  # each add saw every add before it
        # A short window: once it ends, the count starts again.
        short = unique("rps")
        total, reset_in = await store.add_to_window(short, 1, 0.5)
        await trio.sleep(reset_in + 0.1)
        total, _ = await store.add_to_window(short, 1, 0.5)
        assert total == 1


async def test_slots_are_bounded_renewed_released_and_expire(store_url: str) -> None:
    async with open_state_store(store_url, SETTINGS) as store:
        key = unique("concurrency")
        results = []

        async def take(holder: str) -> None:
            results.append((holder, await store.acquire_slot(key, holder, 3, 30.0)))

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(take, f"h{i}")
        assert sum(acquired for _, (acquired, _) in results) == 3
        winners = [holder for holder, (acquired, _) in results if acquired]
        assert await store.acquire_slot(key, winners[0], 3, 30.0) == (True, 3)  # renewing is not a new slot
        assert await store.acquire_slot(key, "late", 3, 30.0) == (False, 3)
        await store.release_slot(key, winners[0])
        await store.release_slot(key, "never-held")
        assert await store.acquire_slot(key, "late", 3, 30.0) == (True, 3)
        # Leases end by themselves: a holder that died frees its slot (1.5 s: the second call has
        # that long to find the first lease alive, however loaded the machine).
        leased = unique("leased")
        assert await store.acquire_slot(leased, "a", 1, 1.5) == (True, 1)
        assert await store.acquire_slot(leased, "b", 1, 1.5) == (False, 1)
        await trio.sleep(2.0)
        assert await store.acquire_slot(leased, "b", 1, 1.5) == (True, 1)


async def test_a_store_that_is_down_answers_unavailable_within_its_timeout() -> None:
    """Nothing listens on the port: every call fails fast with `StoreUnavailable`, never hangs."""
    from state_servers import free_port

    port = free_port()
    settings = StoreSettings(timeout=1.0)
    for url in (f"redis://127.0.0.1:{port}/0", f"postgresql://postgres@127.0.0.1:{port}/postgres"):
        async with open_state_store(url, settings) as store:
            with trio.fail_after(10):
                with pytest.raises(StoreUnavailable):
                    await store.get("x")
                with pytest.raises(StoreUnavailable):
                    await store.add_to_window("x", 1, 1.0)


def test_unknown_kinds_fail_listing_the_known_ones() -> None:
    with pytest.raises(UnknownStore, match=r"known: memory, postgres://\.\.\., postgresql://\.\.\., redis"):
        check_url("mongodb://db/x")
    check_url("sqlite:///var/lib/trio-direct/state.db")
    with pytest.raises(UnknownStore, match="give the database file"):
        check_url("sqlite://")
    assert redacted_url("postgresql://app:secret@db:5432/x") == "postgresql://app:***@db:5432/x"


def test_windows_and_memory_tables_follow_the_clock() -> None:
    assert window_position(125.0, 60.0) == (2, 55.0)
    now = [1000.0]
    tables = MemoryTables(StoreSettings(ttl=10, memory_max_bytes=100), clock=lambda: now[0])
    tables.put("a", b"x" * 40)
    tables.put("b", b"y" * 40)
    tables.put("c", b"z" * 40)  # over 100 bytes: the oldest write goes
    assert tables.get("a") is None and tables.get("c") == b"z" * 40
    now[0] += 11
    assert tables.get("c") is None
    assert tables.add_to_window("k", 5, 60.0) == (5, 9.0)  # 1011 s: the window of 960-1020 s
    now[0] += 10
    assert tables.add_to_window("k", 1, 60.0) == (1, 59.0)


def test_memory_counters_are_purged_once_their_windows_and_leases_end() -> None:
    now = [0.0]
    tables = MemoryTables(StoreSettings(), clock=lambda: now[0])
    for i in range(600):
        tables.add_to_window(f"w{i}", 1, 1.0)
        tables.acquire_slot(f"s{i}", "h", 1, 1.0)
    now[0] = 5.0
    tables.add_to_window("fresh", 1, 1.0)  # the 1201st call: no purge yet
    for _ in range(1024):
        tables.acquire_slot("live", "h", 1, 10.0)
    assert set(tables._windows) == {"fresh"} and set(tables._slots) == {"live"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "redis"])
async def test_a_database_back_from_a_long_outage_serves_within_seconds(kind: str, caplog) -> None:
    """After ~8 s down, calls succeed again within seconds of the server accepting connections,
    with what was written before. (psycopg_pool's default backoff would next try at ~15 s, so a
    frontend would answer 503 for ~6 s more; the store bounds the gap between attempts.) The outage
    is logged once when it starts and once when it ends, not once per call."""
    from state_servers import PostgresServer, RedisServer, missing_server, postgres_binaries, redis_binary

    server: PostgresServer | RedisServer
    if kind == "redis":
        binary = redis_binary()
        if binary is None:
            missing_server("redis-server")
        server = RedisServer(binary)
    else:
        binaries = postgres_binaries()
        if binaries is None:
            missing_server("PostgreSQL")
        server = PostgresServer(binaries)
    server.start()
    caplog.set_level("INFO", logger="trio_direct.state.threaded")
    try:
        async with open_state_store(server.url, StoreSettings(timeout=1.0)) as store:
            key = unique("kept")
            await store.put(key, b"acknowledged")
            await trio.to_thread.run_sync(server.stop)
            down_until = trio.current_time() + 7.8  # past the default backoff's attempt at ~7 s
            while trio.current_time() < down_until:
                with pytest.raises(StoreUnavailable):
                    await store.get(key)
                await trio.sleep(0.2)
            await trio.to_thread.run_sync(server.start)
            back = trio.current_time()
            with trio.fail_after(30):
                while True:
                    try:
                        value = await store.get(key)
                        break
                    except StoreUnavailable:
                        await trio.sleep(0.05)
            recovery = trio.current_time() - back
            assert value == b"acknowledged"
            assert recovery < 3.5, f"served again {recovery:.1f}s after the database was back"
    finally:
        server.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "trio_direct.state.threaded"]
    assert sum("is unavailable" in m for m in messages) == 1, messages
    assert sum("is reachable again" in m for m in messages) == 1, messages
