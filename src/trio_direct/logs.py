"""Log lines that name the request they are about, in one format whichever server runs the app.

`REQUEST_ID` is set once per request (the id the client sees, e.g. ``chatcmpl-…``); trio hands a
task's context to the tasks it starts, so every line logged by the request's engine calls, Abort
and retries carries it without passing it around.

`configure_logging` is called by `trio-direct serve`/`mock-engine` and by ``trio_direct.app`` (for
``hypercorn -k trio trio_direct.app:app``), so both entry points log alike.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from typing import TextIO

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="-")

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

#: The server's own error log. The hypercorn command line gives it a console handler of its own.
HYPERCORN_ERROR_LOGGER = "hypercorn.error"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class OwnDebugOnly(logging.Filter):
    """At ``debug``, only trio-direct's debug lines: the libraries under it (hpack, h2, asyncio)
    log every header and frame at debug, which would bury the lines a user asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.INFO or record.name == "trio_direct" or record.name.startswith("trio_direct.")


class JoinRootHandler(logging.Filter):
    """On hypercorn's error logger: its lines go to the root handler, in `FORMAT`, once each.

    The hypercorn command line gives ``hypercorn.error`` a console handler with hypercorn's own
    format when it first logs, after the app was imported, and lets it propagate too: every line
    would show twice, once unformatted. This filter runs before that logger's handlers and drops
    such console handlers (a ``--error-logfile PATH`` handler stays), so the record reaches only
    the root handler.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        logger = logging.getLogger(record.name)
        console = [handler for handler in logger.handlers if _is_console(handler)]
        for handler in console:
            logger.removeHandler(handler)
        if console:
            logger.propagate = True
        return True


def _is_console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler and handler.stream in (
        sys.stderr,
        sys.stdout,
        sys.__stderr__,
        sys.__stdout__,
    )


class JsonFormatter(logging.Formatter):
    """`--log-format json`: one JSON object per line (time, level, logger, request_id, message, and
    an access-log record's fields as keys of their own), for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
            "message": record.getMessage(),
        }
        worker = getattr(record, "worker", None)
        if worker is not None:
            line["worker"] = worker
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            line.update(access)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(
    level: str, stream: TextIO | None = None, *, log_format: str = "text", access_log: bool = True
) -> None:
    """Root logging at `level` to `stream` (stderr), each line in `FORMAT` with the request id
    (``-`` outside requests), or as JSON (`JsonFormatter`, ``log_format="json"``); `access_log`
    False silences the access log (``--no-access-log``).

    Python warnings become log lines too, and hypercorn's error log joins the same handler
    (`JoinRootHandler`); hypercorn's access log, when asked for, stays as hypercorn writes it.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.addFilter(OwnDebugOnly())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(FORMAT))
    root = logging.getLogger()
    logging.getLogger("trio_direct.access").disabled = not access_log
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    server = logging.getLogger(HYPERCORN_ERROR_LOGGER)
    if not any(isinstance(f, JoinRootHandler) for f in server.filters):
        server.addFilter(JoinRootHandler())
