"""`trio-direct serve`: hypercorn's trio worker serving the app, beside the frontend's own tasks.

hypercorn is started from code inside the trio-asyncio loop, so every request task inherits the loop
that engine calls need (python-stack.md §4.2). trio's sockets set TCP_NODELAY on accepted
connections, which avoids the ~40 ms delayed-ACK floor peers show with keep-alive SSE clients.
"""

from __future__ import annotations

import logging

import trio

from trio_direct.config import ServeConfig
from trio_direct.engine.transport import open_asyncio_loop
from trio_direct.frontend.app import create_app
from trio_direct.frontend.runtime import run_frontend
from trio_direct.http.server import serve_app

log = logging.getLogger(__name__)


async def serve(
    config: ServeConfig,
    *,
    shutdown: trio.Event | None = None,
    listen_fd: int | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the frontend and its HTTP server; reports the bound addresses.

    Runs until cancelled, or until `shutdown` is set: then it stops accepting connections, gives
    in-flight requests up to `--graceful-shutdown-timeout` to finish, cancels what is left (each
    engine request then ends in an Abort) and returns. `listen_fd`: an inherited listening socket
    to serve instead of `--host/--port` (see `frontend/supervisor.py`).
    """
    async with open_asyncio_loop(), trio.open_nursery() as nursery:
        frontend = await nursery.start(run_frontend, config)
        app = create_app(
            lambda: frontend,
            max_body_bytes=config.max_body_bytes,
            api_key=config.api_key,
            max_concurrent=config.max_concurrent_requests,
        )
        trigger = shutdown.wait if shutdown is not None else None

        async def http_server(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_app(app, config, listen_fd=listen_fd, shutdown_trigger=trigger, task_status=task_status)
            nursery.cancel_scope.cancel()  # drained: the frontend's own tasks stop too

        binds = await nursery.start(http_server)
        log.info("OpenAI API for model %r on %s", frontend.model_name, ", ".join(binds))
        task_status.started(binds)
        if shutdown is not None:
            await shutdown.wait()
            log.info("shutting down: no new connections; in-flight requests have %gs", config.graceful_shutdown_timeout)
