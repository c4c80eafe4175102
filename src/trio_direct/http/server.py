"""trio-direct's HTTP server: hypercorn 0.18's trio worker with our accept loop and connections.

`serve_http` is `hypercorn.trio.serve` (lifespan, binds, graceful shutdown, all as in hypercorn's
`worker_serve`) with the two parts replaced that hypercorn offers no hook for:

- The accept loop. `trio.serve_listeners` accepts without bound, and while `accept` fails for lack
  of file descriptors (EMFILE) it logs a traceback every 100 ms. Here at most `connection_cap`
  connections are open: one more is answered 503 and closed at once, before it can cost more than
  the moment it takes. Failed accepts are retried every 100 ms until they succeed, logged once per
  `ACCEPT_LOG_INTERVAL` while they last; connections already open are served meanwhile.
- The connection: `GuardedConnection` (read deadlines, HTTP/1.1 only; `http/connection.py`).

`serve_app` serves the app `http.app.create_app` makes (whose first layer is `ProtocolGuard`,
`http/asgi_guard.py`) and takes its settings from `ServeConfig`. No TLS and no QUIC: the frontend
serves plain HTTP/1.1; TLS terminates in front.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from functools import partial
from typing import cast
from wsgiref.handlers import format_date_time

import hypercorn
import trio
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

from trio_direct.config import ServeConfig
from trio_direct.http import responses
from trio_direct.http.asgi_guard import ASGIApp
from trio_direct.http.connection import GuardedConnection
from trio_direct.http.limits import (
    ConnectionGate,
    ConnectionLimits,
    Throttle,
    connection_cap,
    fd_reserve,
    raise_open_file_limit,
)
from trio_direct.metrics import HTTP_ACCEPT_ERRORS, HTTP_CONNECTIONS, HTTP_CONNECTIONS_REFUSED

log = logging.getLogger(__name__)

#: `accept` errors that mean "out of resources for now" (as `trio.serve_listeners` has them).
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY = 0.1
ACCEPT_LOG_INTERVAL = 10.0
REFUSAL_LOG_INTERVAL = 10.0
#: A refusal is one small write to a new socket; never let a client hold the accept loop with it.
_REFUSAL_SEND_TIMEOUT = 0.1


class ListenError(OSError):
    """The HTTP port cannot be bound (in use, not permitted, no such address): one line for the user."""


class _Config(hypercorn.Config):
    """hypercorn's settings, with the Date header formatted once a second instead of once per
    response (`format_date_time` costs ~2 µs, and its value changes only with the second)."""

    _date_second = -1
    _date = b""

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        if self.alt_svc_headers or self._quic_addresses:  # QUIC's, never set here
            return super().response_headers(protocol)
        headers = []
        if self.include_date_header:
            now = int(time.time())  # what `format_date_time` keeps of a time
            if now != self._date_second:
                self._date_second, self._date = now, format_date_time(now).encode("ascii")
            headers.append((b"date", self._date))
        if self.include_server_header:
            headers.append((b"server", f"hypercorn-{protocol}".encode("ascii")))
        return headers


def hypercorn_config(
    host: str,
    port: int,
    log_level: str = "info",
    graceful_timeout: float = 30.0,
    *,
    listen_fd: int | None = None,
    limits: ConnectionLimits | None = None,
) -> hypercorn.Config:
    """`listen_fd`: serve that already listening socket (a `--workers` child's) instead of binding."""
    limits = limits if limits is not None else ConnectionLimits()
    config = _Config()
    config.loglevel = log_level.upper()
    if listen_fd is not None:
        config.bind = [f"fd://{listen_fd}"]
    else:
        config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    # hypercorn's logger as is: its lines reach the root handler, formatted like ours, and only once.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = limits.keep_alive_timeout
    config.graceful_timeout = graceful_timeout
    return config


async def serve_app(
    app: ASGIApp,
    config: ServeConfig,
    *,
    listen_fd: int | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    graceful_timeout: float | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` (`http.app.create_app`'s, whose first layer is `ProtocolGuard`) with the limits
    of `config`; reports the bound addresses. `graceful_timeout`: hypercorn's own drain deadline
    (default ``--graceful-shutdown-timeout``)."""
    limits = ConnectionLimits.from_config(config)
    deadline = config.graceful_shutdown_timeout if graceful_timeout is None else graceful_timeout
    http = hypercorn_config(config.host, config.port, config.log_level, deadline, listen_fd=listen_fd, limits=limits)
    await serve_http(app, http, limits, shutdown_trigger=shutdown_trigger, task_status=task_status)


async def serve_http(
    app: ASGIApp,
    config: hypercorn.Config,
    limits: ConnectionLimits,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """`hypercorn.trio.serve(app, config)` with `limits` and a bounded accept loop (plain TCP only).

    Returns once `shutdown_trigger` returned and the connections drained (at most
    `config.graceful_timeout`), or raises what the app's lifespan raised.
    """
    if config.ssl_enabled or config.quic_bind:
        raise ValueError("trio-direct's HTTP server serves plain HTTP/1.1 only: terminate TLS in front of it")
    config.set_statsd_logger_class(StatsdLogger)
    fd_limit = raise_open_file_limit()
    gate = ConnectionGate(connection_cap(limits.max_connections, fd_limit))
    if limits.max_connections > fd_limit - fd_reserve(fd_limit):
        log.warning(
            "--max-connections %d leaves fewer than %d of the %d open files this process may have for anything "
            "else: accepts may fail (EMFILE) before the cap", limits.max_connections, fd_reserve(fd_limit), fd_limit,
        )  # fmt: skip

    wrapped = wrap_app(cast(ASGIFramework, app), config.wsgi_max_body_size, "asgi")
    lifespan_state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, lifespan_state)
    context = WorkerContext(None)

    async def serve_connection(stream: trio.SocketStream) -> None:
        state = ConnectionState(lifespan_state.copy())
        await GuardedConnection(wrapped, config, context, state, stream, limits).run()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners = []
            binds = []
            try:
                sockets = config.create_sockets()
            except OSError as error:
                raise ListenError(f"cannot listen on {', '.join(config.bind)}: {error.strerror or error}") from None
            log.info("at most %d client connections at once (open-file limit %d)", gate.cap, fd_limit)
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
                await config.log.info(f"Running on {binds[-1]} (CTRL + C to quit)")
            task_status.started(binds)
            try:
                async with trio.open_nursery(strict_exception_groups=True) as accepting:
                    if shutdown_trigger is not None:
                        accepting.start_soon(raise_shutdown, shutdown_trigger)
                    accepting.start_soon(raise_shutdown, context.terminate.wait)
                    for listener in listeners:
                        accepting.start_soon(accept_connections, listener, serve_connection, gate, connections)
            except BaseExceptionGroup as error:
                _, other_errors = error.split((ShutdownError, KeyboardInterrupt))
                if other_errors is not None:
                    raise other_errors from None
            finally:
                await context.terminated.set()  # idle connections close now; busy ones when done
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


async def accept_connections(
    listener: trio.SocketListener,
    serve_connection: Callable[[trio.SocketStream], Awaitable[None]],
    gate: ConnectionGate,
    connections: trio.Nursery,
) -> None:
    """Accept until cancelled (then close `listener`): serve each connection in `connections` while
    `gate` admits it, else refuse it."""
    async with listener:
        failures = Throttle(ACCEPT_LOG_INTERVAL)
        refusals = Throttle(REFUSAL_LOG_INTERVAL)
        failing = False
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in CAPACITY_ERRNOS:
                    raise
                name = errno.errorcode[error.errno]
                HTTP_ACCEPT_ERRORS.labels(name).inc()
                failing = True
                if (count := failures.occurred(trio.current_time())) is not None:
                    log.error(
                        "cannot accept connections: %s (%s), %d failed accepts since the last report; %d "
                        "connections open; retrying every %gs", name, os.strerror(error.errno), count, gate.open,
                        ACCEPT_RETRY,
                    )  # fmt: skip
                await trio.sleep(ACCEPT_RETRY)
                continue
            if failing:
                failing = False
                log.warning("accepting connections again (%d more failed accepts before)", failures.take_unreported())
            if not gate.admit():
                HTTP_CONNECTIONS_REFUSED.inc()
                if (count := refusals.occurred(trio.current_time())) is not None:
                    log.warning(
                        "refusing connections: %d are open, the limit (--max-connections); %d refused since the "
                        "last report", gate.open, count,
                    )  # fmt: skip
                await refuse(stream, gate.cap)
                continue
            connections.start_soon(partial(_serve_admitted, stream, serve_connection, gate))


async def refuse(stream: trio.SocketStream, cap: int) -> None:
    """Answer 503 (Retry-After: 1) without reading the request, and close."""
    with trio.move_on_after(_REFUSAL_SEND_TIMEOUT), suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(responses.too_many_connections(cap))
    await trio.aclose_forcefully(stream)


async def _serve_admitted(
    stream: trio.SocketStream, serve_connection: Callable[[trio.SocketStream], Awaitable[None]], gate: ConnectionGate
) -> None:
    HTTP_CONNECTIONS.inc()
    try:
        await serve_connection(stream)
    finally:
        gate.release()
        HTTP_CONNECTIONS.dec()
        await trio.aclose_forcefully(stream)


__all__ = ["ListenError", "accept_connections", "hypercorn_config", "refuse", "serve_app", "serve_http"]
