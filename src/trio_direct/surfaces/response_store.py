"""The Responses and Conversations APIs' state, kept in the frontend's state store.

A stored response (`store: true`, OpenAI's default) is one entry under ``response:ID``: the
response object as it was sent, the conversation up to and including its output as the chat-style
messages the next turn is planned from (`previous_response_id`), and its input items
(``GET /v1/responses/ID/input_items``). Each entry is whole: deleting one never breaks another.

A conversation (``/v1/conversations``) is an entry under ``conversation:ID`` (its object: id,
creation time, metadata) and the item list under the same key (messages, function calls and
outputs, reasoning, in order); a response made with ``conversation`` reads those items as its
history and appends its input and output items when it completes.

Everything lives in the `StateStore` that ``--state-store`` names, so every worker and replica
sharing it sees the same responses and conversations, for ``--state-store-ttl`` after their last
write. A store that cannot answer turns into a 503 in OpenAI's envelope for the request that needed
it (`unavailable`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import msgspec

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.core.errors import ApiError
from trio_direct.state.store import EntryTooLarge, StateStore, StoreUnavailable

__all__ = ["ConversationStore", "ResponseStore", "StoredResponse", "new_item_id", "unavailable"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoredResponse(msgspec.Struct, array_like=True):
    """One stored response: its object (JSON, as sent), its conversation (JSON chat messages) and
    its input items (JSON)."""

    body: bytes
    conversation_json: bytes
    input_items_json: bytes = b"[]"

    def conversation(self) -> list[dict[str, Any]]:
        """The chat-style messages of the conversation, this response's output last (a fresh copy)."""
        return msgspec.json.decode(self.conversation_json)

    def input_items(self) -> list[dict[str, Any]]:
        return msgspec.json.decode(self.input_items_json)


_encode_record = msgspec.msgpack.Encoder().encode
_decode_record = msgspec.msgpack.Decoder(StoredResponse).decode


def unavailable(error: StoreUnavailable) -> ApiError:
    """The 503 a request that needs the state store gets while it is down."""
    log.warning("state store unavailable: %s", error)
    metrics.STATE_STORE_UNAVAILABLE.inc()
    return errors.service_unavailable("The state store is unavailable; try again shortly.")


async def _guarded(call: Awaitable[T]) -> T:
    try:
        return await call
    except StoreUnavailable as error:
        raise unavailable(error) from None


def new_item_id(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


def _scoped(kind: str, owner: str, object_id: str) -> str:
    """The store key of a response or conversation: a tenant's (`owner`) are apart from every other's."""
    return f"{kind}:{owner}/{object_id}" if owner else f"{kind}:{object_id}"


class ResponseStore:
    """Stored responses by id (see the module doc), those of `owner` (a tenant's name; "" for none)."""

    def __init__(self, state: StateStore, owner: str = "") -> None:
        self.state = state
        self.owner = owner

    async def put(
        self, response_id: str, body: bytes, conversation: list[dict[str, Any]], input_items: list[dict[str, Any]]
    ) -> bool:
        """Keep a response; False when it is above the store's byte cap (it is then not kept)."""
        record = StoredResponse(body, msgspec.json.encode(conversation), msgspec.json.encode(input_items))
        try:
            await _guarded(self.state.put(_scoped("response", self.owner, response_id), _encode_record(record)))
        except EntryTooLarge as error:
            log.warning("response %s is not stored: %s (--state-store-max-entry-bytes)", response_id, error)
            return False
        return True

    async def get(self, response_id: str) -> StoredResponse | None:
        raw = await _guarded(self.state.get(_scoped("response", self.owner, response_id)))
        return _decode_record(raw) if raw is not None else None

    async def delete(self, response_id: str) -> bool:
        return await _guarded(self.state.delete(_scoped("response", self.owner, response_id)))


class ConversationStore:
    """Conversations and their items (see the module doc), those of `owner` (a tenant's name; "" for none)."""

    def __init__(self, state: StateStore, owner: str = "") -> None:
        self.state = state
        self.owner = owner

    def _key(self, conversation_id: str) -> str:
        return _scoped("conversation", self.owner, conversation_id)

    async def create(self, metadata: dict[str, str], items: list[dict[str, Any]]) -> dict[str, Any]:
        conversation_id = new_item_id("conv_")
        conversation: dict[str, Any] = {
            "id": conversation_id,
            "object": "conversation",
            "created_at": int(time.time()),
            "metadata": metadata,
        }
        key = self._key(conversation_id)
        try:
            if items:
                await _guarded(self.state.add_items(key, [(item["id"], msgspec.json.encode(item)) for item in items]))
            await _guarded(self.state.put(key, msgspec.json.encode(conversation)))
        except EntryTooLarge as error:
            raise errors.invalid_request(f"An item is too large to store: {error}.", param="items") from None
        return conversation

    async def get(self, conversation_id: str) -> dict[str, Any] | None:
        raw = await _guarded(self.state.get(self._key(conversation_id)))
        return msgspec.json.decode(raw) if raw is not None else None

    async def update(self, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        conversation = await self.get(conversation_id)
        if conversation is None:
            return None
        conversation["metadata"] = metadata
        await _guarded(self.state.put(self._key(conversation_id), msgspec.json.encode(conversation)))
        return conversation

    async def delete(self, conversation_id: str) -> bool:
        return await _guarded(self.state.delete(self._key(conversation_id)))

    async def items(self, conversation_id: str) -> list[dict[str, Any]]:
        return [msgspec.json.decode(raw) for _, raw in await _guarded(self.state.items(self._key(conversation_id)))]

    async def add_items(self, conversation: dict[str, Any], items: list[dict[str, Any]]) -> None:
        """Append `items` (each with its id) and keep the conversation as long as its items."""
        key = self._key(conversation["id"])
        try:
            await _guarded(self.state.add_items(key, [(item["id"], msgspec.json.encode(item)) for item in items]))
        except EntryTooLarge as error:
            raise errors.invalid_request(f"An item is too large to store: {error}.", param="items") from None
        await _guarded(self.state.put(key, msgspec.json.encode(conversation)))

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        return await _guarded(self.state.delete_item(self._key(conversation_id), item_id))
