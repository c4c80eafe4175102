"""The sources of engines that are asked again every ``--discovery-interval``: DNS names and a file.

- `DnsSource` (``--engine-dns NAME:PORT``): every A and AAAA record of NAME is an engine at PORT, the
  way a Kubernetes headless Service lists its ready pods.
- `SrvSource` (``--engine-dns-srv NAME``): every SRV record is an engine at its target's addresses
  and its port (Kubernetes named ports, Consul). Priority and weight are not used: routing decides.
- `FileSource` (``--engine-file PATH``): the engines the file lists (`engine_list`), re-read when its
  modification time or size changes.

Each `lookup` returns the engines named now, or None when the lookup failed (the `SourceState` then
keeps what it had). DNS goes through dnspython's resolver in a worker thread (``--discovery-nameserver``
picks the server; without it A/AAAA records come from the system resolver, as every other program on
the host resolves, and SRV records from the servers in ``/etc/resolv.conf``), so no asyncio is
involved. `run_source` asks one source every interval and hands its answers to the `Membership`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from trio_direct.fleet.discovery import EngineSpec, SourceState
from trio_direct.fleet.engine_list import EngineListError, parse_engine_list
from trio_direct.fleet.membership import Membership

if TYPE_CHECKING:
    import dns.resolver

__all__ = [
    "DnsResolver",
    "DnsSource",
    "EngineSource",
    "FileSource",
    "SrvSource",
    "parse_dns_target",
    "parse_nameserver",
    "run_source",
]

log = logging.getLogger(__name__)


class EngineSource(Protocol):
    """One source asked every interval."""

    @property
    def name(self) -> str: ...

    def state(self, grace: float) -> SourceState:
        """The sans-IO state of its answers (grace period, and whether an empty answer counts)."""

    async def lookup(self) -> list[EngineSpec] | None:
        """The engines it names now; None when the lookup failed."""


def parse_dns_target(text: str) -> tuple[str, int]:
    """``NAME:PORT`` of ``--engine-dns`` (`ValueError` if malformed)."""
    name, sep, port = text.strip().rpartition(":")
    if not sep or not name or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"--engine-dns {text!r}: write NAME:PORT (for example sglang.ns.svc.cluster.local:30001)")
    return name.rstrip("."), int(port)


def parse_nameserver(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` of ``--discovery-nameserver`` (port 53 by default; IPv6 in brackets)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":") or "53"
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, "53"
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"--discovery-nameserver {text!r}: write HOST or HOST:PORT")
    return host, int(port)


def engine_url(address: str, port: int) -> str:
    return f"grpc://[{address}]:{port}" if ":" in address else f"grpc://{address}:{port}"


class DnsResolver:
    """Address and service lookups, through dnspython in a worker thread (never the event loop).

    Answers are sorted, so that the same records give the same engines in the same order.
    dnspython is imported at the first lookup, in that thread: a frontend with no DNS source
    does not pay its ~60 ms import at every start.
    """

    def __init__(self, nameserver: tuple[str, int] | None = None, *, timeout: float = 5.0) -> None:
        self.nameserver = nameserver
        self.timeout = timeout
        self._resolver: dns.resolver.Resolver | None = None

    def _dnspython(self) -> dns.resolver.Resolver:
        """Built on first use, in the worker thread (reading ``/etc/resolv.conf`` or resolving the
        nameserver's host name blocks)."""
        if self._resolver is None:
            import dns.resolver

            resolver = dns.resolver.Resolver(configure=self.nameserver is None)
            if self.nameserver is not None:
                host, port = self.nameserver
                resolver.nameservers = [_ip_of(host)]
                resolver.port = port
            resolver.lifetime = self.timeout
            self._resolver = resolver
        return self._resolver

    async def addresses(self, name: str) -> list[str] | None:
        """The A and AAAA addresses of `name`; [] if it has none (NXDOMAIN); None if the lookup failed."""
        if self.nameserver is None:
            return await _system_addresses(name)
        return await trio.to_thread.run_sync(self._addresses, name, abandon_on_cancel=True)

    async def services(self, name: str) -> list[tuple[str, int]] | None:
        """``(address, port)`` of every SRV record of `name`, its target resolved; [] if none; None
        if any lookup failed (a partial answer must not make engines leave)."""
        return await trio.to_thread.run_sync(self._services, name, abandon_on_cancel=True)

    def _addresses(self, name: str) -> list[str] | None:
        import dns.exception
        import dns.resolver

        found: list[str] = []
        for rdtype in ("A", "AAAA"):
            try:
                answer = self._dnspython().resolve(name, rdtype, search=True)
            except dns.resolver.NXDOMAIN:
                return []
            except dns.resolver.NoAnswer:
                continue
            except (dns.exception.DNSException, OSError, ValueError) as error:
                _note_failure(name, error)
                return None
            found.extend(record.address for record in answer)
        return sorted(set(found))

    def _services(self, name: str) -> list[tuple[str, int]] | None:
        import dns.exception
        import dns.resolver

        try:
            answer = self._dnspython().resolve(name, "SRV", search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except (dns.exception.DNSException, OSError, ValueError) as error:
            _note_failure(name, error)
            return None
        services: set[tuple[str, int]] = set()
        for record in answer:
            target = record.target.to_text(omit_final_dot=True)
            addresses = [target] if _is_ip(target) else self._addresses(target)
            if addresses is None:
                return None
            services.update((address, int(record.port)) for address in addresses)
        return sorted(services)


async def _system_addresses(name: str) -> list[str] | None:
    try:
        infos = await trio.socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        _note_failure(name, error)
        return None
    return sorted({str(info[4][0]) for info in infos})


def _note_failure(name: str, error: BaseException) -> None:
    log.debug("DNS lookup of %s failed: %s", name, error)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _ip_of(host: str) -> str:
    if _is_ip(host):
        return host
    return str(socket.getaddrinfo(host, 53, type=socket.SOCK_DGRAM)[0][4][0])


class _FailureLog:
    """Log a source's failures once per distinct reason, and its recovery."""

    __slots__ = ("_last", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._last = ""

    def failed(self, reason: str, consequence: str) -> None:
        if reason != self._last:
            log.warning("engine source %s: %s; %s", self._name, reason, consequence)
        self._last = reason

    def succeeded(self) -> None:
        if self._last:
            log.info("engine source %s answers again", self._name)
        self._last = ""

    def dns_answer(self, answer: list | None) -> None:
        if answer is None:
            self.failed("the lookup failed", "its engines are kept")
        elif not answer:
            self.failed("no records", "its engines are kept while they pass their health checks")
        else:
            self.succeeded()


class DnsSource:
    """``--engine-dns NAME:PORT``."""

    def __init__(self, host: str, port: int, resolver: DnsResolver) -> None:
        self.host = host
        self.port = port
        self.resolver = resolver
        self._log = _FailureLog(self.name)

    @property
    def name(self) -> str:
        return f"dns:{self.host}:{self.port}"

    def state(self, grace: float) -> SourceState:
        return SourceState(self.name, grace=grace, keep_when_empty=True)

    async def lookup(self) -> list[EngineSpec] | None:
        addresses = await self.resolver.addresses(self.host)
        self._log.dns_answer(addresses)
        if addresses is None:
            return None
        return [EngineSpec(engine_url(address, self.port)) for address in addresses]


class SrvSource:
    """``--engine-dns-srv NAME``."""

    def __init__(self, service: str, resolver: DnsResolver) -> None:
        self.service = service.rstrip(".")
        self.resolver = resolver
        self._log = _FailureLog(self.name)

    @property
    def name(self) -> str:
        return f"dns-srv:{self.service}"

    def state(self, grace: float) -> SourceState:
        return SourceState(self.name, grace=grace, keep_when_empty=True)

    async def lookup(self) -> list[EngineSpec] | None:
        services = await self.resolver.services(self.service)
        self._log.dns_answer(services)
        if services is None:
            return None
        return [EngineSpec(engine_url(address, port)) for address, port in services]


class FileSource:
    """``--engine-file PATH``: re-read when its modification time or size changes; a file that
    cannot be read or parsed keeps the last good list (and says why, once)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._last_good: list[EngineSpec] | None = None
        self._log = _FailureLog(self.name)

    @property
    def name(self) -> str:
        return f"file:{self.path}"

    def state(self, grace: float) -> SourceState:
        # An empty list in a file is the operator's word: no engines.
        return SourceState(self.name, grace=grace, keep_when_empty=False)

    async def lookup(self) -> list[EngineSpec] | None:
        try:
            stamp, text = await trio.to_thread.run_sync(self._read_if_changed)
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            self._log.failed(f"cannot read {self.path}: {reason}", "keeping the last good list")
            return None
        if text is None:  # unchanged
            return self._last_good
        self._stamp = stamp
        try:
            specs = parse_engine_list(text)
        except EngineListError as error:
            self._log.failed(f"{self.path} is malformed: {error}", "keeping the last good list")
            return None
        self._log.succeeded()
        self._last_good = specs
        return specs

    def _read_if_changed(self) -> tuple[tuple[int, int], str | None]:
        status = os.stat(self.path)
        stamp = (status.st_mtime_ns, status.st_size)
        if stamp == self._stamp:
            return stamp, None
        return stamp, self.path.read_text(encoding="utf-8")


async def run_source(
    source: EngineSource,
    membership: Membership,
    interval: float,
    *,
    clock: Callable[[], float] = trio.current_time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ask `source` every `interval` seconds and apply its answers; started after the first one."""
    started = False
    while True:
        began = trio.current_time()
        answer = await source.lookup()
        membership.observe(source.name, answer, clock())
        if not started:
            started = True
            task_status.started()
        await trio.sleep_until(began + interval)
