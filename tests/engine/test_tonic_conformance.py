"""The trio gRPC client against a tonic server (Rust: tonic 0.14 on hyper's `h2`), the stack of
SGLang's own gRPC server and of smg.

smg 1.13's binary serves its mesh (the gossip between gateway replicas) with tonic, so `smg launch
--enable-mesh` is a real tonic server on loopback. Its `mesh.gossip.Gossip/PingServer` is unary:
a `GossipMessage` whose `ping` is set is answered with the node's `NodeUpdate`, another payload
with INVALID_ARGUMENT, bytes that are no protobuf with INTERNAL, an unknown method with a
trailers-only UNIMPLEMENTED. The two messages are declared below with the fields the tests use
(smg's `mesh.gossip` package, field numbers as its server reads them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from trio_direct.engine import errors
from trio_direct.engine.transport import EngineChannel

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"smg exited with {process.returncode} before its mesh listened")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"smg's mesh did not listen on {port} within {timeout} s")


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
        wait_listening(mesh, process)
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
        for _ in range(300):  # more than hyper's default of 200 concurrent streams a connection
            nursery.start_soon(one)
    assert len(replies) == 300 and all(reply.status == 1 for reply in replies)
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
