"""The trio gRPC client against a grpcio server (gRPC's C core): the peer most engines' Python
servers run on, with its own flow control, settings and error paths."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import trio

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine import errors
from trio_direct.engine.transport import EngineChannel

SERVICE = "sglang.runtime.v1.SglangService"
GENERATE = f"/{SERVICE}/Generate"
HEALTH = f"/{SERVICE}/HealthCheck"


class Engine:
    """Handlers for a grpcio server; what they saw, for the test to check."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.request_sizes: list[int] = []
        self.server: grpc.Server | None = None

    def generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        self.request_sizes.append(len(request.input_ids))
        context.add_callback(self.cancelled.set)
        mode = request.rid
        if mode == "fail":
            yield pb.GenerateResponse(output_ids=[7])
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full: 100% busy")
        if mode == "forever":
            while context.is_active():
                yield pb.GenerateResponse(output_ids=[1])
                time.sleep(0.005)
            return
        for i in range(int(mode or "500")):
            yield pb.GenerateResponse(output_ids=[i])

    def health(self, request: pb.HealthCheckRequest, context: grpc.ServicerContext) -> pb.HealthCheckResponse:
        if context.time_remaining() is not None and context.time_remaining() < 5:
            time.sleep(context.time_remaining() + 0.5)  # past the caller's deadline
        return pb.HealthCheckResponse(healthy=True)


@pytest.fixture
def grpcio_engine() -> Iterator[tuple[Engine, int]]:
    engine = Engine()
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            engine.generate, pb.GenerateRequest.FromString, pb.GenerateResponse.SerializeToString
        ),
        "HealthCheck": grpc.unary_unary_rpc_method_handler(
            engine.health, pb.HealthCheckRequest.FromString, pb.HealthCheckResponse.SerializeToString
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    engine.server = server
    yield engine, port
    server.stop(None)


async def test_unary_stream_and_a_large_request(aio_loop, grpcio_engine):
    engine, port = grpcio_engine
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
    reply = await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=30)
    assert reply.healthy
    # 400 KB of token ids: far past grpcio's initial 64 KiB windows
    request = pb.GenerateRequest(rid="500", input_ids=list(range(100_000)))
    async with channel.open_stream(GENERATE, request, pb.GenerateResponse, timeout=None) as stream:
        received = [message.output_ids[0] async for message in stream]
    assert received == list(range(500))
    assert engine.request_sizes == [100_000]
    channel.close()


async def test_a_status_after_messages_is_a_typed_error_with_its_message(aio_loop, grpcio_engine):
    _, port = grpcio_engine
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
    received = []
    with pytest.raises(errors.EngineResourceExhausted) as raised:
        async with channel.open_stream(
            GENERATE, pb.GenerateRequest(rid="fail"), pb.GenerateResponse, timeout=None
        ) as s:
            async for message in s:
                received.append(message.output_ids[0])
    assert received == [7]
    assert raised.value.message == "queue full: 100% busy"  # percent-encoded on the wire
    channel.close()


async def test_leaving_a_stream_cancels_it_at_the_engine_and_a_deadline_is_sent(aio_loop, grpcio_engine):
    engine, port = grpcio_engine
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
    async with channel.open_stream(GENERATE, pb.GenerateRequest(rid="forever"), pb.GenerateResponse, timeout=None) as s:
        async for _ in s:
            break
    with trio.fail_after(5):
        while not engine.cancelled.is_set():
            await trio.sleep(0.01)
    with pytest.raises(errors.EngineDeadlineExceeded):
        await channel.unary(HEALTH, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=0.3)
    channel.close()


async def test_a_server_that_stops_fails_the_stream_as_unavailable(aio_loop, grpcio_engine):
    engine, port = grpcio_engine
    channel = EngineChannel("127.0.0.1", port, connect_timeout=2.0)
    with pytest.raises(errors.EngineError) as raised:
        async with channel.open_stream(
            GENERATE, pb.GenerateRequest(rid="forever"), pb.GenerateResponse, timeout=None
        ) as stream:
            async for _ in stream:
                break
            # a stop without grace: GOAWAY, then the streams end
            await trio.to_thread.run_sync(lambda: engine.server.stop(None).wait())
            async for _ in stream:
                pass
    assert isinstance(raised.value, (errors.EngineUnavailable, errors.EngineCancelled))
    channel.close()
