"""The one HTTP layer: an ASGI app that serves the route table it is given (the surfaces' table,
`trio_direct.surfaces.routes`, passed in by the composition root `trio_direct.service`).

Every request passes the same rules, written once, in this order: the protocol guard
(`http/asgi_guard.py`: a declared Content-Length over ``--max-body-bytes`` is a 413 before any body
is read, Content-Length with Transfer-Encoding a 400 and a closed connection, a WebSocket handshake
a 400), route lookup (404, 405; where credentials are required a request without valid ones gets
401 there, so routes cannot be enumerated), CORS preflight, credentials (401; they name the
request's tenant, `tenants.access`; ``--metrics-api-key`` guards ``/metrics``), "server is
starting" (503), the tenant's limits (429 with Retry-After and ``x-ratelimit-*`` headers,
generation routes; see `tenants.limiter`), admission against ``--max-concurrent-requests`` and
``--max-queued-requests`` (429 with Retry-After at once, generation routes; see `core.admission`),
the body read within ``--max-body-bytes`` (413 for a chunked body that grows past it), its messages
and content parts counted against ``--max-messages`` before it is decoded (400;
`openai.item_counts`, in a thread for a large body), the client-disconnect watch, then the handler;
whatever it raises as `ApiError` is written in the route's own error envelope, and anything else
is logged and answered 500 in that envelope. Nothing answers a bare error page.

A generation request is named on arrival (`core.request_context`: the client's ``X-Request-Id`` or
a generated id), which every log line about it carries and every response to it returns in
``x-request-id``; with tracing on (`tracing`), its span starts here too, continuing the client's
``traceparent``. A request that must wait for a slot waits after its body is read and planned
(its ``priority`` is in the body), in `Exchange.respond`, before anything is sent to an engine.

A client that disconnects is noticed by a task reading ASGI messages once the body is read, which
cancels the request's scope; engine calls then end through `core.engine_call.open_engine_call`'s
``finally`` (an `Abort` each).

Every request ends with one access-log line (`http.access_log`; off with ``--no-access-log``): the
exchange's status and duration, and for a generation its request id, model, engine and token counts
as `core` recorded them on its `RequestContext`.

The ASGI lifespan protocol starts the frontend when the app is served by ``hypercorn
trio_direct.app:app`` (`create_app(..., start=...)`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from trio_direct import metrics, tracing
from trio_direct.config import ServeConfig
from trio_direct.core import errors
from trio_direct.core.admission import Admission
from trio_direct.core.errors import ApiError
from trio_direct.core.request_context import CURRENT, RequestContext
from trio_direct.http.access_log import AccessRecord, log_access
from trio_direct.http.asgi_guard import ProtocolGuard
from trio_direct.http.connection import cancel_on_disconnect
from trio_direct.http.exchange import Exchange, Receive, Scope, Send
from trio_direct.http.routing_table import ErrorFormat, HttpRoute, RouteTable, openai_error_body
from trio_direct.logs import REQUEST_ID
from trio_direct.openai.item_counts import check_item_counts, prepare_item_counts
from trio_direct.tenants import access as tenant_access
from trio_direct.tenants.directory import ANONYMOUS, Tenant
from trio_direct.tenants.limiter import Grant, RateLimited
from trio_direct.tenants.service import Tenants, TenantsSettings

if TYPE_CHECKING:
    from trio_direct.core.frontend import Frontend

__all__ = ["App", "create_app", "tenants_settings"]

log = logging.getLogger(__name__)

App = Callable[[Scope, Receive, Send], Awaitable[None]]
#: Starts the frontend inside the ASGI lifespan and reports it (``nursery.start`` protocol).
StartFrontend = Callable[..., Awaitable[None]]

_CORS_METHODS = b"GET, POST, DELETE, OPTIONS"
_CORS_MAX_AGE = b"600"
#: Bound on the shielded bookkeeping at a request's end (a shared store's round trips).
_SETTLE_TIMEOUT = 5.0


def tenants_settings(config: ServeConfig) -> TenantsSettings:
    return TenantsSettings(
        tenants_file=config.tenants_file,
        api_key=config.api_key,
        jwt_jwks_url=config.jwt_jwks_url,
        jwt_issuer=config.jwt_issuer,
        jwt_audience=config.jwt_audience,
        jwt_tenant_claim=config.jwt_tenant_claim,
    )


def create_app(
    get_frontend: Callable[[], Frontend | None],
    config: ServeConfig,
    *,
    routes: RouteTable,
    start: StartFrontend | None = None,
    tenants: Tenants | None = None,
) -> App:
    """The ASGI app. `get_frontend` returns None while the frontend is still starting (503s then);
    `start`, when given, runs the frontend for the lifespan of the app (the hypercorn CLI entry).
    `tenants`: who may call and how much (`Tenants.run` keeps its file current); by default read
    once from `config`."""
    if tenants is None:
        tenants = Tenants.load(tenants_settings(config))
    access, limiter, labels = tenants.access, tenants.limiter, tenants.labels
    admin_key = config.admin_api_key.encode() if config.admin_api_key else None
    metrics_key = config.metrics_api_key.encode() if config.metrics_api_key else None
    if admin_key is None:  # the admin API is off without its key: its paths do not exist (404)
        routes = RouteTable([route for route in routes.routes if not route.admin])
    origins = _origins(config.cors_allow_origins)
    admission = Admission(config.max_concurrent_requests, config.max_queued_requests, config.queue_timeout)
    max_body = config.max_body_bytes
    max_items = config.max_messages
    prepare_item_counts(max_items)  # builds its decoders now, not in the first long request
    metrics.watch_frontend(get_frontend)
    requests = metrics.Children(metrics.REQUESTS)  # model, endpoint, stream, status
    durations = metrics.Children(metrics.DURATION)  # model, endpoint
    tenant_requests = metrics.Children(metrics.TENANT_REQUESTS)  # tenant
    tenant_tokens = metrics.Children(metrics.TENANT_TOKENS)  # tenant, kind

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await serve_http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send, start)

    async def serve_http(scope: Scope, receive: Receive, send: Send) -> None:
        if not config.access_log:
            await handle_http(scope, receive, send, None)
            return
        seen = _Seen()
        try:
            await handle_http(scope, receive, send, seen)
        finally:
            _log_access(scope, seen)

    async def handle_http(scope: Scope, receive: Receive, send: Send, seen: _Seen | None) -> None:
        path, method = scope["path"], scope["method"]
        cors = _cors_headers(scope, origins)
        if method == "OPTIONS" and cors is not None:
            await _preflight(scope, send, cors, routes.methods(path))
            if seen is not None:
                seen.status = 204
            return
        match = routes.match(method, path)
        route = match.route
        exchange = Exchange(scope, send, frontend=get_frontend(), params=match.params, extra_headers=cors or [])
        if seen is not None:
            seen.exchange = exchange
        if route is None:
            if access.required and await access.identify(_credentials(exchange, _ANY_KEY_HEADERS)) is None:
                # Without a key, a path that does not exist looks like one that does: routes cannot
                # be enumerated by their 404s.
                error = errors.unauthorized()
                await exchange.json(error.status, openai_error_body(error), headers=[(b"www-authenticate", b"Bearer")])
                return
            if match.allowed:
                error = errors.ApiError(f"Method Not Allowed: {method} {path}", status=405)
                allow = ", ".join(match.allowed).encode()
                await exchange.json(405, openai_error_body(error), headers=[(b"allow", allow)])
            else:
                await exchange.json(404, openai_error_body(errors.not_found(f"Not Found: {method} {path}")))
            return
        guarded_metrics = route.path == "/metrics" and metrics_key is not None  # it shows the engines' addresses
        if guarded_metrics and not _authorized(exchange, route.api_key_headers, metrics_key or b""):
            await _unauthorized(exchange, route)
            return
        tenant = ANONYMOUS
        if route.admin:
            if admin_key is not None and not _authorized(exchange, route.api_key_headers, admin_key):
                await _unauthorized(exchange, route)
                return
        elif not route.open and access.required:
            found = await access.identify(_credentials(exchange, route.api_key_headers))
            if found is None:
                metrics.TENANT_REFUSALS.labels("other", "unauthorized").inc()
                await _unauthorized(exchange, route)
                return
            tenant = found
        tenant_token = tenant_access.CURRENT.set(tenant)
        try:
            await serve_route(route, exchange, receive, tenant, seen)
        finally:
            tenant_access.CURRENT.reset(tenant_token)

    async def serve_route(
        route: HttpRoute, exchange: Exchange, receive: Receive, tenant: Tenant, seen: _Seen | None
    ) -> None:
        if route.needs_frontend and exchange.frontend_or_none is None:
            error = errors.service_unavailable("The server is starting: no engine is ready yet.")
            await exchange.json(error.status, route.error_body(error), headers=[(b"retry-after", b"1")])
            return
        if route.endpoint is None:
            await _run(route, exchange, receive, max_body, max_items)
            return
        context = RequestContext.for_client_id(exchange.header(b"x-request-id"))
        if seen is not None:
            seen.context = context
        context.tenant = tenant.name
        exchange.extra_headers.append((b"x-request-id", context.request_id.encode()))
        context_token, id_token = CURRENT.set(context), REQUEST_ID.set(context.request_id)
        try:
            await serve_generation(route, exchange, receive, context, tenant)
        finally:
            CURRENT.reset(context_token)
            REQUEST_ID.reset(id_token)

    async def serve_generation(
        route: HttpRoute, exchange: Exchange, receive: Receive, context: RequestContext, tenant: Tenant
    ) -> None:
        label = labels(tenant)
        try:
            grant = await limiter.begin(tenant, context.key)
        except RateLimited as refusal:
            metrics.TENANT_REFUSALS.labels(label, refusal.limit).inc()
            error = errors.rate_limited(refusal.message)
            headers = [refusal.retry_after_header(), *refusal.headers]
            await exchange.json(error.status, route.error_body(error), headers=headers)
            metrics.REQUESTS.labels(model="", endpoint=route.endpoint, stream="", status="429").inc()
            return
        except Exception as failure:  # noqa: BLE001 - a shared store out of reach: the limits cannot be checked
            log.error("tenant limits cannot be checked: %s", failure)
            error = errors.service_unavailable("The server cannot check this key's rate limits right now.")
            await exchange.json(error.status, route.error_body(error), headers=[(b"retry-after", b"1")])
            metrics.REQUESTS.labels(model="", endpoint=route.endpoint, stream="", status="503").inc()
            return
        exchange.extra_headers += grant.headers
        ticket = admission.arrive(tenant.name, tenant.priority, tenant.weight)
        if ticket is None:
            await _settle(grant, exchange)
            error = errors.rate_limited(
                f"The server is at its limit of {admission.max_active} concurrent requests; retry later."
            )
            await exchange.json(error.status, route.error_body(error), headers=[(b"retry-after", b"1")])
            metrics.REQUESTS.labels(model="", endpoint=route.endpoint, stream="", status="429").inc()
            return
        ticket.label = label
        exchange.admission, exchange.ticket, exchange.grant = admission, ticket, grant
        tenant_requests(label).inc()
        context.trace = tracing.start_request(exchange.scope, context.request_id) if tracing.ENABLED else None
        if context.trace is not None:
            context.trace.span.set_attribute("trio_direct.tenant", tenant.name)
        metrics.IN_FLIGHT.inc()
        try:
            await _run(route, exchange, receive, max_body, max_items)
        finally:
            admission.leave(ticket)
            metrics.IN_FLIGHT.dec()
            await _settle(grant, exchange)
            usage = exchange.usage()
            if usage is not None:
                tenant_tokens(label, "input").inc(usage[0])
                tenant_tokens(label, "output").inc(usage[1])
            status = exchange.status if exchange.ended else 499  # 499: the client went away
            stream = "true" if exchange.stream else "false"
            requests(exchange.model, route.endpoint, stream, str(status)).inc()
            durations(exchange.model, route.endpoint).observe(time.perf_counter() - exchange.started)
            if context.trace is not None:
                context.trace.end(status, exchange.model)

    def error_body_for(scope: Scope) -> ErrorFormat:
        route = routes.match(scope["method"], scope["path"]).route
        return route.error_body if route is not None else openai_error_body

    return ProtocolGuard(app, max_body_bytes=max_body, error_body_for=error_body_for)


class _Seen:
    """What the access log needs of a request, filled in as the request is served."""

    __slots__ = ("context", "exchange", "started", "status")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.exchange: Exchange | None = None
        self.context: RequestContext | None = None
        self.status = 0


def _log_access(scope: Scope, seen: _Seen) -> None:
    exchange, context = seen.exchange, seen.context
    status = seen.status
    if exchange is not None:
        status = exchange.status if exchange.ended else 499  # 499: the client went away first
    record = AccessRecord(
        method=scope["method"],
        path=scope["path"],
        status=status,
        duration_ms=(time.perf_counter() - seen.started) * 1000,
        request_id=context.request_id if context is not None else None,
        model=(exchange.model or None) if exchange is not None else None,
    )
    if context is not None:
        record.engine = context.engine or None
        record.prompt_tokens, record.completion_tokens = context.prompt_tokens, context.completion_tokens
        record.tenant = context.tenant or None
    log_access(record)


async def _run(route: HttpRoute, exchange: Exchange, receive: Receive, max_body: int, max_items: int = 0) -> None:
    """Read the body, watch for the client leaving, run the handler; errors in the route's envelope."""
    try:
        with trio.CancelScope() as scope:  # cancelled when the client leaves
            body = await _read_body(receive, max_body)
            if body is None:
                return  # the client left before sending its request
            if len(body) > _THREAD_BODY_BYTES:
                await trio.to_thread.run_sync(check_item_counts, body, max_items)
            elif body:
                check_item_counts(body, max_items)
            exchange.body = body
            context = CURRENT.get()
            if context is not None and context.trace is not None:
                context.trace.body_read_at = time.time_ns()
            if cancel_on_disconnect(receive, scope):  # under `serve`: the connection cancels it
                try:
                    await route.handler(exchange)
                finally:
                    cancel_on_disconnect(receive, None)
            else:  # plain hypercorn: a task waits for the disconnect
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_disconnect, receive, scope)
                    await route.handler(exchange)
                    nursery.cancel_scope.cancel()
    except* ApiError as group:
        await _answer_error(exchange, route, group.exceptions[0])  # type: ignore[arg-type]
    except* Exception as group:
        log.error(
            "unexpected error serving %s %s",
            exchange.scope["method"],
            exchange.scope["path"],
            exc_info=group.exceptions[0],
        )
        await _answer_error(exchange, route, errors.internal_error())


#: Bodies larger than this have their items counted in a thread (the count reads them whole).
_THREAD_BODY_BYTES = 256 * 1024


async def _answer_error(exchange: Exchange, route: HttpRoute, error: ApiError) -> None:
    # Not a local of `_run`: the error's traceback holds that frame, so a local there would keep the
    # request, its exchange and the error alive in a reference cycle until a full garbage collection.
    close = error.status == 413  # the rest of the body was never read: the connection cannot carry another request
    # A full server, a queue timeout, engines at capacity or unavailable: worth retrying, soon.
    headers = [(b"retry-after", b"1")] if error.status in (429, 503) else []
    await exchange.json(error.status, route.error_body(error), headers=headers, close=close)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None when the client left first. A body that came in one message is
    that message's bytes (no copy: a long prompt's body is read whole, then parsed, on the loop)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.payload_too_large(limit)
        if not message.get("more_body"):
            if not chunks:
                return bytes(chunk)  # `bytes` of bytes is the same object
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _settle(grant: Grant, exchange: Exchange) -> None:
    """The request's last tokens charged and its tenant slot freed (shielded: it ends however the
    request did; bounded, as a shared store may not answer)."""
    if grant.limiter is None:
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + _SETTLE_TIMEOUT
        try:
            usage = exchange.usage()
            if usage is not None:
                await grant.charge(usage[0] + usage[1])
            await grant.end()
        except Exception as failure:  # noqa: BLE001 - a shared store out of reach: its leases expire
            log.warning("the tenant counters failed at the end of a request: %s", failure)
            return
    if scope.cancelled_caught:
        log.warning("the tenant counters did not answer in %gs: a slot is freed when its lease ends", _SETTLE_TIMEOUT)


async def _unauthorized(exchange: Exchange, route: HttpRoute) -> None:
    error = errors.unauthorized()
    await exchange.json(error.status, route.error_body(error), headers=[(b"www-authenticate", b"Bearer")])


def _credentials(exchange: Exchange, api_key_headers: tuple[bytes, ...]) -> list[bytes]:
    """The keys or tokens a request carries: its `Authorization: Bearer` token (the scheme is
    case-insensitive, RFC 9110 §11.1), then the route's own API-key headers (Anthropic's `x-api-key`)."""
    found = []
    value = exchange.header(b"authorization")
    if value is not None:
        scheme, _, token = value.partition(b" ")
        if scheme.lower() == b"bearer" and token.strip():
            found.append(token.strip())
    for name in api_key_headers:
        value = exchange.header(name)
        if value is not None and value.strip():
            found.append(value.strip())
    return found


#: Where a path that does not exist accepts the API key besides `Authorization: Bearer`.
_ANY_KEY_HEADERS = (b"x-api-key",)


def _authorized(exchange: Exchange, api_key_headers: tuple[bytes, ...], expected: bytes) -> bool:
    """`Authorization: Bearer KEY` (the scheme is case-insensitive, RFC 9110 §11.1), or one of the
    route's own API-key headers (Anthropic's `x-api-key`)."""
    value = exchange.header(b"authorization")
    if value is not None:
        scheme, _, token = value.partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), expected):
            return True
    for name in api_key_headers:
        value = exchange.header(name)
        if value is not None and hmac.compare_digest(value.strip(), expected):
            return True
    return False


# ---- CORS -----------------------------------------------------------------------------------------


def _origins(setting: str) -> frozenset[bytes] | None:
    """``--cors-allow-origins``: None (off), or the allowed origins (``*``: any)."""
    origins = frozenset(part.strip().encode() for part in setting.replace(",", " ").split() if part.strip())
    return origins or None


def _cors_headers(scope: Scope, origins: frozenset[bytes] | None) -> list[tuple[bytes, bytes]] | None:
    """The CORS headers for a request from an allowed origin; None when CORS does not apply."""
    if origins is None:
        return None
    origin = next((value for name, value in scope["headers"] if name == b"origin"), None)
    if origin is None:
        return None
    if b"*" in origins:
        return [(b"access-control-allow-origin", b"*")]
    if origin in origins:
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
    return None


async def _preflight(scope: Scope, send: Send, cors: list[tuple[bytes, bytes]], methods: tuple[str, ...]) -> None:
    """Answer a CORS preflight (no API key needed: browsers send none on a preflight)."""
    asked = next((value for name, value in scope["headers"] if name == b"access-control-request-headers"), None)
    headers = [
        *cors,
        (b"access-control-allow-methods", ", ".join(methods).encode() if methods else _CORS_METHODS),
        (b"access-control-allow-headers", asked or b"authorization, content-type, x-api-key"),
        (b"access-control-max-age", _CORS_MAX_AGE),
        (b"content-length", b"0"),
    ]
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


# ---- lifespan -------------------------------------------------------------------------------------


async def _lifespan(receive: Receive, send: Send, start: StartFrontend | None) -> None:
    """ASGI lifespan: start the frontend (when this app owns it) and hold it until shutdown."""
    message = await receive()
    if message["type"] != "lifespan.startup":
        return
    async with trio.open_nursery() as nursery:
        if start is not None:
            try:
                await nursery.start(start)
            except Exception as error:  # noqa: BLE001 - reported to the server, which exits
                log.error("start-up failed: %s", error)
                await send({"type": "lifespan.startup.failed", "message": str(error)})
                return
        await send({"type": "lifespan.startup.complete"})
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        nursery.cancel_scope.cancel()
    await send({"type": "lifespan.shutdown.complete"})
