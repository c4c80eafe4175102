"""`trio-direct serve --workers N`: N frontend processes serving one listening socket.

The supervisor binds `--host/--port` once (port 0 allowed), then runs N `trio-direct serve` children
that inherit the listening socket (served as hypercorn's ``fd://`` bind): the kernel hands each new
connection to whichever child accepts it first, on every platform and with port 0. Each child is a
complete frontend with its own health checks and KV index (from the engines' events); in kv mode
it learns the load the other children put on the engines from `GetLoad` polling. Stored responses,
conversations and the admin API's engine changes are shared through the state store: the one
`--state-store` names, else a SQLite file in a temporary directory for this run.

Each child gets a control socket (a socketpair end). The child writes ``ready`` on it once it
accepts connections, and reads it until end-of-file: EOF means "drain and exit", whether the
supervisor closed its end on SIGTERM/SIGINT or died. So the first stop reaches the children without a
second signal (a child that also got the signal itself, from a terminal's Ctrl-C or systemd's
control-group kill, does not take the EOF as a second one), and children never outlive their
supervisor for longer than a drain. A second signal kills the children.

A child that exits before all N were first ready fails the start-up: the others are stopped and the
supervisor exits 1. A child that dies later is restarted, with a backoff (1 s, doubling to 30 s; back
to 1 s once a child stayed up a minute); the listening socket stays open meanwhile, so connections
wait in its backlog instead of being refused.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass, fields, replace

import trio

from trio_direct.config import ENV_PREFIX, ServeConfig
from trio_direct.routing.policies import routing_policy

log = logging.getLogger(__name__)

#: `--load-poll-interval` of kv-mode children when none is given: without polling, each frontend
#: would only count its own requests as engine load.
DEFAULT_WORKER_LOAD_POLL_INTERVAL = 1.0
_FIRST_BACKOFF = 1.0
_MAX_BACKOFF = 30.0
#: A child up this long is healthy again: its next crash restarts after `_FIRST_BACKOFF`.
_STABLE_AFTER = 60.0
#: How long after the drain deadline (graceful shutdown + abort timeouts) children are killed.
_KILL_MARGIN = 10.0
READY = b"ready\n"


# --- the supervisor's plain decisions ---------------------------------------------------------------


def worker_config(config: ServeConfig, engine_urls: list[str] | None = None) -> ServeConfig:
    """What each child runs with: one process, the given engines, and load polling in kv mode."""
    child = replace(config, workers=1)
    if engine_urls is not None:
        child = replace(child, engine_url=list(engine_urls), prefill_engine_url=[])
    if routing_policy(child.router_mode).selection == "cost" and child.load_poll_interval <= 0:
        child = replace(child, load_poll_interval=DEFAULT_WORKER_LOAD_POLL_INTERVAL)
    return child


def worker_environment(config: ServeConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with every setting of `config` as its ``TRIO_DIRECT_*`` variable.

    Settings travel in the environment rather than argv so that `--api-key` does not show in `ps`.
    """
    env = dict(environ)
    for spec in fields(ServeConfig):
        name = ENV_PREFIX + spec.name.upper()
        value = getattr(config, spec.name)
        if value is None or value == []:
            env.pop(name, None)
        elif isinstance(value, bool):
            env[name] = "true" if value else "false"
        elif isinstance(value, list):
            env[name] = " ".join(value)
        else:
            env[name] = str(value)
    return env


def next_backoff(backoff: float, uptime: float) -> tuple[float, float]:
    """(delay before this restart, backoff for the next one) after a child ran `uptime` seconds."""
    delay = _FIRST_BACKOFF if uptime >= _STABLE_AFTER else backoff
    return delay, min(delay * 2, _MAX_BACKOFF)


def describe_exit(status: int) -> str:
    if status < 0:
        with suppress(ValueError):
            return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


def open_listener(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """The listening socket every child serves (inheritable, so `pass_fds` can hand it on)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except BaseException:
        sock.close()
        raise
    return sock


def http_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# --- the child's side ------------------------------------------------------------------------------


@dataclass(slots=True)
class WorkerLink:
    """What a `--workers` child gets from its supervisor (internal `serve` flags)."""

    index: int
    listen_fd: int
    control_fd: int
    _control: trio.socket.SocketType | None = None

    def _socket(self) -> trio.socket.SocketType:
        if self._control is None:
            self._control = trio.socket.from_stdlib_socket(socket.socket(fileno=self.control_fd))
        return self._control

    async def report_ready(self) -> None:
        with suppress(OSError):  # the supervisor is gone: `wait_for_stop` sees that too
            await self._socket().send(READY)

    async def wait_for_stop(self) -> None:
        """Returns when the supervisor asks the child to drain, or is gone."""
        sock = self._socket()
        try:
            while await sock.recv(64):
                pass
        except OSError:
            pass

    def export_identity(self) -> None:
        """``trio_direct_worker_info{worker, pid} 1`` on `/metrics`: a scrape of the shared port
        reaches one child, and this says which."""
        from prometheus_client import Gauge

        from trio_direct.metrics import REGISTRY

        info = Gauge("trio_direct_worker_info", "This --workers child process", ["worker", "pid"], registry=REGISTRY)
        info.labels(str(self.index), str(os.getpid())).set(1)


# --- the supervisor --------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Slot:
    """One of the N children, across its restarts."""

    index: int
    process: trio.Process | None = None
    control: socket.socket | None = None
    ready: bool = False
    #: The supervisor stopped this child in a way that makes a non-zero exit expected.
    exit_expected: bool = False
    backoff: float = _FIRST_BACKOFF


@dataclass(slots=True, eq=False)
class Supervisor:
    config: ServeConfig
    listener: socket.socket
    env: dict[str, str]
    slots: list[_Slot]
    stopping: trio.Event
    all_ready: trio.Event
    #: Why the supervisor exits non-zero (None: all well so far).
    failure: str | None = None
    _nursery: trio.Nursery | None = None

    @classmethod
    def create(cls, config: ServeConfig, listener: socket.socket, env: dict[str, str]) -> Supervisor:
        slots = [_Slot(index) for index in range(config.workers)]
        return cls(config, listener, env, slots, trio.Event(), trio.Event())

    async def run(self) -> int:
        """Run the children until they all exited after a stop; returns the exit status."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._watch_signals)
            async with trio.open_nursery() as children:
                for slot in self.slots:
                    children.start_soon(self._keep_running, slot)
            nursery.cancel_scope.cancel()
        if self.failure is not None:
            print(f"trio-direct serve: {self.failure}", file=sys.stderr)
            return 1
        log.info("all workers exited")
        return 0

    def stop(self) -> None:
        """Ask every child to drain (EOF on its control socket); kill them if they overrun."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        if self._nursery is not None:
            self._nursery.start_soon(self._kill_after_drain_deadline)
        for slot in self.slots:
            if not slot.ready:
                slot.exit_expected = True  # a child still starting stops at once
            if slot.control is not None:
                _shutdown_write(slot.control)

    def kill(self) -> None:
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.kill()

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
        self.stop()

    async def _watch_signals(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                name = signal.Signals(signum).name
                if not self.stopping.is_set():
                    log.info("%s: stopping %d workers (each drains its in-flight requests)", name, len(self.slots))
                    self.stop()
                else:
                    log.warning("%s again: killing the workers", name)
                    for slot in self.slots:
                        slot.exit_expected = True
                    self.kill()

    async def _kill_after_drain_deadline(self) -> None:
        await trio.sleep(self.config.graceful_shutdown_timeout + self.config.abort_timeout + _KILL_MARGIN)
        if any(slot.process is not None and slot.process.returncode is None for slot in self.slots):
            self._fail("workers did not exit in time after the drain; killed them")
            self.kill()

    async def _keep_running(self, slot: _Slot) -> None:
        while not self.stopping.is_set():
            started = trio.current_time()
            status = await self._run_child(slot)
            if self.stopping.is_set():
                if status != 0 and not slot.exit_expected:
                    self._fail(f"worker {slot.index} {describe_exit(status)} while stopping")
                return
            if not self.all_ready.is_set():
                self._fail(f"worker {slot.index} {describe_exit(status)} during start-up; stopped the others")
                return
            delay, slot.backoff = next_backoff(slot.backoff, trio.current_time() - started)
            log.warning("worker %d %s; restarting it in %gs", slot.index, describe_exit(status), delay)
            with trio.move_on_after(delay):
                await self.stopping.wait()

    async def _run_child(self, slot: _Slot) -> int:
        """Start one child and wait for it to exit; returns its exit status."""
        parent_end, child_end = socket.socketpair()
        command = [
            sys.executable, "-m", "trio_direct", "serve",
            "--worker-index", str(slot.index),
            "--listen-fd", str(self.listener.fileno()),
            "--control-fd", str(child_end.fileno()),
        ]  # fmt: skip
        try:
            process = await trio.lowlevel.open_process(
                command, env=self.env, pass_fds=(self.listener.fileno(), child_end.fileno())
            )
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        slot.process, slot.control, slot.ready, slot.exit_expected = process, parent_end, False, False
        log.info("worker %d started (pid %d)", slot.index, process.pid)
        if self.stopping.is_set():  # stopped while it was being started
            slot.exit_expected = True
            _shutdown_write(parent_end)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._wait_ready, slot, trio.socket.from_stdlib_socket(parent_end))
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            if process.returncode is None:  # the supervisor itself is torn down: leave no child behind
                process.kill()
                with trio.CancelScope(deadline=trio.current_time() + 5, shield=True):
                    await process.wait()
            slot.process, slot.control, slot.ready = None, None, False
            parent_end.close()
        assert process.returncode is not None  # process.wait() returned in the nursery above
        return process.returncode

    async def _wait_ready(self, slot: _Slot, control: trio.socket.SocketType) -> None:
        received = b""
        with suppress(OSError, trio.ClosedResourceError):
            while READY not in received:
                data = await control.recv(64)
                if not data:
                    return
                received += data
        slot.ready = True
        log.info("worker %d ready (pid %d)", slot.index, slot.process.pid if slot.process else -1)
        if not self.all_ready.is_set() and all(s.ready for s in self.slots):
            self.all_ready.set()
            log.info("all %d workers ready on %s", len(self.slots), http_address(self.listener))


def _shutdown_write(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the child is already gone


async def supervise(config: ServeConfig) -> int:
    """`trio-direct serve --workers N`; returns the process exit status."""
    from trio_direct.engine.transport import open_transport
    from trio_direct.frontend.engine_sources import has_engine_sources, start_mock_engines

    try:
        listener = open_listener(config.host, config.port)
    except OSError as error:
        reason = error.strerror or error
        print(f"trio-direct serve: error: cannot listen on {config.host}:{config.port}: {reason}", file=sys.stderr)
        return 2  # as with one worker: a setting to fix, found before anything started
    shared_state: str | None = None
    try:
        log.info("listening on %s; starting %d workers", http_address(listener), config.workers)
        async with open_transport(), trio.open_nursery() as nursery:
            mocks = None
            if not has_engine_sources(config):
                # One fleet for all children: the supervisor runs the built-in mock engines.
                mocks = await start_mock_engines(config.mock_engines, config.mock_speedup, nursery)
            child = worker_config(config, mocks)
            if not config.state_store:
                # The workers share stored responses and admin changes through one SQLite file,
                # for as long as this serve runs (name one with --state-store to keep them).
                shared_state = tempfile.mkdtemp(prefix="trio-direct-state-")
                child = replace(child, state_store=f"sqlite://{shared_state}/state.db")
                log.info("workers share their state in %s for this run (--state-store keeps it)", child.state_store)
            elif config.state_store.strip().lower() == "memory":
                log.warning(
                    "--state-store memory with %d workers: each worker keeps its own stored responses and admin "
                    "changes, and answers only for those", config.workers,
                )  # fmt: skip
            if child.load_poll_interval != config.load_poll_interval:
                log.info(
                    "kv routing with %d workers: polling engine load every %gs (--load-poll-interval) so each "
                    "worker sees the others' load", config.workers, child.load_poll_interval,
                )  # fmt: skip
            status = await Supervisor.create(config, listener, worker_environment(child, os.environ)).run()
            nursery.cancel_scope.cancel()
            return status
    finally:
        listener.close()
        if shared_state is not None:
            shutil.rmtree(shared_state, ignore_errors=True)


__all__ = [
    "DEFAULT_WORKER_LOAD_POLL_INTERVAL",
    "Supervisor",
    "WorkerLink",
    "next_backoff",
    "open_listener",
    "supervise",
    "worker_config",
    "worker_environment",
]
