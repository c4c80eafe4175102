"""The composition root: the one place that wires the service together, and `trio-direct serve`.

Everything below is built here and handed down: the route table (the surfaces' rows,
`surfaces.routes.ROUTES`) goes to the HTTP layer (`http.app.create_app`, which serves whatever table
it is given); the fleet, the model pools and their lifecycle come from `frontend.runtime.run_frontend`;
the tenants from their settings. `build_app` is the HTTP app both entry points serve:
`trio-direct serve` (`serve`, below) and `hypercorn trio_direct.app:app`.

`serve` runs hypercorn's trio worker serving the app, beside the frontend's own tasks.

hypercorn is started from code inside the engine transport's nursery (`open_transport`), where every
engine connection's task runs. trio's sockets set TCP_NODELAY on accepted connections, which avoids the
~40 ms delayed-ACK floor peers show with keep-alive SSE clients.

Shutdown (`Shutdown.drain`): readiness turns unready, hypercorn stops accepting connections, and
in-flight requests get ``--graceful-shutdown-timeout`` to finish. At that deadline, or at once on
`Shutdown.cut` (a second signal), every open response is ended by its surface's own error event
(a stream gets an OpenAI error event and ``[DONE]``) and its engine requests are aborted; hypercorn's
own graceful timeout is set later than ours, so it never cuts a stream mid-air.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from trio_direct.config import ServeConfig
from trio_direct.core.frontend import Frontend
from trio_direct.engine.transport import open_transport
from trio_direct.fleet.fleet import FleetError
from trio_direct.frontend.runtime import run_frontend
from trio_direct.http.app import App, StartFrontend, create_app, tenants_settings
from trio_direct.http.server import serve_app
from trio_direct.surfaces.routes import ROUTES
from trio_direct.tenants.directory import TenantFileError
from trio_direct.tenants.service import Tenants

log = logging.getLogger(__name__)

#: How long after the cut hypercorn still waits for responses to write their error events.
CUT_GRACE = 5.0


def build_app(
    get_frontend: Callable[[], Frontend | None],
    config: ServeConfig,
    *,
    start: StartFrontend | None = None,
    tenants: Tenants | None = None,
) -> App:
    """The HTTP app serving every surface's route (`surfaces.routes.ROUTES`) from the frontend that
    `get_frontend` returns (None while it starts: 503s). `start`, when given, runs the frontend for
    the app's lifespan (the hypercorn entry)."""
    return create_app(get_frontend, config, routes=ROUTES, start=start, tenants=tenants)


@dataclass(slots=True)
class Shutdown:
    """How the server is asked to stop: `drain` (first signal), then `cut` (second signal)."""

    drain: trio.Event = field(default_factory=trio.Event)
    cut: trio.Event = field(default_factory=trio.Event)


async def serve(
    config: ServeConfig,
    *,
    shutdown: Shutdown | None = None,
    listen_fd: int | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the frontend and its HTTP server; reports the bound addresses.

    Runs until cancelled, or until `shutdown` drains it (see the module docstring). `listen_fd`: an
    inherited listening socket to serve instead of `--host/--port` (see `frontend/supervisor.py`).
    """
    try:
        tenants = Tenants.load(tenants_settings(config))
    except TenantFileError as error:
        raise FleetError(f"--tenants-file: {error}") from None
    async with open_transport(), trio.open_nursery() as nursery:
        # The port listens before any engine is probed: `/live` answers at once, `/health` and the
        # model routes answer 503 with Retry-After until the frontend is up (an orchestrator's
        # liveness probe never kills a frontend that waits for its engines). A port that cannot be
        # bound fails here, before built-in mock engines start.
        started: list[Frontend] = []
        await nursery.start(tenants.run)  # the JWKS fetched, the tenants file watched
        app = build_app(lambda: started[0] if started else None, config, tenants=tenants)
        stopping = trio.Event()

        async def http_server(*, task_status: trio.TaskStatus[list[str]]) -> None:
            # hypercorn's own deadline comes after ours: by then every response has ended itself.
            await serve_app(
                app,
                config,
                listen_fd=listen_fd,
                shutdown_trigger=stopping.wait,
                graceful_timeout=config.graceful_shutdown_timeout + config.abort_timeout + CUT_GRACE,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()  # drained: the frontend's own tasks stop too

        binds = await nursery.start(http_server)
        log.info(
            "listening on %s; /live answers now, /health and the model routes once an engine is up", ", ".join(binds)
        )
        frontend: Frontend = await nursery.start(run_frontend, config)
        tenants.share_counters(frontend.state)
        started.append(frontend)
        names = ", ".join(repr(p.name) for p in frontend.pools())
        if names:
            log.info("OpenAI API for model(s) %s on %s", names, ", ".join(binds))
        else:
            log.info("OpenAI API on %s: no model is served until an engine joins", ", ".join(binds))
        task_status.started(binds)
        if shutdown is not None:
            await shutdown.drain.wait()
            frontend.draining = True
            stopping.set()
            log.info("shutting down: no new connections; in-flight requests have %gs", config.graceful_shutdown_timeout)
            with trio.move_on_after(config.graceful_shutdown_timeout):
                await shutdown.cut.wait()
            if frontend.cutter:
                reason = "second signal" if shutdown.cut.is_set() else "drain deadline"
                log.warning("%s: ending %d open response(s) with an error", reason, len(frontend.cutter))
                frontend.cutter.cut(reason)
