"""pyzmq sockets driven by trio, without threads.

A ZMQ socket exposes one file descriptor (``zmq.FD``) that becomes readable when the
socket's event state *changes* -- it is edge-triggered and says nothing about whether a
message is queued. The only reliable readiness test is ``zmq.EVENTS``. So every wait here
is "try non-blocking, re-check ``EVENTS``, only then sleep on the FD"; skipping the
re-check strands messages that were already queued when the edge fired.
"""

from __future__ import annotations

from collections.abc import Sequence

import trio
import zmq

__all__ = ["TrioSocket"]

_PEER_FULL_BACKOFF = 0.001


class TrioSocket:
    """One ZMQ socket used from trio tasks.

    Several tasks may wait on the same socket (say one receiving, one sending on a
    DEALER): one of them watches the FD and wakes the others on every edge, because
    trio allows only one waiter per FD.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        socket_type: int,
        *,
        rcvhwm: int | None = None,
        sndhwm: int | None = None,
    ) -> None:
        self._sock = ctx.socket(socket_type)
        # Never let a pending message keep the context (and ctx.term()) alive.
        self._sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self._sock.setsockopt(zmq.RCVHWM, rcvhwm)
        if sndhwm is not None:
            self._sock.setsockopt(zmq.SNDHWM, sndhwm)
        self._fd: int = self._sock.getsockopt(zmq.FD)
        self._closed = False
        self._watching = False
        self._edge = trio.Event()

    @property
    def socket(self) -> zmq.Socket:
        """The wrapped socket, for options; do not receive or send on it directly."""
        return self._sock

    @property
    def closed(self) -> bool:
        return self._closed

    def bind(self, endpoint: str) -> str:
        """Bind and return the concrete endpoint (an ephemeral port resolved)."""
        self._sock.bind(endpoint)
        return self._sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def connect(self, endpoint: str) -> None:
        self._sock.connect(endpoint)

    def subscribe(self, topic: bytes = b"") -> None:
        self._sock.setsockopt(zmq.SUBSCRIBE, topic)

    async def recv_multipart(self) -> list[bytes]:
        """Receive one multipart message."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self._check_open()
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
            else:
                # The message is already taken off the socket: do not lose it to a cancel.
                await trio.lowlevel.cancel_shielded_checkpoint()
                return frames
            await self._wait(zmq.POLLIN)

    async def recv_batch(self, max_batch: int = 256) -> list[list[bytes]]:
        """Receive every queued message, up to ``max_batch``, waiting for at least one.

        One checkpoint per batch keeps a flood from starving the other tasks while
        costing far less than a checkpoint per message.
        """
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        await trio.lowlevel.checkpoint_if_cancelled()
        batch: list[list[bytes]] = []
        while True:
            self._check_open()
            while len(batch) < max_batch:
                try:
                    batch.append(self._sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
            if batch:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return batch
            await self._wait(zmq.POLLIN)

    def send_multipart_nowait(self, frames: Sequence[bytes]) -> bool:
        """Queue a message without waiting; False when the socket would block.

        A PUB socket never blocks: at its send HWM libzmq drops the message itself and
        this still returns True (that drop is what subscribers later see as a seq gap).
        """
        self._check_open()
        try:
            self._sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    async def send_multipart(self, frames: Sequence[bytes]) -> None:
        """Send a message, waiting while the socket is at its send HWM."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self._check_open()
            try:
                self._sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                pass
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
                # Writable for some peer but not this one (a ROUTER with ROUTER_MANDATORY
                # whose target is at its HWM): no FD edge will come for it, so poll gently.
                await trio.sleep(_PEER_FULL_BACKOFF)
            else:
                await self._wait(zmq.POLLOUT)

    def close(self) -> None:
        """Close now; tasks blocked on this socket get ``trio.ClosedResourceError``.

        Also callable outside ``trio.run`` (no task can be waiting there).
        """
        if self._closed:
            return
        self._closed = True
        if trio.lowlevel.in_trio_run():
            # Wake the FD watcher before the FD goes away (trio requires this order).
            trio.lowlevel.notify_closing(self._fd)
        self._sock.close(linger=0)
        self._edge.set()

    def __enter__(self) -> TrioSocket:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("ZMQ socket was closed")

    async def _wait(self, mask: int) -> None:
        """Sleep until ``EVENTS`` has ``mask`` (reading ``EVENTS`` also re-arms the edge)."""
        while True:
            self._check_open()
            if self._sock.getsockopt(zmq.EVENTS) & mask:
                return
            if self._watching:
                await self._edge.wait()
                continue
            self._watching = True
            try:
                await trio.lowlevel.wait_readable(self._fd)
            finally:
                self._watching = False
                edge, self._edge = self._edge, trio.Event()
                edge.set()
