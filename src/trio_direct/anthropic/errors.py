"""Errors in Anthropic's envelope: ``{"type": "error", "error": {"type": ..., "message": ...}}``.

Every failure is raised as the one `ApiError` the rest of the server knows; the Messages routes
write it in Anthropic's shape instead, so the `anthropic` SDK raises its usual exception for the
status (`BadRequestError`, `NotFoundError`, `RateLimitError`, ...) with our message. The error type
follows from the status, as Anthropic's API reference lists them.
"""

from __future__ import annotations

import msgspec

from trio_direct.core.errors import ApiError

__all__ = ["anthropic_error_body", "anthropic_error_event", "anthropic_error_type"]

#: HTTP status -> Anthropic error type (Anthropic's "Errors" reference).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class _Error(msgspec.Struct):
    type: str
    message: str


class _Envelope(msgspec.Struct, tag_field="type", tag="error"):
    error: _Error


_encoder = msgspec.json.Encoder()


def anthropic_error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status (other 4xx: invalid_request_error, 5xx: api_error)."""
    found = _TYPES.get(status)
    if found is not None:
        return found
    return "invalid_request_error" if status < 500 else "api_error"


def _envelope(error: ApiError) -> bytes:
    return _encoder.encode(_Envelope(_Error(anthropic_error_type(error.status), error.message)))


def anthropic_error_body(error: ApiError) -> bytes:
    """The JSON body of an error response on a Messages route (`Route.error_body`)."""
    return _envelope(error)


def anthropic_error_event(error: ApiError) -> bytes:
    """A failure after a stream's headers went out: Anthropic's ``event: error`` SSE event."""
    return b"event: error\ndata: " + _envelope(error) + b"\n\n"
