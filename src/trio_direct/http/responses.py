"""Whole HTTP/1.1 error responses as bytes, for the answers given where no request is being served.

A refused connection, a request head that never completed and an HTTP/2 preface are answered below
hypercorn's request handling (there is no request for it to answer), so the response is written to
the socket as is: OpenAI's error envelope, and ``Connection: close`` since the connection ends.
"""

from __future__ import annotations

from http import HTTPStatus

from trio_direct.core.errors import ApiError
from trio_direct.openai.errors import openai_error_body


def error_response(error: ApiError, *, retry_after: int | None = None) -> bytes:
    body = openai_error_body(error)
    head = [
        f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


def header_timeout(seconds: float) -> bytes:
    message = f"The request head was not received within {seconds:g} seconds."
    return error_response(ApiError(message, status=408, type="invalid_request_error", code="request_timeout"))


def body_timeout(pause: float, total: float) -> bytes:
    message = (
        f"The request body stalled or trickled: it may pause at most {pause:g} seconds between bytes and "
        f"must be complete within {total:g} seconds."
    )
    return error_response(ApiError(message, status=408, type="invalid_request_error", code="request_timeout"))


def too_many_connections(limit: int) -> bytes:
    message = f"The server is at its limit of {limit} open connections; retry shortly."
    return error_response(ApiError(message, status=503, type="service_unavailable"), retry_after=1)


def http2_not_supported() -> bytes:
    message = "This server speaks HTTP/1.1 only: HTTP/2 without TLS (prior knowledge) is not supported."
    error = ApiError(message, status=505, type="invalid_request_error", code="http_version_not_supported")
    return error_response(error)


def method_not_upper_case() -> bytes:
    message = "The request method must be upper-case (methods are case-sensitive: GET, POST, ...)."
    return error_response(ApiError(message, status=400, type="invalid_request_error", code="invalid_method"))
