"""Small helpers for tests (importable from every test folder: `from support import ...`)."""

from __future__ import annotations

from collections.abc import Callable

import trio

from trio_direct.engine.transport import EngineChannel, RpcMethod, ServerCall


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)


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
