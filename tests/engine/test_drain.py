"""Draining an engine at the transport: its open streams can be ended with an error, its channel
retired so that no call reaches it any more, and its idleness awaited."""

from __future__ import annotations

import pytest
import trio
from support import wait_until

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import errors
from trio_direct.engine.transport import ChannelPool

GENERATE = "/sglang.runtime.v1.SglangService/Generate"
HEALTH = "/sglang.runtime.v1.SglangService/HealthCheck"
TYPES = {
    GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    HEALTH: (False, pb.HealthCheckRequest, pb.HealthCheckResponse),
}


@pytest.fixture
async def engine(fake_engine_factory):
    return await fake_engine_factory(TYPES)


def stuck_generation(engine, cancelled: list) -> None:
    """Each stream gets one message, then hangs until its client resets it (noted in `cancelled`)."""

    def generate(call):
        call.send(pb.GenerateResponse(output_ids=[1]))
        call.on_cancel = lambda: cancelled.append(True)

    engine.handlers[GENERATE] = generate


async def test_failing_the_streams_ends_each_reader_with_the_error_after_what_arrived(engine):
    cancelled: list[bool] = []
    stuck_generation(engine, cancelled)
    channel = engine.channel()
    results: list[tuple[list[int], str]] = []

    async def read() -> None:
        received: list[int] = []
        try:
            async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
                async for message in stream:
                    received.extend(message.output_ids)
        except errors.EngineUnavailable as error:
            results.append((received, error.message))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(read)
        await wait_until(lambda: channel.streams_in_flight == 3)
        assert not channel.idle
        await trio.sleep(0.05)  # the first message of each arrives
        assert channel.fail_streams(errors.EngineUnavailable("engine drained")) == 3
    assert results == [([1], "engine drained")] * 3
    assert channel.streams_in_flight == 0 and channel.idle
    await wait_until(lambda: len(cancelled) == 3)  # each HTTP/2 stream was reset: the engine saw a cancel
    channel.close()


async def test_wait_idle_returns_once_the_last_stream_closed(engine):
    stuck_generation(engine, [])
    channel = engine.channel()
    release = trio.Event()
    idle_at: list[bool] = []

    async def hold_a_stream() -> None:
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
            await stream.__anext__()
            await release.wait()

    async def wait_idle() -> None:
        await channel.wait_idle()
        idle_at.append(release.is_set())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hold_a_stream)
        await wait_until(lambda: channel.streams_in_flight == 1)
        nursery.start_soon(wait_idle)
        await trio.sleep(0.05)
        assert idle_at == []
        release.set()
    assert idle_at == [True]
    await channel.wait_idle()  # idle already: returns at once
    channel.close()


async def test_a_retired_channel_fails_every_call_without_connecting_again(engine):
    def health(call):
        call.send(pb.HealthCheckResponse(healthy=True))
        call.finish()

    engine.handlers[HEALTH] = health
    pool = ChannelPool(connect_timeout=2.0)
    channel = pool.get("127.0.0.1", engine.port)
    assert (await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)).healthy
    pool.retire("127.0.0.1", engine.port)
    assert channel.retired
    with pytest.raises(errors.EngineUnavailable, match="removed from the fleet"):
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=5)
    with pytest.raises(errors.EngineUnavailable, match="removed from the fleet"):
        async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=5) as stream:
            async for _ in stream:
                pass
    assert channel.stream_connections == 0 and channel.idle
    assert pool.get("127.0.0.1", engine.port) is not channel  # an engine joining there later gets a new one
    pool.close()
