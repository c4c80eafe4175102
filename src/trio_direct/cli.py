"""The ``trio-direct`` command line: one subcommand per program the project runs.

``serve`` runs the OpenAI-compatible frontend (docs/direct-engines.md), ``probe`` prints what the
frontend learns from engines, ``mock-engine`` serves a CPU mock SGLang engine (docs/mock-engine.md).
Each subcommand registers its own parser and handler.
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
from typing import TYPE_CHECKING, NoReturn

import trio

from trio_direct import __version__
from trio_direct.fleet.engine_apis import AUTO, engine_api_choices
from trio_direct.mock import MOCK_MODEL_NAME

if TYPE_CHECKING:
    from trio_direct.frontend.supervisor import WorkerLink
    from trio_direct.mock.server import MockEngineConfig

__all__ = ["build_parser", "main"]

log = logging.getLogger("trio_direct")


class _OneLineErrors(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit status 2 (argparse's usage dump is for --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


#: Errors binding a port that are the user's to fix (in use, not permitted, no such local address).
_BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="trio-direct", description="trio-direct: an OpenAI-compatible frontend for stock SGLang engines."
    )
    parser.add_argument("--version", action="version", version=f"trio-direct {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(subcommands)
    _add_probe(subcommands)
    _add_bench(subcommands)
    _add_mock_engine(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # bench owns its whole command line (and its --help)
        from trio_direct.bench import bench_main

        return bench_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


# --- serve ---------------------------------------------------------------------------------------


def _add_serve(subcommands: argparse._SubParsersAction) -> None:
    from trio_direct.config import add_serve_arguments

    p = subcommands.add_parser(
        "serve",
        help="serve the OpenAI API from SGLang engines (built-in mock engines when no --engine-url)",
        description="Serve an OpenAI-compatible API from stock SGLang engines over gRPC. "
        "Every flag can also be set with the TRIO_DIRECT_<FLAG> environment variable.",
    )
    add_serve_arguments(p)
    p.add_argument("--version", action="version", version=f"trio-direct {__version__}")
    # Internal: how a `--workers` supervisor starts its children (frontend/supervisor.py).
    for flag in ("--worker-index", "--listen-fd", "--control-fd"):
        p.add_argument(flag, type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from trio_direct.config import config_from_args
    from trio_direct.fleet.fleet import FleetError
    from trio_direct.http.server import ListenError
    from trio_direct.service import serve

    config = config_from_args(args)
    problem = _serve_setting_problem(config)
    if problem is not None:
        print(f"trio-direct serve: error: {problem}", file=sys.stderr)
        return 2
    worker = _worker_link(args)
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


def _serve_setting_problem(config) -> str | None:
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


def _worker_link(args: argparse.Namespace) -> WorkerLink | None:
    if args.worker_index is None:
        return None
    from trio_direct.frontend.supervisor import WorkerLink

    return WorkerLink(args.worker_index, args.listen_fd, args.control_fd)


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


def _add_probe(subcommands: argparse._SubParsersAction) -> None:
    p = subcommands.add_parser(
        "probe",
        help="print what trio-direct learns from engines (engine cards as JSON)",
        description="Probe engines over gRPC and print one engine card per URL as JSON.",
    )
    p.add_argument("urls", nargs="+", metavar="URL", help="engine gRPC address (grpc://h:p, http://h:p or h:p)")
    p.add_argument("--engine-api", choices=engine_api_choices(), default=AUTO, help="default %(default)s")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per engine (default %(default)s)")
    p.set_defaults(handler=_run_probe)


def _run_probe(args: argparse.Namespace) -> int:
    from trio_direct.fleet.probe import probe_command

    _configure_logging("warning")
    return trio.run(probe_command, args.urls, args.engine_api, args.timeout)


# --- bench ---------------------------------------------------------------------------------------


def _add_bench(subcommands: argparse._SubParsersAction) -> None:
    p = subcommands.add_parser(
        "bench",
        help="replay a request trace against a frontend (or an embedded fleet); see docs/bench.md",
        add_help=False,
    )
    p.set_defaults(handler=lambda _args: 0)  # main() hands `bench ...` to bench_main before parsing


# --- mock-engine ---------------------------------------------------------------------------------


def _add_mock_engine(subcommands: argparse._SubParsersAction) -> None:
    p = subcommands.add_parser(
        "mock-engine",
        help="serve a CPU mock engine (SGLang's native and/or SMG gRPC API, or vLLM's)",
        description="Serve a CPU mock SGLang or vLLM engine speaking the real gRPC contracts. "
        'Prints one JSON line {"event": "ready", ...} to stdout once it accepts calls.',
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=0, help="gRPC port; 0 picks a free one (default)")
    p.add_argument(
        "--api",
        choices=("native", "smg", "both", "vllm"),
        default="both",
        help="gRPC API(s) to serve on the port: SGLang's native and/or SMG API (both adds grpc.health.v1), "
        "or vLLM's (with grpc.health.v1) (default %(default)s)",
    )
    p.add_argument(
        "--role",
        choices=("aggregated", "prefill", "decode"),
        default="aggregated",
        help="PD disaggregation role; under --api vllm reported as kv_role kv_producer/kv_consumer "
        "(default %(default)s)",
    )
    p.add_argument("--page-size", type=int, default=1, help="KV page size in tokens (default %(default)s)")
    p.add_argument("--dp-size", type=int, default=1, help="data-parallel ranks (default %(default)s)")
    p.add_argument("--num-blocks", type=int, default=65536, help="KV pages per rank (default %(default)s)")
    p.add_argument(
        "--max-running-requests", type=int, default=256, help="decode batch cap per rank (default %(default)s)"
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=16384,
        help="uncached prompt tokens per prefill step (default %(default)s)",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="context length override (default: the model config's max_position_embeddings)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="divide simulated step times by this; 'inf' runs as fast as the CPU allows (default 1)",
    )
    p.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="native API streams deltas instead of cumulative output_ids",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        metavar="JSON",
        help='SGLang\'s --kv-events-config JSON (plus "format": "map"|"array")',
    )
    p.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=8998,
        help="bootstrap port of a prefill engine; 0 picks a free one (default %(default)s)",
    )
    p.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=30.0,
        help="seconds a PD leg waits for its partner (default %(default)s)",
    )
    p.add_argument(
        "--model-path",
        default=None,
        help="local tokenizer/model directory (default: the built-in tiny ChatML model)",
    )
    p.add_argument(
        "--served-model-name",
        default=MOCK_MODEL_NAME,
        help="model id to report (default: %(default)s, the name `serve` gives its built-in mocks)",
    )
    p.add_argument("--tool-call-parser", default=None, help="parser name to advertise in server info")
    p.add_argument("--reasoning-parser", default=None, help="parser name to advertise in server info")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the engine's sampling RNG, as SGLang's --random-seed: requests without a seed draw theirs "
        "from it, so a fresh engine answers the same requests in the same order alike (default: fresh entropy)",
    )
    p.add_argument(
        "--scripted-outputs",
        default=None,
        metavar="FILE",
        help='JSON [{"match": "prompt substring" | null, "text": "..."}]: fixed answers (then EOS) for matching prompts',
    )
    p.add_argument(
        "--is-embedding",
        action="store_true",
        help="serve an embedding model: Embed answers deterministic unit vectors of the config's hidden_size",
    )
    p.add_argument(
        "--multimodal",
        action="store_true",
        help="take image input (native image_data), each image counting a fixed number of prompt tokens",
    )
    p.add_argument(
        "--expose-accounting",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add a mock_accounting key to the native GetServerInfo json_info (default on)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="logging level (default %(default)s)",
    )
    p.set_defaults(handler=_run_mock_engine)


def _run_mock_engine(args: argparse.Namespace) -> int:
    # Imported here so other subcommands (and --help) do not load the mock engine.
    from trio_direct.mock.server import MockEngineConfig

    _configure_logging(args.log_level)
    config = MockEngineConfig(
        host=args.host,
        port=args.port,
        api=args.api,
        role=args.role,
        page_size=args.page_size,
        dp_size=args.dp_size,
        num_blocks=args.num_blocks,
        max_running_requests=args.max_running_requests,
        max_prefill_tokens=args.max_prefill_tokens,
        context_length=args.context_length,
        speedup=args.speedup,
        incremental_streaming_output=args.incremental_streaming_output,
        kv_events_config=args.kv_events_config,
        disaggregation_bootstrap_port=args.disaggregation_bootstrap_port,
        bootstrap_timeout=args.bootstrap_timeout,
        model_path=args.model_path,
        served_model_name=args.served_model_name,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        seed=args.seed,
        scripted_outputs=args.scripted_outputs,
        is_embedding=args.is_embedding,
        multimodal=args.multimodal,
        expose_accounting=args.expose_accounting,
        log_level=args.log_level,
        launch_command=shlex.join(sys.argv),
    )
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
