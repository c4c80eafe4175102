"""Connection limits and the plain decisions behind them: read deadlines, the connection cap, log throttling.

A connection is read under one of four deadlines, by where its current request is (`ReadPhase`):
its request head must arrive within `header_read_timeout` of the connection's accept (a new
connection) or of the head's first byte (a kept-alive one); a request body may pause at most
`body_read_timeout` between bytes and must be whole within `body_total_timeout` of its head (a body
trickled a byte just under every pause limit still ends); between requests the connection may idle for the keep-alive
timeout (hypercorn's own idle task enforces that one); and once the request is read, reads only
watch for the client going away, however long the response streams.
"""

from __future__ import annotations

import enum
import math
import resource
from dataclasses import dataclass

import h11

from trio_direct.config import ServeConfig

#: Open files a frontend needs besides client connections (engine channels, ZMQ, logs, the event
#: loop's own): the connection cap leaves this many, or a tenth of the limit if that is more.
FD_RESERVE = 64
#: The most open files asked for when the hard limit is unlimited (Linux's default `fs.nr_open`).
_UNLIMITED_FDS = 1 << 20


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a client may take, and how many may be connected (seconds; `math.inf` = no limit)."""

    header_read_timeout: float = 10.0
    body_read_timeout: float = 30.0
    keep_alive_timeout: float = 75.0
    #: Open client connections per process; 0 = derived from the open-file limit (`connection_cap`).
    max_connections: int = 0
    body_total_timeout: float = 120.0
    #: How long one response write may make no progress before the client counts as gone.
    client_write_timeout: float = 30.0

    @classmethod
    def from_config(cls, config: ServeConfig) -> ConnectionLimits:
        """`--header-read-timeout` and friends; a timeout of 0 (or less) means none."""
        return cls(
            header_read_timeout=_seconds(config.header_read_timeout),
            body_read_timeout=_seconds(config.body_read_timeout),
            keep_alive_timeout=_seconds(config.keep_alive_timeout),
            max_connections=max(0, config.max_connections),
            body_total_timeout=_seconds(config.body_total_timeout),
            client_write_timeout=_seconds(config.client_write_timeout),
        )


def _seconds(value: float) -> float:
    return value if value > 0 else math.inf


class ReadPhase(enum.Enum):
    IDLE = "idle"  #: between requests: the keep-alive timeout applies
    HEAD = "head"  #: a request head is expected or partly received
    BODY = "body"  #: the request body is being received
    RESPONSE = "response"  #: the request is read; reading only detects a disconnect


class ReadDeadlines:
    """The deadline of a connection's next read, from the client's h11 state (`their_state`).

    Called before every read. `head_buffered`: h11 holds bytes of a request head it cannot parse
    yet. A new connection is in its first head from its accept on, so a client that connects and
    says nothing is timed like one that trickles its head.
    """

    def __init__(self, limits: ConnectionLimits, accepted_at: float) -> None:
        self._limits = limits
        self._head_since: float | None = accepted_at
        self._body_since: float | None = None

    def next_read(self, their_state: object, head_buffered: bool, now: float) -> tuple[ReadPhase, float]:
        """(phase, deadline) for the read about to start at `now`."""
        if their_state is h11.IDLE:
            if self._head_since is None and not head_buffered:
                return ReadPhase.IDLE, math.inf
            if self._head_since is None:
                self._head_since = now
            return ReadPhase.HEAD, self._head_since + self._limits.header_read_timeout
        self._head_since = None
        if their_state is h11.SEND_BODY:
            if self._body_since is None:
                self._body_since = now
            limits = self._limits
            return ReadPhase.BODY, min(now + limits.body_read_timeout, self._body_since + limits.body_total_timeout)
        self._body_since = None
        return ReadPhase.RESPONSE, math.inf


def connection_cap(max_connections: int, fd_limit: int) -> int:
    """Open client connections allowed: `max_connections`, or if 0 the open-file limit less a reserve."""
    if max_connections > 0:
        return max_connections
    return max(1, fd_limit - fd_reserve(fd_limit))


def fd_reserve(fd_limit: int) -> int:
    """Open files kept free of client connections: `FD_RESERVE` or a tenth, at most half the limit."""
    return min(max(FD_RESERVE, fd_limit // 10), fd_limit // 2)


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (as Go's runtime does); returns it.

    The common soft default, 1,024, would cap a streaming frontend at about 900 clients although
    the hard limit allows far more; trio polls with epoll, so no `select()` ceiling applies.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_FDS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # e.g. above fs.nr_open: keep the soft limit
    return _UNLIMITED_FDS if soft == resource.RLIM_INFINITY else soft


class Throttle:
    """Reports a recurring condition at its first occurrence, then at most once per `interval`.

    An attacker can make some conditions (a failing `accept`, refused connections) happen thousands
    of times a second; one line per interval with a count keeps the log readable and small.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._reported_at = -math.inf
        self._unreported = 0

    def occurred(self, now: float) -> int | None:
        """Count one occurrence; returns how many to report (this one included), or None: not yet."""
        self._unreported += 1
        if now - self._reported_at < self.interval:
            return None
        count, self._unreported, self._reported_at = self._unreported, 0, now
        return count

    def take_unreported(self) -> int:
        """The occurrences not reported yet (reset to 0): for a closing "N more since" line."""
        count, self._unreported = self._unreported, 0
        return count


class ConnectionGate:
    """Counts open client connections against the cap."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open = 0

    def admit(self) -> bool:
        """Take a place for a new connection; False: the cap is reached, refuse it."""
        if self.open >= self.cap:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1
