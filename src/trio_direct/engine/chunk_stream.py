"""The chunk iterator both API adapters hand out."""

from __future__ import annotations

from typing import Any, Protocol

import trio

from trio_direct.engine.errors import EngineError, EngineInternal
from trio_direct.engine.transport import MessageStream
from trio_direct.engine.types import GenerateChunk


class ChunkDecoder(Protocol):
    """Per-call wire decoding state: `finished` turns true with the generation's last message."""

    finished: bool

    def decode(self, message: Any) -> GenerateChunk | None:
        """The chunk a wire message carries, or None when it carries nothing new."""


class ChunkStream:
    """Async iterator of `GenerateChunk`s (a `GenerateStream`).

    Ends after the chunk that carries the finish reason. A stream that closes before that is an engine
    error, never a silent short answer.
    """

    __slots__ = ("_stream", "_decoder", "_engine")

    def __init__(self, stream: MessageStream, decoder: ChunkDecoder, engine: str) -> None:
        self._stream = stream
        self._decoder = decoder
        self._engine = engine

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> GenerateChunk:
        while not self._decoder.finished:
            try:
                message = await self._stream.__anext__()
            except StopAsyncIteration:
                raise EngineInternal("stream ended without a final message", engine=self._engine) from None
            chunk = self._decoder.decode(message)
            if chunk is not None:
                return chunk
        raise StopAsyncIteration

    async def wait_written(self) -> None:
        written = self._stream.written
        if written.is_set():  # as it always is with this transport: no task switch for nothing
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            await written.wait()

    def fail(self, error: EngineError) -> bool:
        """End the stream for its reader with `error`, after what already arrived (a hung engine)."""
        return self._stream.fail(error)

    def wake(self) -> bool:
        """Interrupt a reader waiting for the next chunk with `StreamWakeup` (an SSE keep-alive)."""
        return self._stream.wake()

    def next_nowait(self) -> GenerateChunk:
        """The next chunk if its message already arrived; raises trio.WouldBlock otherwise."""
        while not self._decoder.finished:
            try:
                message = self._stream.receive_nowait()
            except trio.EndOfChannel:
                raise trio.WouldBlock from None  # let the awaiting path report how the stream ended
            chunk = self._decoder.decode(message)
            if chunk is not None:
                return chunk
        raise StopAsyncIteration
