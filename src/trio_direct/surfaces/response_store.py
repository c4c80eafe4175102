"""The Responses API's stored responses: a bounded, in-memory LRU (sans-IO).

With `store` (OpenAI's default) a finished response is kept so that `GET /v1/responses/{id}` returns
it and a later request's `previous_response_id` continues its conversation. Each entry holds the
response object as it was sent and the conversation up to and including its output, as the
chat-style messages the next turn is planned from (each entry is whole: evicting one never breaks
another).

The store is bounded twice: at most `max_items` entries and `max_bytes` of stored JSON
(``--responses-store-max-items``, ``--responses-store-max-bytes``); past either bound the least
recently used entries go first (a `get` counts as a use). An entry larger than `max_bytes` on its
own is not kept. The store lives in one frontend process: replicas and ``--workers N`` processes do
not share it, so a `previous_response_id` must come back to the process that answered it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One stored response: its object (JSON, as sent) and its conversation (JSON messages)."""

    body: bytes
    conversation_json: bytes

    @property
    def size(self) -> int:
        return len(self.body) + len(self.conversation_json)

    def conversation(self) -> list[dict[str, Any]]:
        """The chat-style messages of the conversation, this response's output last (a fresh copy)."""
        return msgspec.json.decode(self.conversation_json)


class ResponseStore:
    """Stored responses by id, least recently used first out."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        #: Entries evicted to make room (for the operator's curiosity and the tests).
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def stored_bytes(self) -> int:
        """The stored JSON's size, all entries together."""
        return self._bytes

    def put(self, response_id: str, body: bytes, conversation: list[dict[str, Any]]) -> bool:
        """Keep a response (replacing one of the same id); False when it alone exceeds the bounds."""
        entry = StoredResponse(body, msgspec.json.encode(conversation))
        self.delete(response_id)
        if self.max_items <= 0 or entry.size > self.max_bytes:
            return False
        self._entries[response_id] = entry
        self._bytes += entry.size
        while len(self._entries) > self.max_items or self._bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size
            self.evicted += 1
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True
