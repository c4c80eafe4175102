"""`hypercorn -k trio trio_direct.app:app`: the frontend as a plain ASGI app, configured from the
``TRIO_DIRECT_*`` environment (see `trio_direct.config`), logging as `trio-direct serve` does.

The frontend's tasks (engine fleet, built-in mocks) run in the ASGI lifespan, started before the
first request is served; requests that arrive earlier get 503 with an OpenAI error.
"""

from __future__ import annotations

import trio

from trio_direct.config import config_from_env
from trio_direct.core.frontend import Frontend
from trio_direct.frontend.runtime import run_frontend
from trio_direct.http.app import tenants_settings
from trio_direct.logs import configure_logging
from trio_direct.service import build_app
from trio_direct.tenants.service import Tenants

config = config_from_env()
configure_logging(config.log_level, log_format=config.log_format, access_log=config.access_log)
tenants = Tenants.load(tenants_settings(config))
_frontend: Frontend | None = None


def _current() -> Frontend | None:
    return _frontend


async def _start_frontend(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    global _frontend

    async with trio.open_nursery() as nursery:
        await nursery.start(tenants.run)
        frontend = await nursery.start(run_frontend, config)
        tenants.share_counters(frontend.state)
        _frontend = frontend
        task_status.started()


app = build_app(_current, config, start=_start_frontend, tenants=tenants)
