"""Typed engine failures.

Every way an engine call can fail becomes one of these, so callers catch precisely and the HTTP layer
maps each to one outcome (502, 503, 400, ...). `message` is the engine's own text; `engine` names the
engine for logs and is never shown to API clients.
"""

from __future__ import annotations


class EngineError(Exception):
    """An engine call failed. `status` is the gRPC status name (or a transport condition)."""

    status = "UNKNOWN"

    def __init__(self, message: str = "", *, engine: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.engine = engine

    def __str__(self) -> str:
        where = f" [{self.engine}]" if self.engine else ""
        return f"{self.status}{where}: {self.message}" if self.message else f"{self.status}{where}"


class EngineUnavailable(EngineError):
    """The engine cannot be reached: connection refused or reset, connect timeout, UNAVAILABLE."""

    status = "UNAVAILABLE"


class EngineDeadlineExceeded(EngineError):
    """The call's deadline passed (client side or the engine's per-chunk timeout)."""

    status = "DEADLINE_EXCEEDED"


class EngineStalled(EngineDeadlineExceeded):
    """The engine sent nothing for ``--stream-idle-timeout``, on this call or any other: hung."""


class EngineResourceExhausted(EngineError):
    """The engine refused for capacity (queue full, rate limit)."""

    status = "RESOURCE_EXHAUSTED"


class EngineInvalidArgument(EngineError):
    """The engine rejected the request's shape (validation, out-of-range values)."""

    status = "INVALID_ARGUMENT"


class EngineInternal(EngineError):
    """Generic engine-side failure (SGLang reports prompt-too-long and similar as INTERNAL)."""

    status = "INTERNAL"


class EngineUnimplemented(EngineError):
    """The engine does not serve this RPC (older release, other API)."""

    status = "UNIMPLEMENTED"


class EngineCancelled(EngineError):
    """The engine ended the stream as cancelled, e.g. "Request aborted: <rid>" after an Abort."""

    status = "CANCELLED"


_BY_STATUS: dict[str, type[EngineError]] = {
    "UNAVAILABLE": EngineUnavailable,
    "DEADLINE_EXCEEDED": EngineDeadlineExceeded,
    "RESOURCE_EXHAUSTED": EngineResourceExhausted,
    "INVALID_ARGUMENT": EngineInvalidArgument,
    "OUT_OF_RANGE": EngineInvalidArgument,
    "FAILED_PRECONDITION": EngineInvalidArgument,
    "NOT_FOUND": EngineInvalidArgument,
    "INTERNAL": EngineInternal,
    "UNKNOWN": EngineInternal,
    "DATA_LOSS": EngineInternal,
    "UNIMPLEMENTED": EngineUnimplemented,
    "CANCELLED": EngineCancelled,
}


def error_for_status(status: str, message: str, *, engine: str = "") -> EngineError:
    """Build the typed error for a gRPC status name."""
    return _BY_STATUS.get(status, EngineInternal)(message, engine=engine)


class StreamWakeup(Exception):
    """A reader woken with nothing new (to send an SSE keep-alive): read again. Not an `EngineError`."""
