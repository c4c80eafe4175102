"""Log lines that name the request they are about.

`REQUEST_ID` is set once per request (the id the client sees, e.g. ``chatcmpl-…``); trio hands a
task's context to the tasks it starts, so every line logged by the request's engine calls, Abort
and retries carries it without passing it around.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def configure_logging(level: str, stream=None) -> None:  # noqa: ANN001 - a text stream
    """Root logging at `level`, each line with the request id (``-`` outside requests)."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
