"""OpenAI-shaped API errors.

Every failure a client can see is one `OpenAIError`: it carries the HTTP status and serialises to
OpenAI's nested envelope `{"error": {"message", "type", "param", "code"}}`, so SDKs raise their
usual exception types (`BadRequestError`, `NotFoundError`, ...) and show our message. Messages are
written for API users: they never name engine addresses or other internals.
"""

from __future__ import annotations

from typing import Literal

import msgspec

ErrorType = Literal[
    "invalid_request_error",
    "not_found_error",
    "authentication_error",
    "rate_limit_error",
    "service_unavailable",
    "internal_error",
    "api_error",
]


class _ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorBody


_encoder = msgspec.json.Encoder()


class OpenAIError(Exception):
    """An error answered to the client as `status` with OpenAI's error body."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: ErrorType = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return (
            f"OpenAIError(status={self.status}, type={self.type!r}, param={self.param!r}, "
            f"code={self.code!r}, message={self.message!r})"
        )

    def to_json(self) -> bytes:
        """The response body, byte for byte what OpenAI would send."""
        return _encoder.encode(_ErrorEnvelope(_ErrorBody(self.message, self.type, self.param, self.code)))


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """400: the request is malformed or asks for something out of range."""
    return OpenAIError(message, status=400, type="invalid_request_error", param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    """404 for an unknown `model`, with OpenAI's own type and code so SDKs raise `NotFoundError`."""
    return OpenAIError(
        f"The model `{model}` does not exist.",
        status=404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def not_found(message: str) -> OpenAIError:
    """404 for an unknown path or resource other than a model."""
    return OpenAIError(message, status=404, type="not_found_error")


def payload_too_large(limit: int) -> OpenAIError:
    """413: the body exceeds the frontend's limit (checked before any parsing)."""
    return OpenAIError(
        f"The request body is too large: the limit is {limit} bytes.",
        status=413,
        type="invalid_request_error",
        code="payload_too_large",
    )


def unauthorized(message: str = "Incorrect API key provided.") -> OpenAIError:
    """401: missing or wrong API key."""
    return OpenAIError(message, status=401, type="authentication_error", code="invalid_api_key")


def rate_limited(message: str) -> OpenAIError:
    """429: the client should retry later (admission limits)."""
    return OpenAIError(message, status=429, type="rate_limit_error", code="rate_limit_exceeded")


def service_unavailable(message: str) -> OpenAIError:
    """503: nothing can serve the request right now (no ready engine, shutting down)."""
    return OpenAIError(message, status=503, type="service_unavailable")


def engine_failure(message: str) -> OpenAIError:
    """502: an engine failed the request. Callers pass a client-safe message, never engine internals."""
    return OpenAIError(message, status=502, type="api_error")


def internal_error(message: str = "The server had an error while processing your request.") -> OpenAIError:
    """500: a bug on our side; the details belong in the log, not the response."""
    return OpenAIError(message, status=500, type="internal_error")


def context_length_exceeded(
    prompt_tokens: int, limit: int, max_tokens: int | None, *, param: str = "messages"
) -> OpenAIError:
    """400 when prompt plus requested completion do not fit the model's context (OpenAI's wording).

    `param` is "messages" for chat and "prompt" for completions.
    """
    what = "messages" if param == "messages" else "prompt"
    if max_tokens:
        detail = (
            f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, "
            f"{max_tokens} in the completion). Please reduce the length of the {what} or completion."
        )
    else:
        detail = f"However, your {what} resulted in {prompt_tokens} tokens. Please reduce the length of the {what}."
    return OpenAIError(
        f"This model's maximum context length is {limit} tokens. {detail}",
        status=400,
        type="invalid_request_error",
        param=param,
        code="context_length_exceeded",
    )


def embedding_model_cannot_generate(model: str) -> OpenAIError:
    """400 for a generation request (chat, completions, generate, ...) to an embedding model."""
    return OpenAIError(
        f"The model `{model}` is an embedding model: it serves /v1/embeddings, not generation.",
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_supported",
    )


def generation_model_cannot_embed(model: str) -> OpenAIError:
    """400 for an embeddings request to a generation model (SGLang's engines need --is-embedding)."""
    return OpenAIError(
        f"The model `{model}` is not an embedding model: its engines must be started with --is-embedding "
        "to serve /v1/embeddings.",
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_supported",
    )
