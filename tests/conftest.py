"""Fixtures shared by every test folder."""

from __future__ import annotations

import pytest

from trio_direct.engine.transport import open_asyncio_loop


@pytest.fixture
async def aio_loop():
    """The trio-asyncio loop engine calls need; pytest-trio carries its contextvar into the test."""
    async with open_asyncio_loop() as loop:
        yield loop
