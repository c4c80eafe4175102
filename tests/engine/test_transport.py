"""The trio gRPC client against grpclib servers: delivery, typed errors, and cancellation reaching the engine."""

from __future__ import annotations

import time

import h2.connection
import h2.settings
import pytest
import trio
from support import wait_until

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import errors
from trio_direct.engine.transport import ChannelPool, EngineChannel
from trio_direct.engine.transport import client as transport

GENERATE = "/sglang.runtime.v1.SglangService/Generate"
HEALTH = "/sglang.runtime.v1.SglangService/HealthCheck"
TYPES = {
    GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    HEALTH: (False, pb.HealthCheckRequest, pb.HealthCheckResponse),
}


@pytest.fixture
async def engine(fake_engine_factory):
    return await fake_engine_factory(TYPES)


async def test_unary_round_trip(engine):
    def health(call):
        call.send(pb.HealthCheckResponse(healthy=True))
        call.finish()

    engine.handlers[HEALTH] = health
    channel = engine.channel()
    reply = await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
    assert reply.healthy is True
    channel.close()


async def test_stream_delivers_every_message_in_order(engine):
    def generate(call):
        for i in range(500):
            call.send(pb.GenerateResponse(output_ids=[i]))
        call.finish()

    engine.handlers[GENERATE] = generate
    channel = engine.channel()
    async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=5) as stream:
        received = [message.output_ids[0] async for message in stream]
    assert received == list(range(500))
    channel.close()


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        ("UNAVAILABLE", errors.EngineUnavailable),
        ("DEADLINE_EXCEEDED", errors.EngineDeadlineExceeded),
        ("RESOURCE_EXHAUSTED", errors.EngineResourceExhausted),
        ("INVALID_ARGUMENT", errors.EngineInvalidArgument),
        ("INTERNAL", errors.EngineInternal),
        ("UNIMPLEMENTED", errors.EngineUnimplemented),
        ("CANCELLED", errors.EngineCancelled),
    ],
)
async def test_statuses_become_typed_errors_with_the_engine_message(engine, status, error_type):
    def generate(call):
        call.send(pb.GenerateResponse(output_ids=[7]))
        call.fail(status, f"engine says {status}")

    engine.handlers[GENERATE] = generate
    engine.handlers[HEALTH] = lambda call: call.fail(status, f"engine says {status}")
    channel = engine.channel()
    received = []
    with pytest.raises(error_type) as raised:
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=5) as stream:
            async for message in stream:
                received.append(list(message.output_ids))
    assert received == [[7]], "messages before the failure are delivered first"
    assert raised.value.message == f"engine says {status}"
    with pytest.raises(error_type):
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
    channel.close()


async def test_cancelling_the_trio_scope_resets_the_stream_at_the_engine(engine, nursery):
    """The engine sees the cancel within 50 ms (measured at the engine's handler)."""
    live_calls = []
    cancelled_at: list[float] = []

    def generate(call):
        call.on_cancel = lambda: cancelled_at.append(time.perf_counter())
        live_calls.append(call)

    async def tokens():
        while True:
            await trio.sleep(0.002)
            for call in live_calls:
                call.send(pb.GenerateResponse(output_ids=[1]))

    engine.handlers[GENERATE] = generate
    nursery.start_soon(tokens)
    channel = engine.channel()
    delays: list[float] = []
    for _ in range(5):
        with trio.move_on_after(10) as timeout:
            async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
                count = 0
                async for _message in stream:
                    count += 1
                    if count == 10:
                        break
                left_at = time.perf_counter()
        assert not timeout.cancelled_caught
        await wait_until(lambda: len(cancelled_at) == len(delays) + 1)
        delays.append(cancelled_at[-1] - left_at)
    assert max(delays) < 0.050, delays
    channel.close()


async def test_a_deadline_becomes_deadline_exceeded(engine):
    engine.handlers[HEALTH] = lambda call: None  # never answers
    channel = engine.channel()
    with pytest.raises(errors.EngineDeadlineExceeded):
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=0.2)
    channel.close()


async def test_an_engine_that_is_down_fails_fast_as_unavailable(aio_loop):
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    channel = EngineChannel("127.0.0.1", port, connect_timeout=5.0)
    started = trio.current_time()
    with pytest.raises(errors.EngineUnavailable) as raised:
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
    assert trio.current_time() - started < 1.0
    assert f"127.0.0.1:{port}" in str(raised.value)
    with pytest.raises(errors.EngineUnavailable):
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=5) as stream:
            async for _ in stream:
                pass
    with pytest.raises(errors.EngineUnavailable):
        await channel.connect_for_streams()
    assert channel.stream_connections == 0
    channel.close()


async def read_stream(channel: EngineChannel, into: list) -> None:
    """One Generate stream, read to its end into `into`."""
    async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=10) as stream:
        into.extend([message async for message in stream])


def advertise_stream_limit(monkeypatch: pytest.MonkeyPatch, limit: int | None) -> None:
    """Servers accepting connections from now on advertise (and enforce) this stream limit.

    h2 hardcodes 100 in a server's first SETTINGS frame; None advertises no limit at all.
    """

    class ServerSettings(h2.settings.Settings):
        def __init__(self, client: bool = True, initial_values: dict | None = None) -> None:
            if not client and initial_values:  # a server's own settings (its peer's have no initial values)
                initial_values = dict(initial_values)
                initial_values.pop(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
                if limit is not None:
                    initial_values[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = limit
            super().__init__(client, initial_values)

    monkeypatch.setattr(h2.connection, "Settings", ServerSettings)


async def engine_holding_streams(fake_engine_factory, monkeypatch: pytest.MonkeyPatch, limit: int) -> tuple:
    """An engine advertising `limit` streams per connection that answers each Generate with one message
    and holds it open; returns the engine and the held calls, in arrival order."""
    advertise_stream_limit(monkeypatch, limit)
    engine = await fake_engine_factory(TYPES)
    held: list = []

    def generate(call):
        held.append(call)
        call.send(pb.GenerateResponse(output_ids=[1]))

    engine.handlers[GENERATE] = generate
    return engine, held


@pytest.mark.parametrize(("limit", "connections"), [(4, 3), (None, 1)])
async def test_streams_past_the_engines_limit_all_run_and_control_calls_never_wait_behind_them(
    fake_engine_factory, monkeypatch, limit, connections
):
    """10 streams held open at once on a fresh channel; a health check still answers at once."""
    advertise_stream_limit(monkeypatch, limit)
    engine = await fake_engine_factory(TYPES)
    held, health_peers = [], []

    def generate(call):
        held.append(call)
        call.send(pb.GenerateResponse(output_ids=[1]))  # and never finish

    def health(call):
        health_peers.append(call.peer)
        call.send(pb.HealthCheckResponse(healthy=True))
        call.finish()

    engine.handlers[GENERATE] = generate
    engine.handlers[HEALTH] = health
    channel = engine.channel()
    started = []

    async def hold_a_stream() -> None:
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
            async for _message in stream:
                started.append(1)
                await trio.sleep_forever()

    async with trio.open_nursery() as streams:
        for _ in range(10):
            streams.start_soon(hold_a_stream)
        await wait_until(lambda: len(started) == 10)
        with trio.fail_after(2):
            reply = await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=2)
        assert reply.healthy
        stream_peers = {call.peer for call in held}
        assert len(stream_peers) == connections, "a connection per `limit` streams"
        assert health_peers[0] not in stream_peers, "control calls have a connection of their own"
        streams.cancel_scope.cancel()
    await wait_until(lambda: all(call.done for call in held))  # every stream reset at the engine
    channel.close()


async def test_a_tiny_stream_limit_does_not_open_connections_without_bound(fake_engine_factory, monkeypatch):
    """Past 32 connections a stream waits in grpclib's queue instead, and still completes."""
    advertise_stream_limit(monkeypatch, 1)
    engine = await fake_engine_factory(TYPES)
    peers, held = set(), []
    released = False

    def generate(call):
        peers.add(call.peer)
        call.send(pb.GenerateResponse(output_ids=[1]))
        if released:
            call.finish()
        else:
            held.append(call)

    engine.handlers[GENERATE] = generate
    channel = engine.channel()
    received: list = []

    async with trio.open_nursery() as streams:
        for _ in range(40):
            streams.start_soon(read_stream, channel, received)
        await wait_until(lambda: len(held) == 32)
        released = True
        for call in held:
            call.finish()
    assert len(received) == 40
    assert len(peers) == 32
    channel.close()


async def test_an_extra_connection_that_cannot_open_queues_the_stream_instead_of_failing_it(
    fake_engine_factory, monkeypatch
):
    """An engine too busy to accept another connection in time still serves on the ones it has."""
    engine, held = await engine_holding_streams(fake_engine_factory, monkeypatch, 2)
    channel = engine.channel()
    received: list = []

    async with trio.open_nursery() as streams:
        for _ in range(2):
            streams.start_soon(read_stream, channel, received)
        await wait_until(lambda: len(held) == 2)  # the first connection is full

        async def connect_times_out(self, timeout):
            raise OSError("simulated: the engine did not accept in time")  # open connections still work

        monkeypatch.setattr(transport._Connection, "_open_socket", connect_times_out)
        streams.start_soon(read_stream, channel, received)  # needs a second connection, which cannot open
        await trio.sleep(0.2)
        assert len(held) == 2, "queued on the full connection, not failed"
        for call in held[:1]:
            call.finish()
        await wait_until(lambda: len(held) == 3)  # a slot freed: the queued stream runs
        for call in held[1:]:
            call.finish()
    assert len(received) == 3
    channel.close()


async def test_a_new_stream_goes_to_the_least_loaded_connection(fake_engine_factory, monkeypatch):
    """Every connection keeps getting new streams (h2 forgets closed streams only when one opens)."""
    engine, held = await engine_holding_streams(fake_engine_factory, monkeypatch, 3)
    channel = engine.channel()
    received: list = []
    async with trio.open_nursery() as streams:
        for _ in range(6):
            streams.start_soon(read_stream, channel, received)
        await wait_until(lambda: len(held) == 6)
        first, second = sorted({call.peer for call in held}, key=lambda peer: held[0].peer != peer)
        on_first = [call for call in held if call.peer == first]
        on_second = [call for call in held if call.peer == second]
        assert len(on_first) == len(on_second) == 3
        on_first[0].finish()  # the first connection keeps 2 streams, the second 1
        on_second[0].finish()
        on_second[1].finish()
        await wait_until(lambda: len(received) == 3)  # each stream is read to its end first
        streams.start_soon(read_stream, channel, received)
        await wait_until(lambda: len(held) == 7)
        assert held[-1].peer == second
        for call in held:
            if not call.done:
                call.finish()
    channel.close()


async def test_a_connection_keeps_no_state_of_ended_streams(engine):
    def generate(call):
        call.send(pb.GenerateResponse(output_ids=[1]))
        call.finish()

    engine.handlers[GENERATE] = generate
    channel = engine.channel()
    received: list = []
    for _ in range(40):
        await read_stream(channel, received)
    assert len(received) == 40
    (connection,) = channel._streaming
    assert connection.wire.streams == {} and connection.open_streams == 0
    channel.close()


async def test_connecting_ahead_opens_the_connection_the_first_streams_then_use(engine):
    peers = []

    def generate(call):
        peers.append(call.peer)
        call.send(pb.GenerateResponse(output_ids=[1]))
        call.finish()

    engine.handlers[GENERATE] = generate
    channel = engine.channel()
    assert channel.stream_connections == 0
    await channel.connect_for_streams()
    assert channel.stream_connections == 1
    await channel.connect_for_streams()  # already connected: nothing more
    assert channel.stream_connections == 1
    assert [connection.open_streams for connection in channel._streaming] == [0]  # no stream slot held
    received: list = []
    async with trio.open_nursery() as streams:
        for _ in range(3):
            streams.start_soon(read_stream, channel, received)
    assert len(received) == 3 and len(set(peers)) == 1
    assert channel.stream_connections == 1
    channel.close()


async def test_a_stream_that_leaves_while_its_connection_opens_leaves_the_connect_to_the_others(engine, monkeypatch):
    attempts = []
    connect = transport._Connection._open_socket

    async def slow_connect(self, timeout):
        attempts.append(self)
        await trio.sleep(0.3)  # long enough for the first stream's client to leave meanwhile
        return await connect(self, timeout)

    monkeypatch.setattr(transport._Connection, "_open_socket", slow_connect)
    engine.handlers[GENERATE] = lambda call: (call.send(pb.GenerateResponse(output_ids=[1])), call.finish())
    channel = engine.channel()
    received: list = []
    leaver = trio.CancelScope()

    async def leaving_stream() -> None:
        with leaver:
            await read_stream(channel, [])

    async with trio.open_nursery() as streams:
        streams.start_soon(leaving_stream)
        await wait_until(lambda: bool(attempts))  # its connect is under way
        for _ in range(3):
            streams.start_soon(read_stream, channel, received)
        await trio.sleep(0.05)
        leaver.cancel()
    assert leaver.cancelled_caught and len(received) == 3
    assert len(attempts) == 1  # one connect, however many streams waited and whoever left
    assert channel.stream_connections == 1
    channel.close()


async def test_closing_a_channel_drops_every_connection(fake_engine_factory, monkeypatch):
    engine, held = await engine_holding_streams(fake_engine_factory, monkeypatch, 2)
    engine.handlers[HEALTH] = lambda call: (call.send(pb.HealthCheckResponse(healthy=True)), call.finish())
    channel = engine.channel()
    failures = []

    async def hold_a_stream() -> None:
        try:
            async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
                async for _message in stream:
                    pass
        except errors.EngineUnavailable:
            failures.append(1)

    async with trio.open_nursery() as streams:
        for _ in range(5):
            streams.start_soon(hold_a_stream)
        await wait_until(lambda: len(held) == 5)
        assert (await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=2)).healthy
        channel.close()
        await wait_until(lambda: len(failures) == 5)  # in-flight streams on all three connections fail
    await wait_until(lambda: all(call.done for call in held))
    assert (await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=2)).healthy
    channel.close()


async def test_the_pool_shares_one_channel_per_engine_and_reconnects_after_a_restart(fake_engine_factory):
    engine = await fake_engine_factory(TYPES)

    def health(call):
        call.send(pb.HealthCheckResponse(healthy=True))
        call.finish()

    engine.handlers[HEALTH] = health
    pool = ChannelPool(connect_timeout=2.0)
    first = pool.get("127.0.0.1", engine.port)
    assert pool.get("127.0.0.1", engine.port) is first
    assert (await first.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)).healthy
    first.close()  # a dropped connection is re-established on the next call
    assert (await first.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)).healthy
    pool.close()


async def test_a_reader_that_stops_holds_back_its_engine_stream_after_one_window(engine):
    """Flow control as backpressure: unread messages stay at the engine, not in the frontend."""
    calls = []

    def generate(call):
        calls.append(call)
        for i in range(15_000):
            call.send(pb.GenerateResponse(output_ids=[i] * 20))  # ~45 bytes each on the wire
        call.finish()

    engine.handlers[GENERATE] = generate
    channel = engine.channel()
    async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
        first = await stream.__anext__()
        await trio.sleep(0.5)  # the reader stalls; the engine has ~650 KB to send
        buffered = stream._stream._queued_bytes
        assert buffered <= channel.config.stream_window
        assert calls[0]._replies, "the engine still holds replies it could not send"
        rest = [message.output_ids[0] async for message in stream]
    assert [first.output_ids[0], *rest] == list(range(15_000))
    channel.close()


async def test_an_engine_that_speaks_garbage_fails_calls_as_unavailable_without_hanging(aio_loop, nursery):
    from functools import partial

    async def garbage(stream: trio.SocketStream) -> None:
        await stream.send_all(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # a valid empty SETTINGS
        await stream.receive_some(65536)  # the request
        await stream.send_all(b"\x00\x00\x05\x00\x00\x00\x00\x00\x63hello")  # DATA on stream 99
        await trio.sleep_forever()

    (listener,) = await nursery.start(partial(trio.serve_tcp, garbage, 0, host="127.0.0.1"))
    channel = EngineChannel("127.0.0.1", listener.socket.getsockname()[1], connect_timeout=2.0)
    with trio.fail_after(5), pytest.raises(errors.EngineUnavailable) as raised:
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
            async for _ in stream:
                pass
    assert "PROTOCOL_ERROR" in str(raised.value)
    channel.close()


async def test_cancelling_a_unary_work_call_resets_it_at_the_engine(engine):
    cancelled = []

    def health(call):
        call.on_cancel = lambda: cancelled.append(1)  # never answers

    engine.handlers[HEALTH] = health
    channel = engine.channel()
    with trio.move_on_after(0.3):
        await channel.unary_work(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=None)
    await wait_until(lambda: cancelled == [1])
    assert channel.idle
    channel.close()


async def test_calls_outside_the_transport_fail_as_unavailable_with_the_reason():
    channel = EngineChannel("127.0.0.1", 1, connect_timeout=1.0)
    with pytest.raises(errors.EngineUnavailable, match="open_transport"):
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=1)
    channel.close()


_GRPCLIB_FIRST = """
import grpclib.client  # before trio-asyncio: grpclib binds asyncio.current_task first
import trio
from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.transport import EngineChannel, open_transport
from trio_direct.engine.transport.server import RpcMethod, serve_grpc

def health(call):
    call.send(pb.HealthCheckResponse(healthy=True))
    call.finish()

async def main():
    path = "/sglang.runtime.v1.SglangService/HealthCheck"
    method = RpcMethod(path, False, pb.HealthCheckRequest, pb.HealthCheckResponse, health)
    async with open_transport(), trio.open_nursery() as nursery:
        channel = EngineChannel("127.0.0.1", await nursery.start(serve_grpc, [method], "127.0.0.1", 0))
        reply = await channel.unary(path, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
        assert reply.healthy
        channel.close()
        nursery.cancel_scope.cancel()

trio.run(main)
"""


def test_the_grpclib_server_works_when_grpclib_was_imported_before_trio_asyncio():
    """On Python 3.12+ asyncio.current_task is C and blind to trio-asyncio's loop unless patched;
    the mock engine's server (grpclib on a trio-asyncio loop of its own) depends on the patch."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _GRPCLIB_FIRST], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
