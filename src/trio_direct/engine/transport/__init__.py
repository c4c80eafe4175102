"""Engine gRPC transport, in trio: no asyncio, trio-asyncio or grpclib in the frontend process.

- `wire`: a sans-IO HTTP/2 client connection made for gRPC (frames in, messages and outcomes out).
- `client`: its trio shell: connections to an engine and the calls the frontend makes
  (`EngineChannel`), running in the nursery `open_transport()` opens around the program.
- `server`: gRPC serving for the mock engine and tests, on grpclib and trio-asyncio (never
  imported by the frontend; it opens its own trio-asyncio loop).

Every protocol and connection failure leaves this package as a typed `EngineError`.
"""

from trio_direct.engine.transport.client import (
    ChannelPool,
    ClientConfig,
    EngineChannel,
    MessageStream,
    client_config,
    open_transport,
)

#: The former name of `open_transport` (engine calls ran on a trio-asyncio loop then).
open_asyncio_loop = open_transport

__all__ = [
    "ChannelPool",
    "ClientConfig",
    "EngineChannel",
    "MessageStream",
    "client_config",
    "open_asyncio_loop",
    "open_transport",
]
