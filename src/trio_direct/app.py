"""`hypercorn -k trio trio_direct.app:app`: the frontend as a plain ASGI app, configured from the
``TRIO_DIRECT_*`` environment (see `trio_direct.config`).

The frontend's tasks (engine fleet, built-in mocks) run in quart-trio's lifespan nursery, started
before the first request is served; requests that arrive earlier get 503 with an OpenAI error.
"""

from __future__ import annotations

from trio_direct.config import config_from_env
from trio_direct.frontend.app import create_app
from trio_direct.frontend.runtime import Frontend, run_frontend

config = config_from_env()
_frontend: Frontend | None = None


def _current() -> Frontend | None:
    return _frontend


app = create_app(
    _current,
    max_body_bytes=config.max_body_bytes,
    api_key=config.api_key,
    max_concurrent=config.max_concurrent_requests,
)


@app.before_serving
async def _start_frontend() -> None:
    global _frontend
    _frontend = await app.nursery.start(run_frontend, config)
