"""A scriptable in-process gRPC server for transport and adapter tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from trio_direct.engine.transport import EngineChannel, RpcMethod, ServerCall, serve_grpc


class FakeEngine:
    """Serves whatever handlers a test installs, by method path, on an ephemeral loopback port."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[ServerCall], None]] = {}
        self.port = 0

    def channel(self) -> EngineChannel:
        return EngineChannel("127.0.0.1", self.port, connect_timeout=2.0)

    def methods(self, types: dict[str, tuple[bool, type, type]]) -> list[RpcMethod]:
        def dispatch(path: str) -> Callable[[ServerCall], None]:
            return lambda call: self.handlers[path](call)

        return [RpcMethod(path, streaming, req, resp, dispatch(path)) for path, (streaming, req, resp) in types.items()]


@pytest.fixture
def fake_engine_factory(aio_loop, nursery):
    async def start(types: dict[str, tuple[bool, type, type]]) -> FakeEngine:
        engine = FakeEngine()
        engine.port = await nursery.start(serve_grpc, engine.methods(types), "127.0.0.1", 0)
        return engine

    return start
