"""One access-log line per HTTP request, as operators grep and log collectors parse them.

`AccessRecord` holds what the line says; its fields are written in declaration order, so a new
field (a tenant, say) is one more attribute here and shows up in the text line (``name=value``)
and in the JSON line (`--log-format json`) alike. The line is logged on ``trio_direct.access`` at
info; probes and scrapes (`/live`, `/health`, `/metrics`) at debug, so a liveness probe every few
seconds does not bury the requests. ``--no-access-log`` turns the logger off.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

__all__ = ["ACCESS_LOGGER", "QUIET_PATHS", "AccessRecord", "log_access"]

ACCESS_LOGGER = "trio_direct.access"
#: Paths polled by machines: logged at debug only.
QUIET_PATHS = frozenset({"/live", "/health", "/metrics"})

log = logging.getLogger(ACCESS_LOGGER)


@dataclass(slots=True)
class AccessRecord:
    """One request as the access log shows it (None: not known for this request)."""

    method: str
    path: str
    status: int
    duration_ms: float
    request_id: str | None = None
    model: str | None = None
    engine: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tenant: str | None = None

    def text(self) -> str:
        """``METHOD PATH STATUS DURATIONms`` then ``name=value`` for every other known field."""
        head = f"{self.method} {self.path} {self.status} {self.duration_ms:.1f}ms"
        rest = [f"{name}={_text(value)}" for name, value in self.extra().items() if value not in (None, "")]
        return " ".join([head, *rest])

    def extra(self) -> dict[str, object]:
        """Every field after the first four, in declaration order."""
        fields = asdict(self)
        for name in ("method", "path", "status", "duration_ms"):
            del fields[name]
        return fields


def _text(value: object) -> str:
    text = str(value)
    return '"' + text.replace('"', '\\"') + '"' if " " in text or not text else text


def log_access(record: AccessRecord) -> None:
    """Log `record` (the JSON formatter, `logs.JsonFormatter`, writes its fields as keys)."""
    level = logging.DEBUG if record.path in QUIET_PATHS else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "%s", record.text(), extra={"access": {**asdict(record)}})
