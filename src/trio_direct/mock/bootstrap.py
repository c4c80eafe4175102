"""PD bootstrap rendezvous between a mock prefill engine and a mock decode engine.

Real SGLang pairs the two legs of one request only by the shared ``(bootstrap_host,
bootstrap_port, bootstrap_room)``: the prefill engine listens on its bootstrap port, the
decode engine dials it, and the KV cache flows once both legs are there -- in either
arrival order. The mock keeps that shape over real TCP so the frontend's PD code meets the
same coupling: a decode leg that hangs until its prefill leg shows up, and a failure on
either leg that ends the other.

Wire (newline-delimited JSON): decode sends ``{"room": N}``; the prefill side answers
once with ``{"status": "done", "tokens": n}`` after the simulated transfer, or
``{"status": "aborted" | "unmatched" | "error", "message": ...}``, then closes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

__all__ = [
    "BootstrapFailed",
    "BootstrapServer",
    "BootstrapTimeout",
    "PeerHandle",
    "open_bootstrap_server",
    "receive_kv",
]

#: Aborted rooms remembered at most (oldest forgotten first).
_MAX_ABORTED_ROOMS = 100_000
#: How long a decode connection waits for its prefill leg before it is told "unmatched".
DEFAULT_UNMATCHED_TIMEOUT = 30.0
_HELLO_TIMEOUT = 5.0
_WRITE_TIMEOUT = 5.0
_MAX_LINE = 64 * 1024
_RETRY_FIRST = 0.01
_RETRY_MAX = 0.5


class BootstrapTimeout(Exception):
    """The other leg did not arrive (or finish) in time."""


class BootstrapFailed(Exception):
    """The other leg went away or refused the rendezvous; ``message`` says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- wire: sans-IO framing -------------------------------------------------------------


def encode_message(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class MessageBuffer:
    """Splits received bytes into JSON-object lines."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data
        if b"\n" not in self._buf and len(self._buf) > _MAX_LINE:
            raise ValueError("bootstrap message too long")

    def next_message(self) -> dict[str, Any] | None:
        """The next complete message, or None until more bytes arrive."""
        end = self._buf.find(b"\n")
        if end < 0:
            return None
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("bootstrap message must be a JSON object")
        return message


async def _receive_message(stream: trio.abc.ReceiveStream, buffer: MessageBuffer) -> dict[str, Any] | None:
    """The next message, or None at end of stream."""
    while (message := buffer.next_message()) is None:
        data = await stream.receive_some()
        if not data:
            return None
        buffer.feed(data)
    return message


# -- prefill side ----------------------------------------------------------------------


@dataclasses.dataclass(slots=True, eq=False)
class _Room:
    """One rendezvous; lives in the server's table until its prefill leg lets go."""

    room: int
    claimed: trio.Event = dataclasses.field(default_factory=trio.Event)  # a prefill leg holds it
    matched: trio.Event = dataclasses.field(default_factory=trio.Event)  # a decode leg connected
    released: trio.Event = dataclasses.field(default_factory=trio.Event)  # prefill done or aborted
    decode_gone: trio.Event = dataclasses.field(default_factory=trio.Event)  # decode connection over
    delivered: trio.Event = dataclasses.field(default_factory=trio.Event)  # outcome written (or not)
    tokens: int | None = None
    abort_reason: str = ""
    delivered_ok: bool = False


@dataclasses.dataclass(slots=True, eq=False)
class PeerHandle:
    """A decode leg connected for ``room``; pass to ``send_kv``, or ``abort()`` it."""

    room: int
    _server: BootstrapServer = dataclasses.field(repr=False)
    _entry: _Room = dataclasses.field(repr=False)

    def abort(self, reason: str = "prefill leg aborted") -> None:
        """Tell the decode leg the transfer will not happen and close its connection."""
        self._server._release(self._entry, reason=reason)


class BootstrapServer:
    """The prefill engine's bootstrap listener; run ``serve`` in a nursery."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        unmatched_timeout: float = DEFAULT_UNMATCHED_TIMEOUT,
    ) -> None:
        self.host = "0.0.0.0" if host == "*" else host
        self.port = port
        self.unmatched_timeout = unmatched_timeout
        self._rooms: dict[int, _Room] = {}
        self._connections = 0
        #: room -> (why, until when): prefill legs aborted before their decode leg connected, so a
        #: late decode leg learns at once that no transfer will come (as SGLang's decode side does
        #: when the sender is marked failed) instead of waiting out the unmatched timeout.
        self._aborted: dict[int, tuple[str, float]] = {}

    @property
    def pending_rooms(self) -> frozenset[int]:
        """Rooms with a leg waiting or a transfer in flight."""
        return frozenset(self._rooms)

    @property
    def open_connections(self) -> int:
        return self._connections

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept decode legs until cancelled; reports the bound port to ``nursery.start``."""
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle_decode, listeners)

    async def wait_for_decode(self, room: int, timeout: float) -> PeerHandle:
        """Hold the prefill leg of ``room`` until its decode leg connects.

        The caller must then ``send_kv`` or ``abort()`` the handle; leaving early (timeout,
        cancellation) drops the room and fails a decode leg that arrived meanwhile.
        """
        entry = self._rooms.setdefault(room, _Room(room))
        if entry.claimed.is_set():
            raise BootstrapFailed(f"bootstrap room {room} already has a prefill leg")
        entry.claimed.set()
        handed_out = False
        try:
            with trio.move_on_after(timeout):
                await entry.matched.wait()
            if not entry.matched.is_set():
                raise BootstrapTimeout(f"no decode leg for bootstrap room {room} after {timeout} s")
            handed_out = True
            return PeerHandle(room, self, entry)
        finally:
            if not handed_out:
                self._release(entry, reason="prefill leg gave up waiting")

    async def send_kv(self, handle: PeerHandle, num_tokens: int, seconds: float) -> None:
        """Simulate the KV transfer (``seconds`` long), then tell the decode leg it is done.

        Raises ``BootstrapFailed`` if the decode leg disconnects first. However this ends,
        the room is released and the decode connection closed.
        """
        entry = handle._entry
        try:
            with trio.move_on_after(seconds):
                await entry.decode_gone.wait()
            if entry.decode_gone.is_set():
                raise BootstrapFailed(f"decode leg of bootstrap room {entry.room} disconnected")
            self._release(entry, tokens=num_tokens)
            with trio.move_on_after(_WRITE_TIMEOUT):
                await entry.delivered.wait()
            if not entry.delivered_ok:
                raise BootstrapFailed(f"decode leg of bootstrap room {entry.room} missed the handoff")
        finally:
            self._release(entry, reason="prefill leg aborted")

    async def transfer(self, room: int, num_tokens: int, seconds: float, timeout: float) -> None:
        """The whole prefill leg: ``wait_for_decode`` then ``send_kv``."""
        handle = await self.wait_for_decode(room, timeout)
        await self.send_kv(handle, num_tokens, seconds)

    def _release(self, entry: _Room, *, tokens: int | None = None, reason: str = "") -> None:
        """End the prefill leg (once); the decode connection then gets the outcome."""
        if entry.released.is_set():
            return
        entry.tokens = tokens
        entry.abort_reason = reason
        entry.released.set()
        self._forget(entry)
        if tokens is None and not entry.matched.is_set():
            self._remember_abort(entry.room, reason or "prefill leg aborted")

    def _remember_abort(self, room: int, reason: str) -> None:
        now = trio.current_time()
        for old in [r for r, (_, until) in self._aborted.items() if until < now]:
            del self._aborted[old]
        if len(self._aborted) >= _MAX_ABORTED_ROOMS:
            del self._aborted[next(iter(self._aborted))]
        self._aborted[room] = (reason, now + self.unmatched_timeout)

    def _forget(self, entry: _Room) -> None:
        if self._rooms.get(entry.room) is entry:
            del self._rooms[entry.room]

    async def _handle_decode(self, stream: trio.SocketStream) -> None:
        self._connections += 1
        try:
            async with stream:
                await self._serve_decode(stream)
        except (trio.BrokenResourceError, ValueError, UnicodeDecodeError):
            pass  # a decode leg that reset or spoke garbage: nothing to pair
        finally:
            self._connections -= 1

    async def _serve_decode(self, stream: trio.SocketStream) -> None:
        buffer = MessageBuffer()
        room = await _read_hello(stream, buffer)
        if room is None:
            return
        aborted = self._aborted.pop(room, None)
        if aborted is not None and aborted[1] >= trio.current_time():
            await _send(stream, {"status": "aborted", "message": aborted[0]})
            return
        entry = self._rooms.setdefault(room, _Room(room))
        if entry.matched.is_set():
            message = f"bootstrap room {room} already has a decode leg"
            await _send(stream, {"status": "error", "message": message})
            return
        entry.matched.set()
        try:
            outcome = await self._await_prefill(stream, entry)
            if outcome is not None:
                entry.delivered_ok = await _send(stream, outcome)
        finally:
            entry.decode_gone.set()
            entry.delivered.set()
            if not entry.claimed.is_set():
                self._forget(entry)

    async def _await_prefill(self, stream: trio.SocketStream, entry: _Room) -> dict[str, Any] | None:
        """The message for the decode leg, or None if it hung up first."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_hangup, stream, entry, nursery.cancel_scope)
            with trio.move_on_after(self.unmatched_timeout):
                await entry.claimed.wait()
            if entry.claimed.is_set():
                await entry.released.wait()
            nursery.cancel_scope.cancel()
        if entry.decode_gone.is_set():
            return None
        if not entry.claimed.is_set():
            return {"status": "unmatched", "message": f"no prefill leg for bootstrap room {entry.room}"}
        if entry.tokens is None:
            return {"status": "aborted", "message": entry.abort_reason or "prefill leg aborted"}
        return {"status": "done", "tokens": entry.tokens}


async def _read_hello(stream: trio.SocketStream, buffer: MessageBuffer) -> int | None:
    """The room a decode leg announces; None (after telling it why, if it spoke) otherwise."""
    with trio.move_on_after(_HELLO_TIMEOUT):
        hello = await _receive_message(stream, buffer)
        if hello is None:
            return None
        room = hello.get("room")
        if isinstance(room, int) and not isinstance(room, bool):
            return room
        await _send(stream, {"status": "error", "message": 'expected {"room": <int>}'})
    return None


async def _watch_hangup(stream: trio.SocketStream, entry: _Room, scope: trio.CancelScope) -> None:
    """Notice the decode leg closing while it waits, so the prefill leg fails promptly."""
    try:
        while await stream.receive_some():
            pass  # the decode leg has nothing more to say; ignore chatter
    except trio.BrokenResourceError:
        pass
    entry.decode_gone.set()
    scope.cancel()


async def _send(stream: trio.abc.SendStream, message: dict[str, Any]) -> bool:
    """Best-effort write of one message; False if the peer is gone or stuck."""
    with trio.move_on_after(_WRITE_TIMEOUT):
        try:
            await stream.send_all(encode_message(message))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True
    return False


@asynccontextmanager
async def open_bootstrap_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    unmatched_timeout: float = DEFAULT_UNMATCHED_TIMEOUT,
) -> AsyncIterator[BootstrapServer]:
    """Listen for the duration of the block (``server.port`` is the bound port)."""
    server = BootstrapServer(host, port, unmatched_timeout=unmatched_timeout)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


# -- decode side -----------------------------------------------------------------------


async def receive_kv(host: str, port: int, room: int, timeout: float) -> int:
    """The decode leg: wait for ``room``'s prefill leg to hand over its KV cache.

    Retries while the listener is not up or the prefill leg has not arrived; ``timeout``
    bounds the whole wait including the transfer. Returns the token count sent.
    """
    try:
        with trio.fail_after(timeout):
            return await _receive_kv(host, port, room)
    except trio.TooSlowError:
        message = f"bootstrap room {room} not served by {host}:{port} within {timeout} s"
        raise BootstrapTimeout(message) from None


async def _receive_kv(host: str, port: int, room: int) -> int:
    delay = _RETRY_FIRST
    while True:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            reply: dict[str, Any] | None = {"status": "unmatched"}
        else:
            try:
                async with stream:
                    await stream.send_all(encode_message({"room": room}))
                    reply = await _receive_message(stream, MessageBuffer())
            except trio.BrokenResourceError:
                reply = None
            except (ValueError, UnicodeDecodeError) as exc:
                raise BootstrapFailed(f"bad bootstrap reply: {exc}") from None
        if reply is None:
            raise BootstrapFailed(f"prefill leg of bootstrap room {room} closed the connection")
        status = reply.get("status")
        if status == "done":
            return int(reply.get("tokens", 0))
        if status != "unmatched":
            raise BootstrapFailed(str(reply.get("message") or f"bootstrap failed ({status})"))
        await trio.sleep(delay)
        delay = min(delay * 2, _RETRY_MAX)
