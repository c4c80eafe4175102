"""Stored responses and conversations over a state store (memory here; every backend in tests/state)."""

from __future__ import annotations

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.state.memory import MemoryStore
from trio_direct.state.store import StoreSettings, StoreUnavailable
from trio_direct.surfaces.response_store import ConversationStore, ResponseStore

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
INPUTS = [{"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def store(**settings) -> ResponseStore:
    return ResponseStore(MemoryStore(StoreSettings(**settings)))


async def test_a_stored_response_comes_back_as_sent_with_its_conversation_and_inputs():
    responses = store()
    assert await responses.put("resp_1", b'{"id":"resp_1"}', TURN, INPUTS)
    entry = await responses.get("resp_1")
    assert entry is not None and entry.body == b'{"id":"resp_1"}'
    assert entry.conversation() == TURN and entry.input_items() == INPUTS
    entry.conversation().append({"role": "user", "content": "changed"})  # a copy: the store keeps its own
    again = await responses.get("resp_1")
    assert again is not None and again.conversation() == TURN
    assert await responses.get("resp_unknown") is None
    assert await responses.delete("resp_1") and not await responses.delete("resp_1")


async def test_the_memory_bounds_evict_the_oldest_and_an_oversized_response_is_not_kept():
    responses = store(memory_max_entries=3, max_entry_bytes=2000)
    for i in range(4):
        assert await responses.put(f"resp_{i}", b"{}", TURN, INPUTS)
    assert [await responses.get(f"resp_{i}") is not None for i in range(4)] == [False, True, True, True]
    assert not await responses.put("resp_big", b"x" * 3000, TURN, INPUTS)
    assert await responses.get("resp_big") is None


class DownStore(MemoryStore):
    async def get(self, key: str) -> bytes | None:
        raise StoreUnavailable("down")


async def test_a_store_that_is_down_is_a_503_in_openais_envelope():
    with pytest.raises(ApiError) as raised:
        await ResponseStore(DownStore(StoreSettings())).get("resp_1")
    assert raised.value.status == 503 and raised.value.type == "service_unavailable"


async def test_conversations_keep_metadata_and_items_in_order():
    conversations = ConversationStore(MemoryStore(StoreSettings()))
    created = await conversations.create({"topic": "x"}, INPUTS)
    assert created["object"] == "conversation" and created["id"].startswith("conv_")
    assert await conversations.get(created["id"]) == created
    await conversations.add_items(created, [{**INPUTS[0], "id": "msg_2"}])
    assert [item["id"] for item in await conversations.items(created["id"])] == ["msg_1", "msg_2"]
    updated = await conversations.update(created["id"], {"topic": "y"})
    assert updated is not None and updated["metadata"] == {"topic": "y"}
    assert await conversations.delete_item(created["id"], "msg_1")
    assert [item["id"] for item in await conversations.items(created["id"])] == ["msg_2"]
    assert await conversations.delete(created["id"])
    assert await conversations.get(created["id"]) is None and await conversations.update("conv_x", {}) is None
