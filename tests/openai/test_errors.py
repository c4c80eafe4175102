"""Errors reach OpenAI SDK users as the SDK's own exception types, with our message, param and code."""

from __future__ import annotations

import json

import openai
import pytest

from trio_direct.core import errors
from trio_direct.openai.errors import openai_error_body

MESSAGES = [{"role": "user", "content": "hi"}]


def test_envelope_is_openais_nested_shape():
    error = errors.invalid_request("Bad temperature.", param="temperature", code="x")
    assert json.loads(openai_error_body(error)) == {
        "error": {"message": "Bad temperature.", "type": "invalid_request_error", "param": "temperature", "code": "x"}
    }
    assert error.status == 400
    assert str(error) == "Bad temperature."


@pytest.mark.parametrize(
    ("error", "sdk_exception", "status"),
    [
        (errors.invalid_request("nope", param="n"), openai.BadRequestError, 400),
        (errors.model_not_found("gpt-x"), openai.NotFoundError, 404),
        (errors.not_found("No such route."), openai.NotFoundError, 404),
        (errors.unauthorized(), openai.AuthenticationError, 401),
        (errors.payload_too_large(1024), openai.APIStatusError, 413),
        (errors.rate_limited("Slow down."), openai.RateLimitError, 429),
        (errors.internal_error(), openai.InternalServerError, 500),
        (errors.engine_failure("The engine failed."), openai.InternalServerError, 502),
        (errors.service_unavailable("No engine is ready."), openai.InternalServerError, 503),
    ],
)
def test_sdk_raises_its_own_exception_with_our_fields(answering, error, sdk_exception, status):
    assert error.status == status
    client = answering(error.status, openai_error_body(error))
    with pytest.raises(sdk_exception) as caught:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert caught.value.status_code == status
    assert caught.value.code == error.code
    assert caught.value.param == error.param
    assert error.message in caught.value.message


def test_model_not_found_reads_like_openai():
    error = errors.model_not_found("gpt-x")
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")
    assert error.message == "The model `gpt-x` does not exist."


def test_context_length_exceeded_counts_prompt_and_completion():
    error = errors.context_length_exceeded(4000, 4096, 200)
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "messages")
    assert "maximum context length is 4096 tokens" in error.message
    assert "you requested 4200 tokens (4000 in the messages, 200 in the completion)" in error.message


def test_context_length_exceeded_without_completion_budget_names_the_prompt():
    error = errors.context_length_exceeded(5000, 4096, None, param="prompt")
    assert error.param == "prompt"
    assert "your prompt resulted in 5000 tokens" in error.message
