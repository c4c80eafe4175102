"""Real Redis and PostgreSQL servers for the state store's tests, started and stopped by the suite.

Each runs from its Debian package's binaries (`scripts/install-test-servers.sh` installs them) on an
ephemeral loopback port, with its data in a temporary directory, and can be stopped and started
again on the same port and data (the restart scenarios). `find_*` return None when the binaries are
absent: the tests then skip, saying so, except under CI (`CI` set), where a missing server fails
them: CI installs the servers, and a suite that silently skipped them would pass untested.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NoReturn

__all__ = ["PostgresServer", "RedisServer", "free_port", "missing_server", "postgres_binaries", "redis_binary"]


def missing_server(name: str) -> NoReturn:
    """Skip the test that needs `name` (fail it under CI, which must have installed it)."""
    import pytest

    why = f"{name} is not installed (scripts/install-test-servers.sh installs it)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(why)
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server not listening on {port} after {timeout}s")


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def postgres_binaries() -> Path | None:
    """The directory holding `initdb` and `postgres` (Debian keeps them off PATH)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


class RedisServer:
    """`redis-server` with an append-only file synced on every write (nothing acknowledged is lost)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="td-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.directory,
            "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


class PostgresServer:
    """A PostgreSQL cluster of its own (trust authentication on loopback), database ``trio_direct``.

    PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` user."""

    def __init__(self, binaries: Path) -> None:
        self.binaries = binaries
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="td-postgres-")
        self.data = os.path.join(self.directory, "data")
        self.process: subprocess.Popen | None = None
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            shutil.chown(self.directory, self.user)
        self._run(
            [str(binaries / "initdb"), "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]
        )

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, command: list[str]) -> None:
        subprocess.run(command, check=True, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> None:
        command = [
            str(self.binaries / "postgres"), "-D", self.data, "-p", str(self.port), "-h", "127.0.0.1",
            "-k", self.directory, "-c", "fsync=off", "-c", "max_connections=100",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.process)
        deadline = time.monotonic() + 30
        while True:  # listening is not yet accepting: wait until a query answers
            probe = subprocess.run(
                [str(self.binaries / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                stdout=subprocess.DEVNULL,
                check=False,
            )
            if probe.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def stop(self) -> None:
        """A fast shutdown: sessions end, what was committed is on disk."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
            self.process.wait(timeout=60)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
