"""OpenAI's Conversations API: ``/v1/conversations`` and its items, kept in the state store.

- ``POST /v1/conversations`` ``{"items"?: [...], "metadata"?: {...}}``: a new conversation.
- ``GET``, ``POST`` (new metadata), ``DELETE /v1/conversations/{id}``.
- ``POST /v1/conversations/{id}/items`` ``{"items": [...]}``: appended; the added items come back.
- ``GET /v1/conversations/{id}/items`` (``order``, ``after``, ``limit``), ``GET`` and ``DELETE
  /v1/conversations/{id}/items/{item_id}`` (a deletion answers the conversation, as OpenAI's does).

Items are Responses input items (messages, function calls and their outputs, reasoning), each
given an id when it has none. A response created with ``conversation`` reads them as its history
and appends its own input and output (`surfaces.responses`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from trio_direct.core import errors
from trio_direct.openai import responses_output as objects
from trio_direct.openai.requests import decode_object
from trio_direct.openai.responses_request import check_metadata, decode_items
from trio_direct.surfaces.response_store import ConversationStore
from trio_direct.surfaces.responses import input_item_objects, item_page
from trio_direct.tenants import access as tenant_access

if TYPE_CHECKING:
    from trio_direct.http.exchange import Exchange

__all__ = ["add_items", "create", "delete", "delete_item", "list_items", "retrieve", "retrieve_item", "update"]


def _store(exchange: Exchange) -> ConversationStore:
    return ConversationStore(exchange.frontend.state, tenant_access.owner())


def _unknown(conversation_id: str) -> errors.ApiError:
    return errors.not_found(f"Conversation with id '{conversation_id}' not found.")


async def _conversation(exchange: Exchange) -> dict[str, Any]:
    conversation_id = exchange.params["conversation_id"]
    conversation = await _store(exchange).get(conversation_id)
    if conversation is None:
        raise _unknown(conversation_id)
    return conversation


def _items(raw: dict[str, Any], *, required: bool) -> list[dict[str, Any]]:
    if "items" not in raw:
        if required:
            raise errors.invalid_request("Missing required parameter: 'items'.", param="items")
        return []
    return input_item_objects(decode_items(raw["items"], "items"))


async def create(exchange: Exchange) -> None:
    raw = decode_object(exchange.body) if exchange.body.strip() else {}
    items = _items(raw, required=False)
    conversation = await _store(exchange).create(check_metadata(raw.get("metadata")), items)
    await exchange.json(200, objects.encode(conversation))


async def retrieve(exchange: Exchange) -> None:
    await exchange.json(200, objects.encode(await _conversation(exchange)))


async def update(exchange: Exchange) -> None:
    raw = decode_object(exchange.body)
    if "metadata" not in raw:
        raise errors.invalid_request("Missing required parameter: 'metadata'.", param="metadata")
    metadata = check_metadata(raw["metadata"])
    conversation = await _store(exchange).update(exchange.params["conversation_id"], metadata)
    if conversation is None:
        raise _unknown(exchange.params["conversation_id"])
    await exchange.json(200, objects.encode(conversation))


async def delete(exchange: Exchange) -> None:
    conversation_id = exchange.params["conversation_id"]
    if not await _store(exchange).delete(conversation_id):
        raise _unknown(conversation_id)
    body = {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
    await exchange.json(200, objects.encode(body))


async def add_items(exchange: Exchange) -> None:
    items = _items(decode_object(exchange.body), required=True)  # a bad body is a 400, whatever the id
    conversation = await _conversation(exchange)
    await _store(exchange).add_items(conversation, items)
    body = {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": False,
    }
    await exchange.json(200, objects.encode(body))


async def list_items(exchange: Exchange) -> None:
    conversation = await _conversation(exchange)
    items = await _store(exchange).items(conversation["id"])
    await exchange.json(200, objects.encode(item_page(exchange, items)))


async def retrieve_item(exchange: Exchange) -> None:
    conversation = await _conversation(exchange)
    item_id = exchange.params["item_id"]
    item = next((i for i in await _store(exchange).items(conversation["id"]) if i.get("id") == item_id), None)
    if item is None:
        raise errors.not_found(f"Item with id '{item_id}' not found.")
    await exchange.json(200, msgspec.json.encode(item))


async def delete_item(exchange: Exchange) -> None:
    conversation = await _conversation(exchange)
    item_id = exchange.params["item_id"]
    if not await _store(exchange).delete_item(conversation["id"], item_id):
        raise errors.not_found(f"Item with id '{item_id}' not found.")
    await exchange.json(200, objects.encode(conversation))
