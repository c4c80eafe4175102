"""HTTP/2 keepalive pings to engines: on by default, spaced so that a stock grpcio server never
counts them as abuse (its minimum is 5 minutes without data), off with an interval of 0, and a
connection whose pings go unanswered is closed with its calls failing as unavailable."""

from __future__ import annotations

from functools import partial

import trio

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import errors
from trio_direct.engine.transport import ChannelPool, EngineChannel, client_config
from trio_direct.engine.transport.client import DEFAULT_KEEPALIVE_INTERVAL, HTTP2_CONFIG

GRPCIO_MIN_PING_INTERVAL_WITHOUT_DATA = 300.0
GENERATE = "/sglang.runtime.v1.SglangService/Generate"


def test_default_pings_stay_above_grpcios_minimum():
    config = client_config()
    assert config.keepalive_interval == DEFAULT_KEEPALIVE_INTERVAL > GRPCIO_MIN_PING_INTERVAL_WITHOUT_DATA
    assert config.stream_window == HTTP2_CONFIG.stream_window


def test_flags_set_the_interval_and_timeout_and_zero_turns_pings_off():
    config = client_config(2.5, 1.0)
    assert (config.keepalive_interval, config.keepalive_timeout) == (2.5, 1.0)
    assert client_config(0, 20) is HTTP2_CONFIG
    pool = ChannelPool(config=config)
    assert pool.get("127.0.0.1", 1).config is config


async def test_an_engine_that_stops_answering_pings_fails_its_streams_as_unavailable(aio_loop, nursery):
    """A peer that sent its SETTINGS and then went silent (a stopped process): only pings tell."""

    async def silent_engine(stream: trio.SocketStream) -> None:
        await stream.send_all(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS, empty
        await trio.sleep_forever()

    (listener,) = await nursery.start(partial(trio.serve_tcp, silent_engine, 0, host="127.0.0.1"))
    port = listener.socket.getsockname()[1]
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0, config=client_config(0.2, 0.3))
    with trio.fail_after(5):
        started = trio.current_time()
        try:
            async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as s:
                async for _ in s:
                    pass
        except errors.EngineUnavailable as error:
            assert "keepalive" in str(error)
        else:
            raise AssertionError("the stream did not fail")
    assert trio.current_time() - started >= 0.4
    channel.close()


async def test_an_engine_answering_pings_keeps_its_streams(fake_engine_factory):
    engine = await fake_engine_factory({GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse)})
    calls = []

    def generate(call):
        calls.append(call)
        call.send(pb.GenerateResponse(output_ids=[1]))

    engine.handlers[GENERATE] = generate
    channel = EngineChannel("127.0.0.1", engine.port, connect_timeout=2.0, config=client_config(0.05, 0.5))
    async with channel.open_stream(GENERATE, pb.GenerateRequest(), pb.GenerateResponse, timeout=None) as stream:
        first = await stream.__anext__()
        await trio.sleep(0.5)  # ten pings
        calls[0].send(pb.GenerateResponse(output_ids=[2]))
        calls[0].finish()
        rest = [message async for message in stream]
    assert [m.output_ids[0] for m in [first, *rest]] == [1, 2]
    channel.close()
