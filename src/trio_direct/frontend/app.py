"""The HTTP surface (quart-trio): OpenAI routes, health, and OpenAI-style errors for everything.

The two completion routes are served by `asgi_completions` in front of Quart (they carry every
token); the rest are thin Quart handlers. Every failure a client can cause or meet is answered with
OpenAI's error envelope and a fitting status; nothing answers a bare 500 page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from trio_direct.frontend import completions
from trio_direct.frontend.asgi_completions import with_completion_routes
from trio_direct.frontend.runtime import Frontend
from trio_direct.metrics import exposition, watch_frontend
from trio_direct.openai import errors, responses
from trio_direct.openai.errors import OpenAIError

log = logging.getLogger(__name__)

_JSON = "application/json"


def create_app(
    get_frontend: Callable[[], Frontend | None],
    *,
    max_body_bytes: int,
    api_key: str | None = None,
    max_concurrent: int = 0,
) -> QuartTrio:
    """The ASGI app. `get_frontend` returns None while the frontend is still starting (503s then)."""
    app = QuartTrio("trio_direct")
    app.config["RESPONSE_TIMEOUT"] = None  # SSE streams last as long as generation does
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes

    def frontend() -> Frontend:
        current = get_frontend()
        if current is None:
            raise errors.service_unavailable("The server is starting: no engine is ready yet.")
        return current

    @app.get("/live")
    async def live() -> Response:
        return Response(b'{"status":"ok"}', content_type=_JSON)

    @app.get("/health")
    async def health() -> Response:
        current = get_frontend()
        if current is None or not current.healthy():
            return Response(b'{"status":"unavailable"}', status=503, content_type=_JSON)
        return Response(b'{"status":"ok"}', content_type=_JSON)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(exposition(), content_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        current = frontend()
        body = responses.models_list([current.model_name], current.created, max_model_len=current.context_length)
        return Response(body, content_type=_JSON)

    @app.get("/debug/routing")
    async def routing_state() -> Response:
        return Response(msgspec.json.encode(frontend().explain_route()), content_type=_JSON)

    @app.post("/debug/routing")
    async def routing_for_prompt() -> Response:
        """Body: a chat or completions request; answer: how it would be routed now."""
        current = frontend()
        body = await request.get_data()
        plan = completions.plan_chat if b'"messages"' in body else completions.plan_completion
        completion = await plan(current, body)
        report = current.explain_route(completion.prompts[0].token_ids)
        return Response(msgspec.json.encode(report), content_type=_JSON)

    @app.errorhandler(OpenAIError)
    async def openai_error(error: OpenAIError) -> Response:
        return Response(error.to_json(), status=error.status, content_type=_JSON)

    @app.errorhandler(RequestEntityTooLarge)
    async def too_large(_error: RequestEntityTooLarge) -> Response:
        error = errors.payload_too_large(max_body_bytes)
        # The rest of the body was never read: the connection cannot carry another request.
        return Response(error.to_json(), status=error.status, content_type=_JSON, headers={"Connection": "close"})

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        message = f"{error.name}: {request.method} {request.path}"
        body = errors.OpenAIError(message, status=status, type="invalid_request_error").to_json()
        return Response(body, status=status, content_type=_JSON)

    @app.errorhandler(Exception)
    async def unexpected(error: Exception) -> Response:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        internal = errors.internal_error()
        return Response(internal.to_json(), status=internal.status, content_type=_JSON)

    watch_frontend(get_frontend)
    app.asgi_app = with_completion_routes(
        app.asgi_app, get_frontend, max_body_bytes=max_body_bytes, api_key=api_key, max_concurrent=max_concurrent
    )
    return app
