"""Server-sent events framing shared by the surfaces whose streams name their events.

The Responses API and Anthropic's Messages API both send ``event: NAME`` + ``data: JSON`` pairs,
the event's name being the payload's own ``type``; one function frames both, encoding the JSON
straight into the event's buffer.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["sse_event"]

_encoder = msgspec.json.Encoder()


def sse_event(payload: dict[str, Any]) -> bytes:
    """One named SSE event: the payload's `type` is the event name."""
    buffer = bytearray(b"event: ")
    buffer += payload["type"].encode()
    buffer += b"\ndata: "
    _encoder.encode_into(payload, buffer, len(buffer))
    buffer += b"\n\n"
    return bytes(buffer)
