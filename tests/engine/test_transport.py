"""The trio <-> grpclib bridge: delivery, typed errors, and cancellation reaching the engine."""

from __future__ import annotations

import time

import pytest
import trio

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import errors
from trio_direct.engine.transport import ChannelPool, EngineChannel

from support import wait_until

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
    delays = []
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
