"""Stored responses: bounded by count and by bytes, least recently used out first."""

from __future__ import annotations

from trio_direct.surfaces.response_store import ResponseStore

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def body(i: int, size: int = 10) -> bytes:
    return (b'{"id":"resp_%d"' % i).ljust(size, b" ") + b"}"


def test_a_stored_response_comes_back_as_sent_with_its_conversation():
    store = ResponseStore(max_items=4, max_bytes=10_000)
    assert store.put("resp_1", body(1), TURN)
    entry = store.get("resp_1")
    assert entry is not None and entry.body == body(1) and entry.conversation() == TURN
    entry.conversation().append({"role": "user", "content": "changed"})  # a copy: the store keeps its own
    assert store.get("resp_1").conversation() == TURN
    assert store.get("resp_unknown") is None


def test_the_count_bound_evicts_the_least_recently_used():
    store = ResponseStore(max_items=3, max_bytes=10_000)
    for i in range(3):
        store.put(f"resp_{i}", body(i), TURN)
    store.get("resp_0")  # used: now the most recent
    store.put("resp_3", body(3), TURN)
    assert [store.get(f"resp_{i}") is not None for i in range(4)] == [True, False, True, True]
    assert len(store) == 3 and store.evicted == 1


def test_the_byte_bound_evicts_until_the_new_entry_fits():
    one = len(body(0, 100)) + len(b'[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]')
    store = ResponseStore(max_items=100, max_bytes=3 * one)
    for i in range(3):
        store.put(f"resp_{i}", body(i, 100), TURN)
    assert store.stored_bytes == 3 * one
    store.put("resp_big", body(9, 100 + one), TURN)  # needs two entries' room
    assert [store.get(f"resp_{i}") is None for i in range(3)] == [True, True, False]
    assert store.stored_bytes <= 3 * one and store.get("resp_big") is not None


def test_an_entry_over_the_byte_bound_is_not_kept_and_evicts_nothing():
    store = ResponseStore(max_items=10, max_bytes=200)
    store.put("resp_small", body(1), TURN)
    assert not store.put("resp_huge", body(2, 500), TURN)
    assert store.get("resp_huge") is None and store.get("resp_small") is not None


def test_delete_frees_its_bytes_and_a_zero_count_stores_nothing():
    store = ResponseStore(max_items=10, max_bytes=10_000)
    store.put("resp_1", body(1), TURN)
    assert store.delete("resp_1") and not store.delete("resp_1")
    assert (len(store), store.stored_bytes) == (0, 0)
    off = ResponseStore(max_items=0, max_bytes=10_000)
    assert not off.put("resp_1", body(1), TURN) and off.get("resp_1") is None


def test_storing_an_id_again_replaces_it():
    store = ResponseStore(max_items=10, max_bytes=10_000)
    store.put("resp_1", body(1), TURN)
    store.put("resp_1", body(1, 50), TURN[:1])
    assert len(store) == 1 and store.get("resp_1").conversation() == TURN[:1]
    assert store.stored_bytes == store.get("resp_1").size
