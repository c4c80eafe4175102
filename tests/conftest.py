"""Fixtures shared by every test folder."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import zmq
from state_servers import missing_server
from support import FakeEngine

from trio_direct.engine.transport import EngineChannel, open_transport
from trio_direct.engine.transport.loop import open_asyncio_loop
from trio_direct.engine.transport.server import serve_grpc
from trio_direct.mock.server import MockEngineConfig, RunningMockEngine, run_mock_engine
from trio_direct.mock.tiny_model import ensure_tiny_model


@pytest.fixture
async def aio_loop():
    """The engine transport's nursery and the trio-asyncio loop in-process engines (grpclib servers)
    serve on; pytest-trio carries their contextvars into the test."""
    async with open_asyncio_loop() as loop, open_transport():
        yield loop


@pytest.fixture
def fake_engine_factory(aio_loop, nursery):
    """Start scriptable in-process engines: `await fake_engine_factory({path: (streaming, Req, Resp)})`."""

    async def start(types: dict[str, tuple[bool, type, type]]) -> FakeEngine:
        engine = FakeEngine()
        engine.port = await nursery.start(serve_grpc, engine.methods(types), "127.0.0.1", 0)
        return engine

    return start


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny ChatML model directory, written once per test session."""
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny-chatml")


@pytest.fixture
async def mock_engine_factory(aio_loop, tiny_model):
    """Start in-process mock engines: `running = await mock_engine_factory(dp_size=2, ...)`.

    Defaults for tests: the tiny model, `speedup=inf`, ephemeral gRPC and bootstrap ports. The
    engines stop when the test ends.
    """
    async with trio.open_nursery() as nursery:

        async def start(**overrides) -> RunningMockEngine:
            options = {
                "model_path": str(tiny_model),
                "speedup": math.inf,
                "disaggregation_bootstrap_port": 0,
                **overrides,
            }
            return await nursery.start(run_mock_engine, MockEngineConfig(**options))

        yield start
        nursery.cancel_scope.cancel()


@pytest.fixture
async def dial(aio_loop):
    """Open client channels to in-process engines: `channel = dial(port)`; closed after the test."""
    channels: list[EngineChannel] = []

    def open_channel(port: int, host: str = "127.0.0.1") -> EngineChannel:
        channel = EngineChannel(host, port, connect_timeout=2.0)
        channels.append(channel)
        return channel

    yield open_channel
    for channel in channels:
        channel.close()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZMQ context that fails the test if a socket was left open."""
    context = zmq.Context()
    yield context
    leaked = [sock for sock in list(context._sockets) if not sock.closed]
    context.destroy(linger=0)  # term() would hang on a leaked socket
    assert not leaked, "sockets left open"


#: The version scripts/install-test-servers.sh pins.
SMG_VERSION = "1.13.0"
SMG_VENV = Path.home() / ".cache" / "trio-direct-smg-venv"


@pytest.fixture(scope="session")
def smg_executable() -> str:
    """smg 1.13, the peer gateway: `$TRIO_DIRECT_SMG`, `smg` on PATH, or the one
    `scripts/install-test-servers.sh` installs into `~/.cache/trio-direct-smg-venv` (where the
    benchmarks look for it too). Missing, the test skips, saying so; under CI, which runs that
    script, it fails instead, as the Redis and PostgreSQL tests do."""
    for candidate in (os.environ.get("TRIO_DIRECT_SMG"), shutil.which("smg"), str(SMG_VENV / "bin" / "smg")):
        if candidate and Path(candidate).is_file():
            return candidate
    missing_server(f"smg=={SMG_VERSION}")
