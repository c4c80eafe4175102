"""Historical (decision 10): this compares grpc.aio with the grpclib-on-trio-asyncio client the
frontend had until decision 11 replaced it; it imports that client's internals, so run it from a
checkout before that change.

The grpc.aio spike: CPU per engine message with grpcio's C HTTP/2 against grpclib, same run.

Two measurements, each alternating the two clients in rounds:

  transport  an engine process (this script with --serve) answers each Generate with `--tokens`
             small messages; the client reads `--streams` such calls at a time for `--seconds`
             through `EngineChannel` (grpclib) or `GrpcioEngineChannel` (grpc.aio), both on the
             trio-asyncio loop and read from trio. Client process CPU (every thread) per message.
  frontend   two mock engines at --speedup inf; `trio-direct serve` as shipped and `trio-direct
             serve` with grpc.aio under its engine channels (this script with --frontend-grpcio
             swaps the class ChannelPool builds); streamed chats at c=64: frontend CPU per token.

    python benchmarks/grpcio_spike_bench.py [--rounds 3] [--seconds 6] [--parts transport,frontend]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import trio
from grpc import aio as grpc_aio
from kv_routing_bench import TextPrompts
from loadgen import Children, free_port, wait_http
from vs_smg import MODEL, Prompts, Target, closed_loop, measured

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable, error_for_status
from trio_direct.engine.native import GENERATE
from trio_direct.engine.transport import EngineChannel, MessageStream, open_asyncio_loop
from trio_direct.engine.transport.client import _Failure
from trio_direct.engine.transport.loop import aio, current_loop, settled
from trio_direct.engine.transport.server import RpcMethod, serve_grpc
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.tokenizer import ModelTokenizer

# --- the spike: EngineChannel's calls on grpc.aio, in the same bridge shape as the shipped client ---------
#
# grpc.aio needs an asyncio loop; it runs on the same trio-asyncio loop as grpclib (its completion-
# queue poller thread wakes the loop through a socket the loop reads, which trio-asyncio supports).
# One asyncio task per call; messages cross to trio through a memory channel. Not adopted: see
# docs/decisions.md ("gRPC client in C").

_CANCEL_SETTLE_TIMEOUT = 5.0

#: The same windows as grpclib's `HTTP2_CONFIG`, and no limit on message size (long prompts).
_OPTIONS = [
    ("grpc.http2.lookahead_bytes", 4 * 1024 * 1024),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_retries", 0),
]


class GrpcioEngineChannel:
    """One engine reached through a `grpc.aio` channel (grpcio manages the HTTP/2 connection).

    Same calls as `EngineChannel`: `unary`, `open_stream` (a `MessageStream` whose `written` is
    set once the call is under way), `connect_for_streams`, `close`.
    """

    def __init__(self, host: str, port: int, *, connect_timeout: float = 5.0, config: object = None) -> None:
        # `config` is grpclib's HTTP/2 configuration, which the pool passes to every channel; grpc.aio
        # keeps its own defaults here, as the spike measured them.
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.name = f"{host}:{port}"
        self._channel: grpc_aio.Channel | None = None
        self._methods: dict[tuple[str, bool], Any] = {}

    # --- trio side -------------------------------------------------------------------------------

    async def unary(self, path: str, request: Any, response_type: type, *, timeout: float | None) -> Any:
        return await aio(self._unary_aio)(path, request, response_type, timeout)

    @asynccontextmanager
    async def open_stream(
        self, path: str, request: Any, response_type: type, *, timeout: float | None
    ) -> AsyncIterator[MessageStream]:
        send, receive = trio.open_memory_channel(math.inf)
        written = trio.Event()
        call = current_loop().create_task(self._stream_aio(path, request, response_type, timeout, send, written))
        try:
            yield MessageStream(receive, written)
        finally:
            if not call.done():
                call.cancel()  # cancels the grpc call: RST_STREAM(CANCEL) to the engine
                await settled(call, _CANCEL_SETTLE_TIMEOUT)

    async def connect_for_streams(self) -> None:
        await aio(self._connect_aio)()

    @property
    def stream_connections(self) -> int:
        """1 while the channel is connected (grpcio multiplexes every call on its connection)."""
        if self._channel is None:
            return 0
        return int(self._channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY)

    def close(self) -> None:
        """Drop the connection; in-flight calls fail as unavailable. A later call reconnects."""
        channel, self._channel = self._channel, None
        self._methods.clear()
        if channel is not None:
            # grpc.aio's close is a coroutine; run it on the loop without waiting for it here.
            current_loop().create_task(channel.close(grace=None))

    # --- asyncio side ----------------------------------------------------------------------------

    def _grpc_channel(self) -> grpc_aio.Channel:
        if self._channel is None:
            self._channel = grpc_aio.insecure_channel(self.name, options=_OPTIONS)
        return self._channel

    def _method(self, path: str, streaming: bool, request_type: type, response_type: type) -> Any:
        key = (path, streaming)
        method = self._methods.get(key)
        if method is None:
            channel = self._grpc_channel()
            factory = channel.unary_stream if streaming else channel.unary_unary
            method = self._methods[key] = factory(
                path, request_serializer=request_type.SerializeToString, response_deserializer=response_type.FromString
            )
        return method

    async def _connect_aio(self) -> None:
        channel = self._grpc_channel()
        try:
            await asyncio.wait_for(channel.channel_ready(), self.connect_timeout)
        except TimeoutError:
            raise EngineUnavailable(
                f"connect timed out after {self.connect_timeout:g}s", engine=self.name
            ) from None

    async def _unary_aio(self, path, request, response_type, timeout):
        method = self._method(path, False, type(request), response_type)
        try:
            return await method(request, timeout=timeout, wait_for_ready=False)
        except Exception as error:  # noqa: BLE001 - everything becomes a typed engine error
            raise self._typed(error) from None

    async def _stream_aio(self, path, request, response_type, timeout, send, written: trio.Event) -> None:
        with send:
            call = None
            try:
                call = self._method(path, True, type(request), response_type)(request, timeout=timeout)
                written.set()  # the C core sends it now; there is no "on the wire" signal to wait for
                push = send.send_nowait
                read = call.read
                eof = grpc_aio.EOF
                while (message := await read()) is not eof:
                    push(message)
            except Exception as error:  # noqa: BLE001
                send.send_nowait(_Failure(self._typed(error)))
            except asyncio.CancelledError:
                if call is not None:
                    call.cancel()
            finally:
                written.set()

    def _typed(self, error: Exception) -> EngineError:
        if isinstance(error, EngineError):
            return error
        if isinstance(error, grpc_aio.AioRpcError):
            code, details = error.code(), error.details() or ""
            if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                return EngineDeadlineExceeded(details or "deadline exceeded", engine=self.name)
            if code is grpc.StatusCode.UNAVAILABLE:
                return EngineUnavailable(details or "unavailable", engine=self.name)
            return error_for_status(code.name, details, engine=self.name)
        if isinstance(error, asyncio.TimeoutError):
            return EngineDeadlineExceeded("deadline exceeded", engine=self.name)
        if isinstance(error, (ConnectionError, OSError)):
            return EngineUnavailable(f"connection lost: {error}", engine=self.name)
        return error_for_status("INTERNAL", f"{type(error).__name__}: {error}", engine=self.name)


MESSAGE = pb.GenerateResponse(output_ids=[12345], meta_info={"completion_tokens": "1"})
CLIENTS = {"grpclib": EngineChannel, "grpc.aio": GrpcioEngineChannel}


async def serve() -> None:
    def generate(call):
        for _ in range(call.request.sampling_params.max_new_tokens):
            call.send(MESSAGE)
        call.finish()

    methods = [RpcMethod(GENERATE, True, pb.GenerateRequest, pb.GenerateResponse, generate)]
    async with open_asyncio_loop(), trio.open_nursery() as nursery:
        port = await nursery.start(serve_grpc, methods, "127.0.0.1", 0)
        print(json.dumps({"port": port}), flush=True)


async def read_streams(client: str, port: int, streams: int, tokens: int, seconds: float) -> tuple[int, float]:
    """Messages received and client CPU seconds (all threads) over `seconds` of `streams` calls."""
    request = pb.GenerateRequest(input_ids=[1] * 256, sampling_params=pb.SamplingParams(max_new_tokens=tokens))
    received = 0
    async with open_asyncio_loop():
        channel = CLIENTS[client]("127.0.0.1", port)
        await channel.connect_for_streams()
        deadline = trio.current_time() + seconds

        async def worker() -> None:
            nonlocal received
            while trio.current_time() < deadline:
                async with channel.open_stream(GENERATE, request, pb.GenerateResponse, timeout=30) as stream:
                    async for _ in stream:
                        received += 1

        cpu = time.process_time()
        async with trio.open_nursery() as nursery:
            for _ in range(streams):
                nursery.start_soon(worker)
        cpu = time.process_time() - cpu
        channel.close()
        await trio.sleep(0.05)
    return received, cpu


def part_transport(args) -> None:
    server = subprocess.Popen([sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["port"]
        for client in CLIENTS:  # warm-up
            trio.run(read_streams, client, port, args.streams, args.tokens, 1.0)
        per_message: dict[str, list[float]] = {client: [] for client in CLIENTS}
        rates: dict[str, list[float]] = {client: [] for client in CLIENTS}
        for i in range(args.rounds):
            for client in CLIENTS if i % 2 == 0 else list(reversed(CLIENTS)):
                count, cpu = trio.run(read_streams, client, port, args.streams, args.tokens, args.seconds)
                per_message[client].append(cpu / count)
                rates[client].append(count / args.seconds)
        print(f"transport: {args.streams} streams of {args.tokens} messages, {args.rounds} rounds of {args.seconds:g} s")
        for client in CLIENTS:
            print(
                f"  {client:<9} client CPU per message {statistics.median(per_message[client]) * 1e6:6.2f} us "
                f"(rounds {', '.join(f'{v * 1e6:.2f}' for v in per_message[client])}); "
                f"{statistics.median(rates[client]):,.0f} msg/s"
            )
        ratios = [a / b for a, b in zip(per_message["grpc.aio"], per_message["grpclib"], strict=True)]
        print(f"  grpc.aio / grpclib CPU per message: {statistics.median(ratios):.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    finally:
        server.terminate()
        server.wait(timeout=10)


def start_frontend(children: Children, engines: list[int], grpcio: bool) -> Target:
    port = free_port()
    urls = [arg for p in engines for arg in ("--engine-url", f"grpc://127.0.0.1:{p}")]
    command = [sys.executable, *([__file__, "--frontend-grpcio"] if grpcio else ["-m", "trio_direct"])]
    process = children.start(
        [*command, "serve", "--port", str(port), "--log-level", "warning", *urls], stdout=subprocess.DEVNULL
    )
    wait_http(port)
    wait_http(port, "/v1/models")
    return Target("grpc.aio" if grpcio else "grpclib", port, process.pid)


def part_frontend(args) -> None:
    model_dir = ensure_tiny_model(default_tiny_model_dir())
    prompts = Prompts(TextPrompts(ModelTokenizer.from_directory(model_dir)), MODEL)
    with Children() as children:
        engines = [
            children.mock_engine(
                "--speedup", "inf", "--incremental-streaming-output", "--log-level", "warning", "--served-model-name", MODEL
            )
            for _ in range(2)
        ]
        targets = [start_frontend(children, engines, False), start_frontend(children, engines, True)]
        for target in targets:
            trio.run(closed_loop, target.port, prompts.body, 64, 2.0)
        cpu: dict[str, list[float]] = {t.name: [] for t in targets}
        rate: dict[str, list[float]] = {t.name: [] for t in targets}
        for i in range(args.rounds):
            for target in targets if i % 2 == 0 else list(reversed(targets)):
                window = measured(target, lambda: trio.run(closed_loop, target.port, prompts.body, 64, args.seconds))  # noqa: B023
                cpu[target.name].append(window.cpu / max(window.tokens, 1))
                rate[target.name].append(window.tokens / window.wall)
        print(f"frontend: c=64 streamed chats (256-word prompts, 64 tokens), {args.rounds} rounds of {args.seconds:g} s")
        for name, values in cpu.items():
            print(
                f"  {name:<9} CPU per token {statistics.median(values) * 1e6:6.1f} us "
                f"(rounds {', '.join(f'{v * 1e6:.1f}' for v in values)}); {statistics.median(rate[name]):,.0f} tok/s"
            )
        ratios = [a / b for a, b in zip(cpu["grpc.aio"], cpu["grpclib"], strict=True)]
        print(f"  grpc.aio / grpclib CPU per token: {statistics.median(ratios):.2f} (rounds {', '.join(f'{r:.2f}' for r in ratios)})")


def run_frontend_on_grpcio(argv: list[str]) -> None:
    """`trio-direct ARGV` with grpc.aio under every engine channel the frontend's pool builds."""
    from trio_direct.cli import main as cli_main
    from trio_direct.engine.transport import client

    client.EngineChannel = GrpcioEngineChannel  # type: ignore[misc] - ChannelPool builds this name
    sys.argv = ["trio-direct", *argv]
    cli_main()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--frontend-grpcio":
        run_frontend_on_grpcio(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--parts", default="transport,frontend")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve)
        return
    parts = args.parts.split(",")
    if "transport" in parts:
        part_transport(args)
    if "frontend" in parts:
        part_frontend(args)


if __name__ == "__main__":
    main()
