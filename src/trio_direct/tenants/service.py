"""The tenants of a running server (trio shell): credentials, limits, metrics labels, and the file
watch that keeps them current.

``--tenants-file`` is read at start (a malformed file stops the start, naming what is wrong), then
watched: every `WATCH_INTERVAL_S` seconds its identity (inode, modification time, size) is
checked off the event loop, and a change is read and swapped in whole. That sees a file edited in
place, one renamed over the old (how editors save, and how Kubernetes swaps a mounted ConfigMap's
symlink), and one deleted then written again. A file that cannot be read or parsed keeps the last
good tenants, and says why once. Nothing else moves: requests in flight keep the tenant they were
admitted as, and the counters (and so what each tenant has used this minute) carry over.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import trio

from trio_direct.tenants.access import MetricLabels, TenantAccess
from trio_direct.tenants.counters import Counters, LocalCounters
from trio_direct.tenants.directory import TenantDirectory, TenantFileError, parse_tenants
from trio_direct.tenants.jwt_tokens import JwksCache, JwtVerifier
from trio_direct.tenants.limiter import TenantLimiter

__all__ = ["Tenants", "TenantsSettings"]

log = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0

_Stamp = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class TenantsSettings:
    """What the server's flags say about tenants."""

    tenants_file: str | None = None
    api_key: str | None = None
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_tenant_claim: str = "sub"


@dataclass(eq=False)
class Tenants:
    access: TenantAccess
    limiter: TenantLimiter
    labels: MetricLabels = field(default_factory=MetricLabels)
    path: Path | None = None
    _stamp: _Stamp | None = None
    _failing: str | None = None

    @classmethod
    def load(cls, settings: TenantsSettings, counters: Counters | None = None) -> Tenants:
        """Read the tenants file now (`TenantFileError` when it is unusable: the server does not start)."""
        directory = stamp = None
        path = Path(settings.tenants_file) if settings.tenants_file else None
        if path is not None:
            try:
                stamp, text = _read(path)
            except (OSError, UnicodeDecodeError) as error:
                raise TenantFileError(f"cannot read {path}: {_reason(error)}") from None
            try:
                directory = parse_tenants(text)
            except TenantFileError as error:
                raise TenantFileError(f"{path}: {error}") from None
        verifier = None
        if settings.jwt_jwks_url:
            verifier = JwtVerifier(
                JwksCache(settings.jwt_jwks_url),
                issuer=settings.jwt_issuer or None,
                audience=settings.jwt_audience or None,
                tenant_claim=settings.jwt_tenant_claim,
            )
        access = TenantAccess(directory, api_key=settings.api_key.encode() if settings.api_key else None, jwt=verifier)
        return cls(
            access, TenantLimiter(counters if counters is not None else LocalCounters()), path=path, _stamp=stamp
        )

    def share_counters(self, counters: Counters) -> None:
        """Count the limits in `counters` from now on: the frontend's state store once it is open, so
        every worker and replica that shares the store (`--state-store`) shares the counts. Until
        then (the moments before the frontend is up, when requests are refused anyway) they are
        counted in this process."""
        self.limiter.counters = counters

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch the JWKS once, then watch the tenants file until cancelled."""
        if self.access.jwt is not None:
            await self.access.jwt.keys.refresh()
        task_status.started()
        if self.path is None:
            return
        while True:
            await trio.sleep(WATCH_INTERVAL_S)
            await self.reload_if_changed()

    async def reload_if_changed(self) -> bool:
        """Read the file again if it changed; True when new tenants were swapped in."""
        assert self.path is not None
        path, known = self.path, self._stamp
        try:
            stamp, text = await trio.to_thread.run_sync(_read_if_changed, path, known)
        except (OSError, UnicodeDecodeError) as error:
            self._failed(f"cannot read {path}: {_reason(error)}")
            return False
        if text is None:
            return False
        try:
            directory = parse_tenants(text)
        except TenantFileError as error:
            self._stamp = stamp  # not again until it changes
            self._failed(f"{path} is malformed: {error}")
            return False
        self._stamp = stamp
        self.access.replace(directory)
        self._failing = None
        log.info("tenants file %s reloaded: %d tenant(s)", path, len(directory))
        return True

    def _failed(self, reason: str) -> None:
        if reason != self._failing:
            log.warning("%s; keeping the last good tenants", reason)
        self._failing = reason

    @property
    def directory(self) -> TenantDirectory | None:
        return self.access.directory


def _identity(path: Path) -> _Stamp:
    status = os.stat(path)  # follows symlinks: a ConfigMap's swapped `..data` link is a new file
    return (status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size)


def _read(path: Path) -> tuple[_Stamp, str]:
    stamp = _identity(path)
    return stamp, path.read_text(encoding="utf-8")


def _read_if_changed(path: Path, known: _Stamp | None) -> tuple[_Stamp, str | None]:
    stamp = _identity(path)
    if stamp == known:
        return stamp, None
    return _read(path)


def _reason(error: BaseException) -> str:
    return error.strerror if isinstance(error, OSError) and error.strerror else str(error)
