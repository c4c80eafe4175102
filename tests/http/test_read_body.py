"""How the app reads a request's body from ASGI messages (`http.app._read_body`)."""

from __future__ import annotations

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.http.app import _read_body


def _receive(*messages: dict):
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return receive


async def test_a_body_in_one_message_is_that_messages_bytes() -> None:
    body = b'{"model": "m"}' * 1000
    read = await _read_body(_receive({"type": "http.request", "body": body, "more_body": False}), 1 << 20)
    assert read is body  # not copied


async def test_a_body_in_several_messages_is_joined_in_order() -> None:
    parts = [b"a" * 10, b"", b"b" * 7, b"c"]
    messages = [{"type": "http.request", "body": p, "more_body": True} for p in parts[:-1]]
    messages.append({"type": "http.request", "body": parts[-1], "more_body": False})
    assert await _read_body(_receive(*messages), 100) == b"".join(parts)
    assert await _read_body(_receive({"type": "http.request", "more_body": False}), 100) == b""


async def test_a_body_over_the_limit_is_refused_as_it_arrives() -> None:
    messages = [{"type": "http.request", "body": b"x" * 60, "more_body": True}] * 2  # the third is never read
    with pytest.raises(ApiError) as refused:
        await _read_body(_receive(*messages), 100)
    assert refused.value.status == 413


async def test_a_client_gone_before_the_end_gives_none() -> None:
    first = {"type": "http.request", "body": b"x", "more_body": True}
    assert await _read_body(_receive(first, {"type": "http.disconnect"}), 100) is None
