"""The ``trio-direct`` command line: one subcommand per program the project runs.

``serve`` runs the OpenAI-compatible frontend (docs/direct-engines.md), ``probe`` prints what the
frontend learns from engines, ``bench`` replays a request trace (docs/bench.md), ``mock-engine``
serves a CPU mock SGLang engine (docs/mock-engine.md). Each is one `Command` row of `COMMANDS`: its
options are one dataclass (`trio_direct.options`), from which its parser, ``--help``, environment
defaults (``serve``'s ``TRIO_DIRECT_*``; the others read none) and the object its handler runs with
all come.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from trio_direct import __version__
from trio_direct.config import ENV_PREFIX
from trio_direct.options import OneLineErrorParser, add_options, option, options_from_args

if TYPE_CHECKING:
    from trio_direct.bench import BenchOptions
    from trio_direct.config import ServeConfig
    from trio_direct.fleet.probe import ProbeOptions
    from trio_direct.frontend.supervisor import WorkerLink
    from trio_direct.mock.server import MockEngineConfig

__all__ = ["COMMANDS", "Command", "add_command_options", "build_parser", "main"]

log = logging.getLogger("trio_direct")


#: Errors binding a port that are the user's to fix (in use, not permitted, no such local address).
_BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


@dataclass(frozen=True, slots=True)
class Command:
    """One `trio-direct` subcommand: its options dataclass and what runs it.

    The parser is derived from the dataclass (`trio_direct.options`), never written by hand; `run`
    gets the dataclass built from the command line (and the `internal_flags` one, else None) and
    returns the exit status. `options` and `internal_flags` load their class when called, so a
    command's modules are imported only when that command runs (`serve` loads no mock engine).
    """

    name: str
    #: The line under COMMAND in ``trio-direct --help``.
    summary: str
    #: What ``trio-direct NAME --help`` opens with (a function: read when the options are added).
    description: str | Callable[[], str]
    options: Callable[[], type]
    run: Callable[[Any, Any], int]
    #: The command's environment variables are ``PREFIX + FIELD`` (None: it reads none).
    env_prefix: str | None = None
    #: Hidden flags of the program's own (how a supervisor starts its children).
    internal_flags: Callable[[], type] | None = None
    #: ``trio-direct NAME --version`` works too.
    version_flag: bool = False


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the options of that command alone are added (the
    others are listed by name; none for a name that is no command), which is all `main` needs to
    run it, without importing the modules of the others."""
    parser = OneLineErrorParser(
        prog="trio-direct", description="trio-direct: an OpenAI-compatible frontend for stock SGLang engines."
    )
    parser.add_argument("--version", action="version", version=f"trio-direct {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        sub = subcommands.add_parser(command.name, help=command.summary)
        sub.set_defaults(handler=partial(_run_command, command))
        if only is None or only == command.name:
            add_command_options(sub, command)
    return parser


def add_command_options(parser: argparse.ArgumentParser, command: Command) -> None:
    """Every option of `command`, from its dataclass (and its hidden flags)."""
    description = command.description
    parser.description = description() if callable(description) else description
    add_options(parser, command.options(), env_prefix=command.env_prefix)
    if command.version_flag:
        parser.add_argument("--version", action="version", version=f"trio-direct {__version__}")
    if command.internal_flags is not None:
        add_options(parser, command.internal_flags())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the named command's options (a name that is none: none; `trio-direct --help` lists names).
    parser = build_parser(only=argv[0] if argv else "")
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


def _run_command(command: Command, args: argparse.Namespace) -> int:
    options: Any = options_from_args(command.options(), args)
    internal: Any = options_from_args(command.internal_flags(), args) if command.internal_flags is not None else None
    return command.run(options, internal)


# --- serve ---------------------------------------------------------------------------------------


def _serve_options() -> type:
    from trio_direct.config import ServeConfig

    return ServeConfig


@dataclass(slots=True)
class WorkerFlags:
    """How a `--workers` supervisor starts its children (frontend/supervisor.py): hidden flags."""

    worker_index: int | None = option(None, hidden=True, help="this child's index")
    listen_fd: int | None = option(None, hidden=True, help="the listening socket it inherits")
    control_fd: int | None = option(None, hidden=True, help="its end of the supervisor's control socket")


def _run_serve(config: ServeConfig, flags: WorkerFlags) -> int:
    from trio_direct.fleet.fleet import FleetError
    from trio_direct.http.server import ListenError
    from trio_direct.service import serve

    problem = _serve_setting_problem(config)
    if problem is not None:
        print(f"trio-direct serve: error: {problem}", file=sys.stderr)
        return 2
    worker = _worker_link(flags)
    _configure_logging(
        config.log_level,
        worker.index if worker is not None else None,
        log_format=config.log_format,
        access_log=config.access_log,
    )
    if worker is None and config.workers > 1:
        from trio_direct.frontend.supervisor import supervise

        try:
            return trio.run(supervise, config)
        except BaseException as exc:
            if not _only_interrupts(exc):
                raise
            log.info("interrupted; stopped")
            return 0
    try:
        trio.run(_serve_until_signalled, serve, config, worker)
    except BaseException as exc:
        listen_error = _find(exc, ListenError)
        if listen_error is not None:
            print(f"trio-direct serve: error: {listen_error}", file=sys.stderr)
            return 2
        fleet_error = _find(exc, FleetError)
        if fleet_error is not None:
            who = f"trio-direct serve [worker {worker.index}]" if worker is not None else "trio-direct serve"
            print(f"{who}: {fleet_error}", file=sys.stderr)
            return 1
        if not _only_interrupts(exc):
            raise
        log.info("interrupted; stopped")
    return 0


def _serve_setting_problem(config: ServeConfig) -> str | None:
    """What stops `serve` before anything starts: a setting out of range or a file it cannot read."""
    if config.workers < 1:
        return "--workers must be at least 1"
    if config.default_max_tokens is not None and config.default_max_tokens < 1:
        return "--default-max-tokens must be at least 1"
    for flag, path in (("--chat-template", config.chat_template), ("--engine-file", config.engine_file)):
        if path:
            try:
                with open(path, "rb") as file:
                    file.read(1)
            except OSError as error:
                return f"{flag} {path}: {error.strerror or error}"
    return None


def _find(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first `kind` inside `exc` and the exception groups around it."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _find(inner, kind)) is not None:
                return found
    return None


def _worker_link(flags: WorkerFlags) -> WorkerLink | None:
    if flags.worker_index is None or flags.listen_fd is None or flags.control_fd is None:
        return None
    from trio_direct.frontend.supervisor import WorkerLink

    return WorkerLink(flags.worker_index, flags.listen_fd, flags.control_fd)


async def _serve_until_signalled(serve, config, worker: WorkerLink | None = None) -> None:
    """SIGTERM or SIGINT: drain gracefully; a second one: end every open response now, each with an
    error event, then stop; one before serving began: stop at once.

    A `--workers` child also drains when its supervisor asks (or is gone): that is no second signal.
    """
    from trio_direct.service import CUT_GRACE, Shutdown

    shutdown = Shutdown()
    serving = False
    async with trio.open_nursery() as nursery:

        async def stop_after_cut() -> None:
            await trio.sleep(config.abort_timeout + CUT_GRACE)  # the cut responses wrote their errors
            nursery.cancel_scope.cancel()

        def stop(reason: str, *, escalate: bool) -> None:
            if not serving:
                log.warning("%s during start-up: stopping now", reason)
                nursery.cancel_scope.cancel()
            elif not shutdown.drain.is_set():
                log.info("%s: draining in-flight requests", reason)
                shutdown.drain.set()
            elif escalate and not shutdown.cut.is_set():
                log.warning("%s again: ending open responses now", reason)
                shutdown.cut.set()
                nursery.start_soon(stop_after_cut)

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    stop(signal.Signals(signum).name, escalate=True)

        async def watch_supervisor(link: WorkerLink) -> None:
            await link.wait_for_stop()
            stop("supervisor stopping", escalate=False)

        async def serve_then_stop(*, task_status: trio.TaskStatus[list[str]]) -> None:
            listen_fd = worker.listen_fd if worker is not None else None
            await serve(config, shutdown=shutdown, listen_fd=listen_fd, task_status=task_status)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch_signals)
        if worker is not None:
            worker.export_identity()
            nursery.start_soon(watch_supervisor, worker)
        await nursery.start(serve_then_stop)
        serving = True
        if worker is not None:
            await worker.report_ready()


def _configure_logging(
    level: str, worker_index: int | None = None, *, log_format: str = "text", access_log: bool = True
) -> None:
    from trio_direct.logs import FORMAT, JsonFormatter, configure_logging

    configure_logging(level, log_format=log_format, access_log=access_log)
    if worker_index is not None:  # a `--workers` child: its lines name it
        label = FORMAT.replace("%(levelname)s", f"%(levelname)s [worker {worker_index}]", 1)
        for handler in logging.getLogger().handlers:
            if isinstance(handler.formatter, JsonFormatter):
                handler.addFilter(_WorkerLabel(worker_index))
            else:
                handler.setFormatter(logging.Formatter(label))


class _WorkerLabel(logging.Filter):
    """A `--workers` child's JSON lines carry its index as ``worker``."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


# --- probe ---------------------------------------------------------------------------------------


def _probe_options() -> type:
    from trio_direct.fleet.probe import ProbeOptions

    return ProbeOptions


def _run_probe(options: ProbeOptions, _internal: None) -> int:
    from trio_direct.fleet.probe import probe_command

    _configure_logging("warning")
    return trio.run(probe_command, options.urls, options.engine_api, options.timeout)


# --- bench ---------------------------------------------------------------------------------------


def _bench_options() -> type:
    from trio_direct.bench import BenchOptions

    return BenchOptions


def _bench_description() -> str:
    from trio_direct.bench import DESCRIPTION

    return DESCRIPTION


def _run_bench(options: BenchOptions, _internal: None) -> int:
    from trio_direct.bench import run_bench_command

    return run_bench_command(options)


# --- mock-engine ---------------------------------------------------------------------------------


def _mock_engine_options() -> type:
    from trio_direct.mock.server import MockEngineConfig

    return MockEngineConfig


def _run_mock_engine(config: MockEngineConfig, _internal: None) -> int:
    _configure_logging(config.log_level)
    config.launch_command = shlex.join(sys.argv)
    try:
        config.validate()
    except ValueError as exc:  # json.JSONDecodeError included
        print(f"trio-direct mock-engine: error: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(_serve_mock_engine, config)
    except BaseException as exc:
        bind_error = _find(exc, OSError)
        if isinstance(bind_error, OSError) and bind_error.errno in _BIND_ERRNOS:
            print(f"trio-direct mock-engine: error: {bind_error}", file=sys.stderr)
            return 2
        if not _only_interrupts(exc):
            raise
        log.info("interrupted; mock engine stopped")
    return 0


def _only_interrupts(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C, possibly wrapped in exception groups by the nurseries."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_interrupts(inner) for inner in exc.exceptions)
    return isinstance(exc, KeyboardInterrupt)


async def _serve_mock_engine(config: MockEngineConfig) -> None:
    from trio_direct.mock.server import run_mock_engine

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_sigterm, nursery.cancel_scope)
        running = await nursery.start(run_mock_engine, config)
        print(json.dumps(running.ready_event()), flush=True)


async def _stop_on_sigterm(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            log.info("SIGTERM; stopping")
            scope.cancel()
            return


#: Every subcommand, in the order ``trio-direct --help`` lists them. A new command is one more row
#: (CONTRIBUTING.md, "Add a command-line flag or command").
COMMANDS: dict[str, Command] = {
    command.name: command
    for command in (
        Command(
            "serve",
            summary="serve the OpenAI API from SGLang engines (built-in mock engines when no --engine-url)",
            description="Serve an OpenAI-compatible API from stock SGLang engines over gRPC. "
            "Every flag can also be set with the TRIO_DIRECT_<FLAG> environment variable.",
            options=_serve_options,
            run=_run_serve,
            env_prefix=ENV_PREFIX,
            internal_flags=lambda: WorkerFlags,
            version_flag=True,
        ),
        Command(
            "probe",
            summary="print what trio-direct learns from engines (engine cards as JSON)",
            description="Probe engines over gRPC and print one engine card per URL as JSON.",
            options=_probe_options,
            run=_run_probe,
        ),
        Command(
            "bench",
            summary="replay a request trace against a frontend (or an embedded fleet); see docs/bench.md",
            description=_bench_description,
            options=_bench_options,
            run=_run_bench,
        ),
        Command(
            "mock-engine",
            summary="serve a CPU mock engine (SGLang's native and/or SMG gRPC API, or vLLM's)",
            description="Serve a CPU mock SGLang or vLLM engine speaking the real gRPC contracts. "
            'Prints one JSON line {"event": "ready", ...} to stdout once it accepts calls.',
            options=_mock_engine_options,
            run=_run_mock_engine,
        ),
    )
}
