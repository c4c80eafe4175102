"""The trio gRPC client against a tonic server (Rust: tonic 0.14 on hyper's `h2`), the stack of
SGLang's own gRPC server and of smg.

smg 1.13's binary serves its mesh (the gossip between gateway replicas) with tonic, so `smg launch
--enable-mesh` is a real tonic server on loopback. Its `mesh.gossip.Gossip/PingServer` is unary:
a `GossipMessage` whose `ping` is set is answered with the node's `NodeUpdate`, another payload
with INVALID_ARGUMENT, bytes that are no protobuf with INTERNAL, an unknown method with a
trailers-only UNIMPLEMENTED. The two messages are declared below with the fields the tests use
(smg's `mesh.gossip` package, field numbers as its server reads them).

The same wheel carries SGLang's Rust gRPC servicer (`smg.smg_rs.SglangGrpcServer`, tonic again), the
server that fronts a headless SGLang scheduler. Started in smg's own interpreter with no scheduler
dialing in, it serves the standard `grpc.health.v1.Health` (`Check` answers NOT_SERVING until a
scheduler connects; `Watch` streams that status and then holds the stream open) and
`sglang.grpc.scheduler.SglangScheduler`'s control methods from its configuration (`GetModelInfo`,
`HealthCheck`): the client's server streams, resets, keepalive pings and a server shutdown with
streams open are exercised against it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpclib.health.v1 import health_pb2
from state_servers import free_port, missing_server, wait_port

from trio_direct._proto.smg import sglang_scheduler_pb2 as sglang
from trio_direct.engine import errors
from trio_direct.engine.transport import EngineChannel, client_config

PING = "/mesh.gossip.Gossip/PingServer"


def _mesh_messages() -> tuple[type, type, type]:
    """`GossipMessage` (oneof payload: `Ping ping = 1`, ...), `Ping` and `NodeUpdate`, as smg's server
    decodes them."""
    proto = descriptor_pb2.FileDescriptorProto(name="trio_direct_tests_mesh_gossip.proto", package="mesh.gossip")
    proto.syntax = "proto3"
    proto.message_type.add(name="Ping")
    gossip = proto.message_type.add(name="GossipMessage")
    gossip.oneof_decl.add(name="payload")
    gossip.field.add(
        name="ping", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
        type_name=".mesh.gossip.Ping", label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, oneof_index=0,
    )  # fmt: skip
    gossip.field.add(
        name="padding", number=9, type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )  # fmt: skip
    node = proto.message_type.add(name="NodeUpdate")
    for number, (name, kind) in enumerate(
        (("name", "TYPE_STRING"), ("address", "TYPE_STRING"), ("status", "TYPE_INT32")), start=1
    ):
        node.field.add(
            name=name, number=number, type=getattr(descriptor_pb2.FieldDescriptorProto, kind),
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
        )  # fmt: skip
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    classes = message_factory.GetMessages([proto], pool=pool)
    return classes["mesh.gossip.GossipMessage"], classes["mesh.gossip.Ping"], classes["mesh.gossip.NodeUpdate"]


GossipMessage, Ping, NodeUpdate = _mesh_messages()


class RawMessage:
    """Bytes sent as they are (a payload no protobuf decoder accepts)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:  # protobuf's name: the client calls it
        return self.data


@pytest.fixture
def tonic_server(smg_executable: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """`smg launch` with its mesh on loopback (no workers: only the mesh is under test)."""
    mesh = free_port()
    process = subprocess.Popen(
        [smg_executable, "launch", "--host", "127.0.0.1", "--port", str(free_port()), "--log-level", "error",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
         "--shutdown-grace-period-secs", "1", "--enable-mesh", "--mesh-host", "127.0.0.1",
         "--mesh-advertise-host", "127.0.0.1", "--mesh-port", str(mesh)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    try:
        wait_port(mesh, process)
        yield process, mesh
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def ping() -> object:
    return GossipMessage(ping=Ping())


async def test_a_unary_call_decodes_the_reply_and_the_status_of_every_failure(aio_loop, tonic_server):
    _, port = tonic_server
    channel = EngineChannel("127.0.0.1", port, connect_timeout=5.0)
    reply = await channel.unary(PING, ping(), NodeUpdate, timeout=10)
    assert reply.address == f"127.0.0.1:{port}" and reply.name and reply.status == 1
    with pytest.raises(errors.EngineUnimplemented):  # a trailers-only response: HEADERS that end the stream
        await channel.unary("/nope.Nope/Nope", ping(), NodeUpdate, timeout=10)
    with pytest.raises(errors.EngineInvalidArgument) as invalid:
        await channel.unary(PING, GossipMessage(), NodeUpdate, timeout=10)
    assert invalid.value.message == "Invalid message payload"
    with pytest.raises(errors.EngineInternal) as internal:
        await channel.unary(PING, RawMessage(b"\x0a\x03abc"), NodeUpdate, timeout=10)
    assert internal.value.message.startswith("failed to decode Protobuf message")  # percent-decoded
    assert (await channel.unary(PING, ping(), NodeUpdate, timeout=10)).status == 1  # the connection goes on
    channel.close()


async def test_a_request_far_past_the_servers_windows_and_many_concurrent_calls(aio_loop, tonic_server):
    _, port = tonic_server
    channel = EngineChannel("127.0.0.1", port, connect_timeout=5.0)
    # 3 MB in one message: ~48 times h2's initial 64 KiB stream window, sent as the server opens it.
    large = GossipMessage(ping=Ping(), padding=b"x" * (3 << 20))
    assert (await channel.unary_work(PING, large, NodeUpdate, timeout=30)).status == 1
    replies: list[Any] = []

    async def one() -> None:
        replies.append(await channel.unary_work(PING, ping(), NodeUpdate, timeout=30))

    async with trio.open_nursery() as nursery:
        for _ in range(300):  # the mesh advertises no SETTINGS_MAX_CONCURRENT_STREAMS: one connection
            nursery.start_soon(one)
    assert len(replies) == 300 and all(reply.status == 1 for reply in replies)
    assert channel.stream_connections == 1
    channel.close()


async def test_a_call_cancelled_by_its_deadline_leaves_the_connection_usable(aio_loop, tonic_server):
    _, port = tonic_server
    channel = EngineChannel("127.0.0.1", port, connect_timeout=5.0)
    large = GossipMessage(ping=Ping(), padding=b"x" * (64 << 20))  # cannot be sent within the deadline
    # The deadline fires while the request is still going out: framing it must leave the event loop
    # free (it once copied the rest of the request for every frame: seconds for 64 MB).
    with trio.fail_after(2), pytest.raises(errors.EngineDeadlineExceeded):
        await channel.unary_work(PING, large, NodeUpdate, timeout=0.05)
    assert (await channel.unary_work(PING, ping(), NodeUpdate, timeout=10)).status == 1
    assert (await channel.unary(PING, ping(), NodeUpdate, timeout=10)).status == 1
    channel.close()


async def test_a_server_that_goes_away_fails_the_next_call_as_unavailable(aio_loop, tonic_server):
    process, port = tonic_server
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
    assert (await channel.unary(PING, ping(), NodeUpdate, timeout=10)).status == 1
    process.send_signal(signal.SIGTERM)  # tonic's graceful shutdown: GOAWAY, then the connection closes
    await trio.to_thread.run_sync(process.wait, 20)
    with trio.fail_after(10), pytest.raises(errors.EngineUnavailable):
        await channel.unary(PING, ping(), NodeUpdate, timeout=5)
    channel.close()


# --- SGLang's Rust gRPC servicer ---------------------------------------------------------------

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
MODEL_INFO = "/sglang.grpc.scheduler.SglangScheduler/GetModelInfo"
SCHEDULER_HEALTH = "/sglang.grpc.scheduler.SglangScheduler/HealthCheck"
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
MODEL = "tonic-conformance-model"

#: Run by smg's interpreter: the servicer on an ephemeral loopback port (it prints the bound address),
#: its scheduler sockets in a temporary directory, and no scheduler: it waits for one for an hour.
#: SIGTERM stops it the way its launcher does (`stop`: streams cancelled, connections closed); so
#: does the end of its stdin, so a test run that dies leaves no server behind.
SERVICER = """
import shutil, signal, sys, tempfile, threading
from smg.smg_rs import SglangGrpcServer
directory = tempfile.mkdtemp(prefix="td-tonic-")
server = SglangGrpcServer(
    "127.0.0.1:0", f"ipc://{directory}/engine", f"ipc://{directory}/handshake", sys.argv[1],
    engine_startup_timeout_secs=3600, engine_startup_ceiling_secs=3600,
)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print(server.address, flush=True)
while not stop.wait(0.05):
    pass
server.stop(2.0)
shutil.rmtree(directory, ignore_errors=True)
"""


def smg_python(smg_executable: str) -> str:
    """The interpreter of smg's environment (the Rust servicers are a Python extension of the wheel):
    the one its `smg` script names, else the `python` beside it."""
    candidates = [Path(smg_executable).with_name("python")]
    try:
        first = Path(smg_executable).read_bytes()[:512].split(b"\n", 1)[0]
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        candidates.insert(0, Path(first[2:].decode(errors="replace").strip().split()[0]))
    for candidate in candidates:
        if candidate.exists():
            probe = subprocess.run([str(candidate), "-c", "import smg.smg_rs"], capture_output=True, check=False)
            if probe.returncode == 0:
                return str(candidate)
    missing_server(f"smg's Python environment (with smg.smg_rs) beside {smg_executable}")


def start_servicer(python: str) -> tuple[subprocess.Popen, int]:
    process = subprocess.Popen(
        [python, "-c", SERVICER, MODEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline().decode() if ready else ""
    if not line.strip():
        stop_servicer(process)
        raise RuntimeError(f"smg's SGLang servicer did not start (exit code {process.poll()})")
    return process, int(line.strip().rsplit(":", 1)[1])


def stop_servicer(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


@pytest.fixture(scope="module")
def servicer_python(smg_executable: str) -> str:
    return smg_python(smg_executable)


@pytest.fixture(scope="module")
def sglang_servicer(servicer_python: str) -> Iterator[int]:
    """One servicer for the tests that leave it running (a plain process: nothing of trio's is shared
    across tests, each test dials it with its own channel)."""
    process, port = start_servicer(servicer_python)
    try:
        yield port
    finally:
        stop_servicer(process)


async def test_tonic_health_and_scheduler_replies_decode_and_errors_keep_their_status(aio_loop, sglang_servicer):
    channel = EngineChannel("127.0.0.1", sglang_servicer, connect_timeout=5.0)
    health = await channel.unary(
        HEALTH_CHECK, health_pb2.HealthCheckRequest(), health_pb2.HealthCheckResponse, timeout=5
    )
    assert health.status == NOT_SERVING  # no scheduler has connected
    with pytest.raises(errors.EngineInvalidArgument) as unknown:  # NOT_FOUND, in trailers only
        await channel.unary(
            HEALTH_CHECK, health_pb2.HealthCheckRequest(service="nope"), health_pb2.HealthCheckResponse, timeout=5
        )
    assert unknown.value.message == 'unknown service "nope"'
    info = await channel.unary(MODEL_INFO, sglang.GetModelInfoRequest(), sglang.GetModelInfoResponse, timeout=5)
    assert info.model_path == MODEL and info.is_generation
    check = await channel.unary(SCHEDULER_HEALTH, sglang.HealthCheckRequest(), sglang.HealthCheckResponse, timeout=5)
    assert not check.healthy and check.message == "Engine is starting"
    with pytest.raises(errors.EngineUnimplemented):
        await channel.unary("/sglang.grpc.scheduler.SglangScheduler/Nope", sglang.HealthCheckRequest(),
                            sglang.HealthCheckResponse, timeout=5)  # fmt: skip
    assert (
        await channel.unary(MODEL_INFO, sglang.GetModelInfoRequest(), sglang.GetModelInfoResponse, timeout=5)
    ).model_path == MODEL
    channel.close()


async def test_tonic_watch_streams_left_early_are_reset_and_the_connections_go_on(aio_loop, sglang_servicer):
    """250 Watch streams open at once on one channel, as many connections as the servicer's
    SETTINGS_MAX_CONCURRENT_STREAMS asks (it sets none: one); leaving each stream after its first
    message resets it, and the connection carries the next 250 calls."""
    channel = EngineChannel("127.0.0.1", sglang_servicer, connect_timeout=5.0)
    first: list[int] = []
    all_open = trio.Event()
    done = trio.Event()

    async def watch() -> None:
        async with channel.open_stream(
            HEALTH_WATCH, health_pb2.HealthCheckRequest(), health_pb2.HealthCheckResponse, timeout=None
        ) as stream:
            async for message in stream:
                first.append(message.status)
                if len(first) == 250:
                    all_open.set()
                await done.wait()  # held open, the server sends nothing more
                break

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(250):
                nursery.start_soon(watch)
            await all_open.wait()
            limit = channel._streaming[0].wire.max_concurrent_streams  # the servicer's SETTINGS
            assert channel.streams_in_flight == 250
            assert channel.stream_connections == (1 if limit is None else -(-250 // limit))
            done.set()
    assert first == [NOT_SERVING] * 250 and channel.streams_in_flight == 0
    replies = []

    async def one() -> None:
        replies.append(
            await channel.unary_work(MODEL_INFO, sglang.GetModelInfoRequest(), sglang.GetModelInfoResponse, timeout=5)
        )

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(250):  # on the same connections, their streams' slots freed by the resets
                nursery.start_soon(one)
    assert [reply.model_path for reply in replies] == [MODEL] * 250
    channel.close()


async def test_tonic_answers_keepalive_pings_on_a_quiet_stream(aio_loop, sglang_servicer):
    # One ping unanswered for 0.5 s would close the connection and fail the stream; the stream stays
    # quiet for 1.2 s, long enough for that to happen at least once over.
    config = client_config(keepalive_interval=0.1, keepalive_timeout=0.5)
    channel = EngineChannel("127.0.0.1", sglang_servicer, connect_timeout=5.0, config=config)
    async with channel.open_stream(
        HEALTH_WATCH, health_pb2.HealthCheckRequest(), health_pb2.HealthCheckResponse, timeout=None
    ) as stream:
        async for message in stream:
            assert message.status == NOT_SERVING
            await trio.sleep(1.2)  # ~12 pings, each answered within its 0.5 s
            break
    (connection,) = channel._streaming
    assert connection.usable  # not shut for an unanswered ping
    info = await channel.unary_work(MODEL_INFO, sglang.GetModelInfoRequest(), sglang.GetModelInfoResponse, timeout=5)
    assert info.model_path == MODEL and channel._streaming == [connection]
    channel.close()


async def test_tonic_shutting_down_with_a_stream_open_ends_it_with_an_error(aio_loop, servicer_python):
    process, port = start_servicer(servicer_python)
    try:
        channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
        with trio.fail_after(10), pytest.raises(errors.EngineError) as raised:
            async with channel.open_stream(
                HEALTH_WATCH, health_pb2.HealthCheckRequest(), health_pb2.HealthCheckResponse, timeout=None
            ) as stream:
                async for _ in stream:
                    process.send_signal(signal.SIGTERM)  # the servicer's stop: streams cancelled, GOAWAY
                    break
                async for _ in stream:
                    pass
        assert isinstance(raised.value, (errors.EngineUnavailable, errors.EngineCancelled))
        await trio.to_thread.run_sync(process.wait, 10)
        with trio.fail_after(10), pytest.raises(errors.EngineUnavailable):
            await channel.unary(MODEL_INFO, sglang.GetModelInfoRequest(), sglang.GetModelInfoResponse, timeout=5)
        channel.close()
    finally:
        stop_servicer(process)
