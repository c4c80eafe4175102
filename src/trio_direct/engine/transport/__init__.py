"""The asyncio boundary: grpclib driven from trio. No other package of trio-direct imports asyncio,
trio-asyncio or grpclib's runtime.

grpclib is asyncio-only, so it runs on a trio-asyncio loop in the *bridge* shape: every call enters
asyncio exactly once, and messages cross to trio through a memory channel with ``send_nowait``
(safe: the asyncio loop runs on the trio thread). Cancelling the trio side cancels that one asyncio
task, whose ``async with channel.request(...)`` exit then runs *inside asyncio* and resets the
HTTP/2 stream, so the engine sees the cancel. Wrapping grpclib's stream context manager from trio
instead leaks the stream when the trio side is cancelled (the exit runs outside asyncio and never
reaches the wire).

- `loop`: the trio-asyncio loop every call needs, and how trio code calls into it.
- `client`: connections to an engine and the calls the frontend makes (`EngineChannel`).
- `server`: gRPC serving for the mock engine and tests (never imported by the frontend).

Every grpclib and connection failure leaves this package as a typed `EngineError`.
"""

from trio_direct.engine.transport.client import ChannelPool, EngineChannel, MessageStream, client_config
from trio_direct.engine.transport.loop import open_asyncio_loop

__all__ = ["ChannelPool", "EngineChannel", "MessageStream", "client_config", "open_asyncio_loop"]
