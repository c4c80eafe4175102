"""Errors on the Messages routes are Anthropic's envelope, with the type its reference gives each status."""

from __future__ import annotations

import json

import pytest
from anthropic.types.shared import ErrorResponse

from trio_direct.anthropic.errors import anthropic_error_body, anthropic_error_event
from trio_direct.core import errors


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (errors.invalid_request("messages: Field required", param="messages"), "invalid_request_error"),
        (errors.unauthorized(), "authentication_error"),
        (errors.model_not_found("claude-9"), "not_found_error"),
        (errors.rate_limited("slow down"), "rate_limit_error"),
        (errors.internal_error(), "api_error"),
        (errors.engine_failure("The engine failed to complete the request."), "api_error"),
        (errors.service_unavailable("no engine"), "overloaded_error"),
    ],
)
def test_each_status_has_anthropics_error_type(error, kind):
    body = anthropic_error_body(error)
    parsed = ErrorResponse.model_validate_json(body)  # the SDK's own model of the envelope
    assert (parsed.type, parsed.error.type, parsed.error.message) == ("error", kind, error.message)
    assert json.loads(body) == {"type": "error", "error": {"type": kind, "message": error.message}}


def test_a_too_large_body_is_request_too_large():
    assert json.loads(anthropic_error_body(errors.payload_too_large(10)))["error"]["type"] == "request_too_large"


def test_the_stream_error_is_an_error_event():
    data = anthropic_error_event(errors.service_unavailable("The server is shutting down."))
    name, payload = data.removesuffix(b"\n\n").split(b"\n")
    assert name == b"event: error"
    assert ErrorResponse.model_validate_json(payload.removeprefix(b"data: ")).error.type == "overloaded_error"
