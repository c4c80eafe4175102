"""The cap on messages and content parts per request (``--max-messages``), checked before the body
is decoded, at a cost that does not grow with how far over the cap it is.

Decoding a JSON body costs time and memory per value: a 31 MB body of a million tiny messages took
seconds of the event loop and hundreds of megabytes before any rule could refuse it. Here the
``messages`` (chat, Anthropic) or ``input`` (Responses items) array is read as an array-like
struct with `cap` optional slots whose values stay raw JSON (slices of the body, never decoded):
msgspec stops at the first element past the last slot, so an array of a million elements costs the
same as one of `cap` + 1. Each item's ``content``, when it is an array, is read the same way and
the parts are counted over the whole request. Bodies that are not shaped like that (not an object,
no such array, an item that is not an object, an ``input`` of strings or token ids as embeddings
take it) are left for the full decoder and the route's own limits.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import msgspec

from trio_direct.core.errors import ApiError, invalid_request

__all__ = ["check_item_counts", "prepare_item_counts"]

_EMPTY = msgspec.Raw()
_OVER = "Expected `array` of at most length"


class _SmallItem(msgspec.Struct):
    """An item too short to hold more parts than the cap has left: its content as a plain list."""

    content: list[msgspec.Raw] | str | None = None


_SMALL_ITEM = msgspec.json.Decoder(_SmallItem)


@lru_cache(maxsize=4)
def _decoders(cap: int) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder, msgspec.json.Decoder]:
    """(``messages``, ``input``, one large item's content), each with `cap` raw slots."""
    slots = msgspec.defstruct(
        "Slots", [(f"s{i}", msgspec.Raw, _EMPTY) for i in range(cap)], array_like=True, forbid_unknown_fields=True
    )
    messages = msgspec.defstruct("Messages", [("messages", slots | None, None)])
    inputs = msgspec.defstruct("Inputs", [("input", slots | str | None, None)])
    item = msgspec.defstruct("Item", [("content", slots | str | None, None)])
    return msgspec.json.Decoder(messages), msgspec.json.Decoder(inputs), msgspec.json.Decoder(item)


def _filled(slots: Any, cap: int) -> list[msgspec.Raw]:
    """The slots an array filled (they fill from the first: the first empty one ends them)."""
    low, high = 0, cap
    while low < high:  # the first empty slot, by bisection: a struct of `cap` slots, few of them read
        middle = (low + high) // 2
        if getattr(slots, f"s{middle}") is _EMPTY:
            high = middle
        else:
            low = middle + 1
    return [getattr(slots, f"s{i}") for i in range(low)]


def prepare_item_counts(cap: int) -> None:
    """Build the decoders for `cap` ahead of the first body long enough to need them (a struct of
    `cap` slots takes milliseconds to define)."""
    if cap > 0:
        _decoders(cap)


def check_item_counts(body: bytes, cap: int) -> None:
    """Raise a 400 when the body carries more than `cap` messages (or ``input`` items that are
    objects), or more than `cap` content parts in all; `cap` <= 0: no cap."""
    if cap <= 0 or len(body) <= 2 * cap:
        # n items of a JSON array take at least 2n - 1 bytes (a value of one byte or more, and a comma
        # between two), so a body this short cannot carry more than `cap` of them, nor of parts. Most
        # bodies are: they skip the decoding (a struct of `cap` slots, ~2 µs a token of a short chat).
        return
    messages_decoder, inputs_decoder, item_decoder = _decoders(cap)
    parts = 0
    for name, decoder in (("messages", messages_decoder), ("input", inputs_decoder)):
        try:
            slots = getattr(decoder.decode(body), name)
        except msgspec.ValidationError as error:
            if str(error).startswith(_OVER) and (name == "messages" or _items_are_objects(body)):
                raise _too_many(name, cap) from None
            return  # another shape (token ids as embeddings input): not these items
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return
        if slots is None or isinstance(slots, str):
            continue
        for raw in _filled(slots, cap):
            # An array of n parts takes at least 2n bytes: a short item is read as a plain list.
            decode = _SMALL_ITEM.decode if len(raw) < 2 * (cap - parts) else item_decoder.decode
            try:
                content = decode(raw).content
            except msgspec.ValidationError as error:
                if str(error).startswith(_OVER):
                    raise _too_many_parts(cap) from None
                continue
            except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
                continue
            if content is None or isinstance(content, str):
                continue
            parts += len(content) if isinstance(content, list) else len(_filled(content, cap))
            if parts > cap:
                raise _too_many_parts(cap)


class _FirstInput(msgspec.Struct, array_like=True):
    first: msgspec.Raw = _EMPTY


class _Inputs(msgspec.Struct):
    input: _FirstInput | str | None = None


_FIRST_INPUT = msgspec.json.Decoder(_Inputs)


def _items_are_objects(body: bytes) -> bool:
    """Whether ``input`` is an array of objects (Responses items), not of strings or token ids
    (embeddings): only its first element is kept, the rest is skipped unread."""
    try:
        inputs = _FIRST_INPUT.decode(body).input
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False
    return isinstance(inputs, _FirstInput) and bytes(inputs.first).lstrip().startswith(b"{")


def _too_many(param: str, cap: int) -> ApiError:
    return invalid_request(
        f"Too many items in '{param}': at most {cap} are accepted per request (--max-messages).",
        param=param,
        code="too_many_messages",
    )


def _too_many_parts(cap: int) -> ApiError:
    return invalid_request(
        f"Too many content parts: at most {cap} are accepted per request, all messages together (--max-messages).",
        param="messages",
        code="too_many_content_parts",
    )
