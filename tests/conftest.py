"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from support import FakeEngine
from trio_direct.engine.transport import open_asyncio_loop, serve_grpc


@pytest.fixture
async def aio_loop():
    """The trio-asyncio loop engine calls need; pytest-trio carries its contextvar into the test."""
    async with open_asyncio_loop() as loop:
        yield loop


@pytest.fixture
def fake_engine_factory(aio_loop, nursery):
    """Start scriptable in-process engines: `await fake_engine_factory({path: (streaming, Req, Resp)})`."""
    async def start(types: dict[str, tuple[bool, type, type]]) -> FakeEngine:
        engine = FakeEngine()
        engine.port = await nursery.start(serve_grpc, engine.methods(types), "127.0.0.1", 0)
        return engine

    return start
