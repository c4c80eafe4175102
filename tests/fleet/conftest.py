"""Mock engines in the test's nursery, and a channel pool, for probe and fleet tests."""

from __future__ import annotations

import math
import socket

import pytest

from trio_direct.engine.transport import ChannelPool
from trio_direct.mock.server import MockEngineConfig, RunningMockEngine, run_mock_engine


@pytest.fixture
def pool(aio_loop):
    pool = ChannelPool(connect_timeout=2.0)
    yield pool
    pool.close()


@pytest.fixture
def start_mock(aio_loop, nursery):
    """Start a mock engine (`MockEngineConfig` fields as keywords) on an ephemeral loopback port."""

    async def start(**options) -> RunningMockEngine:
        options.setdefault("speedup", math.inf)
        return await nursery.start(run_mock_engine, MockEngineConfig(**options))

    return start


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound and released; fine for a refused connection)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
