"""The cap on messages and content parts per request (``--max-messages``), checked before the body
is decoded, at a cost that does not grow with how far over the cap it is.

Decoding a JSON body costs time and memory per value: a 31 MB body of a million tiny messages took
seconds of the event loop and hundreds of megabytes before any rule could refuse it. Here the
``messages`` (chat, Anthropic) or ``input`` (Responses items) array is read as an array-like
struct with `cap` optional slots whose values stay raw JSON (slices of the body, never decoded):
msgspec stops at the first element past the last slot, so an array of a million elements costs the
same as one of `cap` + 1. A struct of `cap` slots costs its size to make, so arrays are read with
64 slots first and with `cap` only when longer. Each item's ``content``, when it is an array, is
read the same way and the parts are counted over the whole request. Bodies that are not shaped
like that (not an object, no such array, an item that is not an object, an ``input`` of strings or
token ids as embeddings take it) are left for the full decoder and the route's own limits.
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


#: The slots of the first read of an array (`_arrays`): chats and Responses inputs rarely hold more items.
_FIRST_SLOTS = 64


@lru_cache(maxsize=8)
def _decoders(
    cap: int,
) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder, msgspec.json.Decoder, msgspec.json.Decoder]:
    """(``messages`` and ``input`` together, ``messages`` alone, ``input`` alone, one large item's
    content), each array with `cap` raw slots. One pass over the body reads both arrays; where it
    fails (an array over the cap: msgspec's error does not say which; a field of another shape),
    each array is read on its own."""
    slots = msgspec.defstruct(
        "Slots", [(f"s{i}", msgspec.Raw, _EMPTY) for i in range(cap)], array_like=True, forbid_unknown_fields=True
    )
    items = msgspec.defstruct("Items", [("messages", slots | None, None), ("input", slots | str | None, None)])
    messages = msgspec.defstruct("Messages", [("messages", slots | None, None)])
    inputs = msgspec.defstruct("Inputs", [("input", slots | str | None, None)])
    item = msgspec.defstruct("Item", [("content", slots | str | None, None)])
    decoders = (items, messages, inputs, item)
    return tuple(msgspec.json.Decoder(kind) for kind in decoders)  # type: ignore[return-value]


def _filled(slots: Any) -> list[msgspec.Raw]:
    """The slots an array filled (they fill from the first: the first empty one ends them)."""
    low, high = 0, len(slots.__struct_fields__)
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
        _decoders(min(cap, _FIRST_SLOTS))


def check_item_counts(body: bytes, cap: int) -> None:
    """Raise a 400 when the body carries more than `cap` messages (or ``input`` items that are
    objects), or more than `cap` content parts in all; `cap` <= 0: no cap."""
    if cap <= 0 or len(body) <= 2 * cap or body.count(b",") < cap:
        # n items of a JSON array take at least 2n - 1 bytes (a value of one byte or more, and a comma
        # between two), so a body this short cannot carry more than `cap` of them, nor of parts. Most
        # bodies are: they skip the decoding (a struct of `cap` slots, ~2 µs a token of a short chat).
        # Longer bodies are bounded by their commas: every element of an array but its first follows
        # a comma, and every array counted here but the first sits in an element or an object member
        # that follows one (parts in items, ``input`` beside ``messages``), so n items or n parts in
        # all take n - 1 commas or more. With fewer than `cap` commas (those in strings count too,
        # which only errs towards reading) no count exceeds `cap`. A long conversation is mostly
        # prose: counting its commas takes ~5 µs of the ~85 µs the read takes.
        return
    try:
        arrays = _arrays(body, cap)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return  # not JSON: the full decoder says so
    item_decoder = _decoders(cap)[3]
    parts = 0
    for slots in arrays:
        if slots is None or isinstance(slots, str):
            continue
        for raw in _filled(slots):
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
            parts += len(content) if isinstance(content, list) else len(_filled(content))
            if parts > cap:
                raise _too_many_parts(cap)


def _arrays(body: bytes, cap: int) -> tuple[Any, Any]:
    """The slots of ``messages`` and of ``input``, each None where the body has no such array.

    Read first with `_FIRST_SLOTS` slots, then, only when an array is longer, with `cap`: a struct
    of `cap` slots costs its size to make (~0.1 ms at the default cap of 10,000) however few of
    them an array fills. Raises when an array is over the cap.
    """
    slots = min(cap, _FIRST_SLOTS)
    try:
        items = _decoders(slots)[0].decode(body)
        return items.messages, items.input
    except msgspec.ValidationError as error:
        if slots < cap and str(error).startswith(_OVER):
            try:
                items = _decoders(cap)[0].decode(body)
                return items.messages, items.input
            except msgspec.ValidationError:
                pass
    _, messages, inputs, _ = _decoders(cap)
    return _array(messages, body, "messages", cap), _array(inputs, body, "input", cap)


def _array(decoder: msgspec.json.Decoder, body: bytes, name: str, cap: int) -> Any:
    """The slots of the array `name`, read on its own; None when it has another shape (token ids
    as an embeddings input, a field the route does not take). Raises when it is over the cap."""
    try:
        return getattr(decoder.decode(body), name)
    except msgspec.ValidationError as error:
        if str(error).startswith(_OVER) and (name == "messages" or _items_are_objects(body)):
            raise _too_many(name, cap) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        pass
    return None


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
