"""The one error type of every API surface, and its common cases.

Every failure a client can see is one `ApiError`: a message, the HTTP status, and the error's type,
parameter and code (named as OpenAI's API names them, the richest of the envelopes). Each API writes
it in its own envelope at its edge: OpenAI's nested `{"error": {...}}` (`core.errors`), Anthropic's
`{"type": "error", ...}` (`anthropic.errors`), so each SDK raises its usual exception types and shows
our message. Messages are written for API users: they never name engine addresses or other internals.
"""

from __future__ import annotations

from typing import Literal

ErrorType = Literal[
    "invalid_request_error",
    "not_found_error",
    "authentication_error",
    "rate_limit_error",
    "service_unavailable",
    "internal_error",
    "api_error",
]


class ApiError(Exception):
    """An error answered to the client as `status`, in the envelope of the API it called."""

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
            f"ApiError(status={self.status}, type={self.type!r}, param={self.param!r}, "
            f"code={self.code!r}, message={self.message!r})"
        )


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """400: the request is malformed or asks for something out of range."""
    return ApiError(message, status=400, type="invalid_request_error", param=param, code=code)


def model_not_found(model: str) -> ApiError:
    """404 for an unknown `model`, with OpenAI's own type and code so SDKs raise `NotFoundError`."""
    return ApiError(
        f"The model `{model}` does not exist.",
        status=404,
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def not_found(message: str) -> ApiError:
    """404 for an unknown path or resource other than a model."""
    return ApiError(message, status=404, type="not_found_error")


def payload_too_large(limit: int) -> ApiError:
    """413: the body exceeds the frontend's limit (checked before any parsing)."""
    return ApiError(
        f"The request body is too large: the limit is {limit} bytes.",
        status=413,
        type="invalid_request_error",
        code="payload_too_large",
    )


def unauthorized(message: str = "Incorrect API key provided.") -> ApiError:
    """401: missing or wrong API key."""
    return ApiError(message, status=401, type="authentication_error", code="invalid_api_key")


def rate_limited(message: str) -> ApiError:
    """429: the client should retry later (admission limits)."""
    return ApiError(message, status=429, type="rate_limit_error", code="rate_limit_exceeded")


def service_unavailable(message: str) -> ApiError:
    """503: nothing can serve the request right now (no ready engine, shutting down)."""
    return ApiError(message, status=503, type="service_unavailable")


def engine_failure(message: str) -> ApiError:
    """502: an engine failed the request. Callers pass a client-safe message, never engine internals."""
    return ApiError(message, status=502, type="api_error")


def internal_error(message: str = "The server had an error while processing your request.") -> ApiError:
    """500: a bug on our side; the details belong in the log, not the response."""
    return ApiError(message, status=500, type="internal_error")


def context_length_exceeded(
    prompt_tokens: int, limit: int, max_tokens: int | None, *, param: str = "messages", at_least: bool = False
) -> ApiError:
    """400 when prompt plus requested completion do not fit the model's context (OpenAI's wording).

    `param` is "messages" for chat and "prompt" for completions. `at_least`: the prompt was refused
    before it was tokenized whole, and `prompt_tokens` is a lower bound on its length.
    """
    what = "messages" if param == "messages" else "prompt"
    if at_least:
        detail = (
            f"However, your {what} resulted in more than {prompt_tokens} tokens. "
            f"Please reduce the length of the {what}."
        )
    elif max_tokens:
        detail = (
            f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, "
            f"{max_tokens} in the completion). Please reduce the length of the {what} or completion."
        )
    else:
        detail = f"However, your {what} resulted in {prompt_tokens} tokens. Please reduce the length of the {what}."
    return ApiError(
        f"This model's maximum context length is {limit} tokens. {detail}",
        status=400,
        type="invalid_request_error",
        param=param,
        code="context_length_exceeded",
    )


def embedding_model_cannot_generate(model: str) -> ApiError:
    """400 for a generation request (chat, completions, generate, ...) to an embedding model."""
    return ApiError(
        f"The model `{model}` is an embedding model: it serves /v1/embeddings, not generation.",
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_supported",
    )


def generation_model_cannot_embed(model: str) -> ApiError:
    """400 for an embeddings request to a generation model (SGLang's engines need --is-embedding)."""
    return ApiError(
        f"The model `{model}` is not an embedding model: its engines must be started with --is-embedding "
        "to serve /v1/embeddings.",
        status=400,
        type="invalid_request_error",
        param="model",
        code="model_not_supported",
    )
