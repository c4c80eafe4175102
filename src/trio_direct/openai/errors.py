"""OpenAI's error envelope: ``{"error": {"message", "type", "param", "code"}}``.

The server's one error type is `core.errors.ApiError`; OpenAI's routes (and every path no API
claims) write it in this envelope, so the `openai` SDK raises its usual exception types
(`BadRequestError`, `NotFoundError`, ...) with our message.
"""

from __future__ import annotations

import msgspec

from trio_direct.core.errors import ApiError

__all__ = ["openai_error_body"]


class _ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorBody


_encoder = msgspec.json.Encoder()


def openai_error_body(error: ApiError) -> bytes:
    """The response body, byte for byte what OpenAI would send."""
    return _encoder.encode(_ErrorEnvelope(_ErrorBody(error.message, error.type, error.param, error.code)))
