"""A sans-IO HTTP/2 client connection made for gRPC: bytes in, gRPC messages and call outcomes out.

Why not h2: h2 is a general HTTP/2 state machine, and per received DATA frame it builds event
objects, walks stream state transitions and flow-control bookkeeping (~20 µs), where cutting a
frame costs ~3 µs. A gRPC client needs far less of HTTP/2: it opens streams with one HEADERS and a
few DATA frames, and reads back HEADERS, length-prefixed messages and trailers. This module does
exactly that and nothing else, with no I/O: the caller feeds received bytes to `receive_data` and
writes out what `data_to_send` returns.

What it implements: the client preface and SETTINGS exchange (MAX_CONCURRENT_STREAMS,
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, ENABLE_PUSH honoured), WINDOW_UPDATE both ways, PING (answered;
ours acknowledged), RST_STREAM, GOAWAY (streams the peer never processed end as unavailable),
HEADERS + CONTINUATION (HPACK through the ``hpack`` package), padding, PRIORITY (ignored), unknown
frame types (ignored), trailers -> gRPC status and message, and the HTTP status mapping gRPC
specifies for responses that are not gRPC at all.

Flow control is backpressure: a stream's receive window is given back only as its consumer takes
messages (`take`), so what one stream buffers is bounded by its window, while the connection window
is given back as bytes arrive (one stalled stream never starves the others).

A malformed frame is a connection error: `receive_data` returns `ConnectionTerminated`, every open
stream ends as unavailable, a GOAWAY is queued, and later input is ignored. It never raises on
input.
"""

from __future__ import annotations

import collections
import math
import struct
from typing import Any, ClassVar
from urllib.parse import unquote

from hpack import Decoder, Encoder, NeverIndexedHeaderTuple
from hpack.exceptions import HPACKError

__all__ = [
    "CLIENT_PREFACE",
    "ConnectionTerminated",
    "ErrorCode",
    "GoAwayReceived",
    "GrpcConnection",
    "GrpcStream",
    "PingAcknowledged",
    "SettingsReceived",
    "grpc_timeout",
]

CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# Settings
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
DEFAULT_MAX_FRAME_SIZE = 16_384
MAX_MAX_FRAME_SIZE = 2**24 - 1
#: A header block (HEADERS + CONTINUATION) larger than this is a connection error, not a memory sink.
MAX_HEADER_BLOCK = 256 * 1024
#: HPACK's one-byte indexed header fields (index 1-126), and how many blocks of them are kept decoded.
_ONE_BYTE_INDEXED = bytes(range(0x81, 0xFF))
_MAX_INDEXED_BLOCKS = 32

_HEADER = struct.Struct(">HBBBL")  # length (24 bits: 16 + 8), type, flags, stream id
_pack_header = _HEADER.pack
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")
_unpack_u32 = _U32.unpack_from


class ErrorCode:
    """HTTP/2 error codes (RFC 9113 section 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD

    NAMES: ClassVar[dict[int, str]] = {
        0x0: "NO_ERROR", 0x1: "PROTOCOL_ERROR", 0x2: "INTERNAL_ERROR", 0x3: "FLOW_CONTROL_ERROR",
        0x4: "SETTINGS_TIMEOUT", 0x5: "STREAM_CLOSED", 0x6: "FRAME_SIZE_ERROR", 0x7: "REFUSED_STREAM",
        0x8: "CANCEL", 0x9: "COMPRESSION_ERROR", 0xA: "CONNECT_ERROR", 0xB: "ENHANCE_YOUR_CALM",
        0xC: "INADEQUATE_SECURITY", 0xD: "HTTP_1_1_REQUIRED",
    }  # fmt: skip

    @classmethod
    def name(cls, code: int) -> str:
        return cls.NAMES.get(code, f"0x{code:x}")


#: gRPC's mapping of a non-200 HTTP status (a proxy or a server that is not gRPC) to a gRPC status.
_HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED",
                 429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}  # fmt: skip

#: gRPC status codes by number (grpc-status carries the number).
_STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip


class _ProtocolViolation(Exception):
    """Raised inside the parser; becomes a `ConnectionTerminated` with its error code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# --- events (connection-level; per-stream news lands on the streams themselves) -----------------


class SettingsReceived:
    """The peer's SETTINGS arrived (and were acknowledged); `max_concurrent_streams` is None when
    the peer sets no limit."""

    __slots__ = ("max_concurrent_streams",)

    def __init__(self, max_concurrent_streams: int | None) -> None:
        self.max_concurrent_streams = max_concurrent_streams


class PingAcknowledged:
    """The peer answered one of our PINGs."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class GoAwayReceived:
    """The peer will accept no new streams; streams above `last_stream_id` already ended as
    unavailable (never processed: safe to retry)."""

    __slots__ = ("last_stream_id", "error_code", "debug")

    def __init__(self, last_stream_id: int, error_code: int, debug: bytes) -> None:
        self.last_stream_id = last_stream_id
        self.error_code = error_code
        self.debug = debug


class ConnectionTerminated:
    """The connection is over: a protocol error on either side, or the peer's GOAWAY with an error
    after which no stream remains. Every open stream already ended as unavailable."""

    __slots__ = ("error_code", "reason")

    def __init__(self, error_code: int, reason: str) -> None:
        self.error_code = error_code
        self.reason = reason

    def __repr__(self) -> str:
        return f"ConnectionTerminated({ErrorCode.name(self.error_code)}, {self.reason!r})"


class GrpcStream:
    """One call's stream: the messages that arrived (raw protobuf bytes, decoded by the consumer)
    and, once it ended, its outcome.

    `outcome` is None while the call runs, then ``("OK", "")`` or ``(status name, message)``; a
    failure arrives after every message that came before it. `waiter` is the I/O shell's own slot
    (whoever waits for news on this stream).
    """

    __slots__ = (
        "stream_id", "messages", "outcome", "response_headers", "waiter",
        "_queued_bytes", "_held", "_credit", "_partial", "_need", "_send_buffer", "_send_window",
        "_closed", "_reset",
    )  # fmt: skip

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.stream_id = stream_id
        self.messages: collections.deque[bytes] = collections.deque()
        self.outcome: tuple[str, str] | None = None
        self.response_headers: dict[str, str] | None = None
        self.waiter: Any = None
        self._queued_bytes = 0  # wire bytes (prefix included) of the messages not yet taken
        self._held = 0  # DATA bytes received and not yet given back as window
        self._credit = 0  # window owed to the peer, sent once it is worth a frame
        self._partial = bytearray()  # a message cut across DATA frames
        self._need = -1  # bytes the partial message still lacks (-1: reading a prefix)
        #: Request bytes waiting for send window; a view once the request spans frames.
        self._send_buffer: bytes | memoryview = b""
        self._send_window = send_window
        self._closed = False  # the peer ended the stream: no more frames may come
        self._reset = False  # we reset it (or it can never have been processed): frames are dropped


def grpc_timeout(seconds: float) -> str:
    """A ``grpc-timeout`` header value: at most 8 digits and a unit, rounded up."""
    micros = max(1, math.ceil(seconds * 1e6))
    if micros < 100_000_000:
        return f"{micros}u"
    millis = math.ceil(micros / 1000)
    if millis < 100_000_000:
        return f"{millis}m"
    return f"{min(99_999_999, math.ceil(millis / 1000))}S"


class GrpcConnection:
    """The client side of one HTTP/2 connection carrying gRPC calls.

    `stream_window` is the receive window of each stream, and so the most one stream buffers before
    its peer must wait for its consumer; `connection_window` that of the connection.
    `max_receive_message` bounds one message (a larger one resets its stream as RESOURCE_EXHAUSTED).
    """

    def __init__(
        self,
        authority: str,
        *,
        stream_window: int = 256 * 1024,
        connection_window: int = 16 * 1024 * 1024,
        max_receive_message: int = 64 * 1024 * 1024,
        user_agent: str = "trio-direct",
    ) -> None:
        self.authority = authority
        self.user_agent = user_agent
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.max_receive_message = max_receive_message
        self.streams: dict[int, GrpcStream] = {}
        #: Streams with news since the caller last looked (messages or an outcome), in arrival order.
        self.touched: list[GrpcStream] = []
        #: The peer's SETTINGS_MAX_CONCURRENT_STREAMS; None until its first SETTINGS, or when unset.
        self.max_concurrent_streams: int | None = None
        self.settings_received = False
        #: The peer sent GOAWAY, or the connection ended: no new stream may start.
        self.closing = False
        self.terminated: ConnectionTerminated | None = None
        self._next_stream_id = 1
        self._out: list[bytes | memoryview] = []
        self._in = bytearray()
        self._preface_checked = False
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._decoder.max_allowed_table_size = 4096
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_frame = DEFAULT_MAX_FRAME_SIZE
        self._send_window = DEFAULT_WINDOW
        self._receive_window = DEFAULT_WINDOW  # the connection's, as the peer sees it
        self._connection_credit = 0
        self._blocked: list[GrpcStream] = []  # streams with request bytes waiting for window
        self._header_block: bytearray | None = None  # HEADERS awaiting CONTINUATION
        self._header_stream = 0
        self._header_flags = 0
        self._static_headers: dict[str, bytes] = {}
        #: Header blocks of indexed fields only, decoded (`_decode_header_block`).
        self._indexed_blocks: dict[bytes, dict[str, str]] = {}

    # --- outgoing ---------------------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the client preface, our SETTINGS and the connection's larger window."""
        settings = (
            _SETTING.pack(SETTINGS_ENABLE_PUSH, 0)
            + _SETTING.pack(SETTINGS_MAX_CONCURRENT_STREAMS, 0)
            + _SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, self.stream_window)
        )
        self._out.append(CLIENT_PREFACE)
        self._frame(SETTINGS, 0, 0, settings)
        increment = self.connection_window - DEFAULT_WINDOW
        if increment > 0:
            self._frame(WINDOW_UPDATE, 0, 0, _U32.pack(increment))
            self._receive_window = self.connection_window

    def data_to_send(self) -> bytes:
        """Everything queued for the wire since the last call, as one write."""
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    def open_slots(self) -> int | None:
        """How many more streams the peer accepts now (None: no limit)."""
        limit = self.max_concurrent_streams
        return None if limit is None else limit - len(self.streams)

    def start_call(self, path: str, message: bytes, timeout: float | None = None) -> GrpcStream:
        """Open a stream for one call carrying one request message (already serialized)."""
        if self.closing:
            raise RuntimeError("connection is closing: no new streams")
        stream_id = self._next_stream_id
        if stream_id > MAX_WINDOW:  # stream ids exhausted: this connection is done
            self.closing = True
            raise RuntimeError("stream ids exhausted")
        self._next_stream_id += 2
        stream = GrpcStream(stream_id, self._peer_initial_window)
        self.streams[stream_id] = stream
        block = self._static_headers.get(path)
        if block is None:
            headers = [
                (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
                ("te", "trailers"), ("content-type", "application/grpc"), ("user-agent", self.user_agent),
            ]  # fmt: skip
            # Never-indexed literals leave the encoder's table empty, so a block is the same every
            # time and is encoded once per path.
            block = self._encoder.encode([NeverIndexedHeaderTuple(n, v) for n, v in headers])
            if len(self._static_headers) < 256:
                self._static_headers[path] = block
        if timeout is not None:
            block += self._encoder.encode([NeverIndexedHeaderTuple("grpc-timeout", grpc_timeout(timeout))])
        self._send_headers(stream_id, block)
        stream._send_buffer = b"\x00" + _U32.pack(len(message)) + message
        self._flush_stream(stream)
        if stream._send_buffer:
            self._blocked.append(stream)
        return stream

    def _send_headers(self, stream_id: int, block: bytes) -> None:
        limit = self._peer_max_frame
        if len(block) <= limit:
            self._frame(HEADERS, END_HEADERS, stream_id, block)
            return
        self._frame(HEADERS, 0, stream_id, block[:limit])
        rest = block[limit:]
        while rest:
            chunk, rest = rest[:limit], rest[limit:]
            self._frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk)

    def _flush_stream(self, stream: GrpcStream) -> None:
        """Send as much of the stream's request as the windows allow; END_STREAM with its last byte."""
        buffer = stream._send_buffer
        while buffer:
            room = min(stream._send_window, self._send_window, self._peer_max_frame)
            if room <= 0:
                break
            if len(buffer) > room and type(buffer) is bytes:
                # Slices of a view share its bytes: a request of many frames is copied once onto
                # the wire, not once per frame (quadratic: seconds of CPU for tens of megabytes).
                buffer = memoryview(buffer)
            chunk, buffer = buffer[:room], buffer[room:]
            stream._send_window -= len(chunk)
            self._send_window -= len(chunk)
            self._frame(DATA, 0 if buffer else END_STREAM, stream.stream_id, chunk)
        stream._send_buffer = buffer  # a request always has its 5-byte prefix: END_STREAM went with the last byte

    def _flush_blocked(self) -> None:
        if not self._blocked:
            return
        waiting, self._blocked = self._blocked, []
        for stream in waiting:
            if stream.stream_id in self.streams and stream._send_buffer:
                self._flush_stream(stream)
                if stream._send_buffer:
                    self._blocked.append(stream)

    def reset(self, stream: GrpcStream, code: int = ErrorCode.CANCEL) -> None:
        """Cancel a call: RST_STREAM if it is still open, and forget it."""
        known = self.streams.pop(stream.stream_id, None) is not None
        if known and self.terminated is None and not stream._reset and (not stream._closed or stream._send_buffer):
            self._frame(RST_STREAM, 0, stream.stream_id, _U32.pack(code))
        # What it held and nobody will take needs no window back: the stream is over (the connection
        # window was given back as the bytes arrived).
        stream._reset = True
        stream._send_buffer = b""
        if stream.outcome is None:
            stream.outcome = ("CANCELLED", "cancelled by the client")

    def take(self, stream: GrpcStream) -> bytes:
        """The next message of `stream` (raises IndexError when none): the consumer taking it is
        what gives its bytes back to the peer as window."""
        message = stream.messages.popleft()
        size = len(message) + 5
        stream._queued_bytes -= size
        if not stream._closed and not stream._reset:
            credit = stream._held - stream._queued_bytes
            if credit > 0:
                stream._held -= credit
                stream._credit += credit
                if stream._credit >= self.stream_window >> 1:
                    self._frame(WINDOW_UPDATE, 0, stream.stream_id, _U32.pack(stream._credit))
                    stream._credit = 0
        return message

    def ping(self, data: bytes) -> None:
        """Queue a PING with 8 bytes of opaque data; `PingAcknowledged` comes back with them."""
        self._frame(PING, 0, 0, data)

    def close(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Queue a GOAWAY: this side is done with the connection."""
        if self.terminated is None:
            self._frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(code) + reason.encode()[:256])
        self.closing = True

    def connection_lost(self, reason: str) -> ConnectionTerminated:
        """The transport closed or failed: every open stream ends as unavailable."""
        if self.terminated is None:
            self.terminated = ConnectionTerminated(ErrorCode.NO_ERROR, reason)
            self.closing = True
            self._end_all("UNAVAILABLE", f"connection lost: {reason}")
        return self.terminated

    def _frame(self, frame_type: int, flags: int, stream_id: int, payload: bytes | memoryview) -> None:
        length = len(payload)
        self._out.append(_pack_header(length >> 8, length & 0xFF, frame_type, flags, stream_id))
        if payload:
            self._out.append(payload)

    # --- incoming ---------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Any]:
        """Process received bytes. Messages and outcomes land on their streams (listed in
        `touched`); connection-level events are returned. Never raises on malformed input."""
        if self.terminated is not None:
            return []
        events: list[Any] = []
        buffer = self._in
        buffer += data
        try:
            self._parse(buffer, events)
        except _ProtocolViolation as violation:
            events.append(self._terminate(violation.code, violation.reason))
        except Exception as error:  # noqa: BLE001 - a parser bug must end this connection, not the caller
            events.append(self._terminate(ErrorCode.INTERNAL_ERROR, f"{type(error).__name__}: {error}"))
        return events

    def _terminate(self, code: int, reason: str) -> ConnectionTerminated:
        self._out.append(
            _pack_header(0, 8 + len(reason.encode()[:256]), GOAWAY, 0, 0)
            + _U32.pack(max(0, self._next_stream_id - 2))
            + _U32.pack(code)
            + reason.encode()[:256]
        )
        self._in.clear()
        self.terminated = ConnectionTerminated(code, reason)
        self.closing = True
        self._end_all("UNAVAILABLE", f"HTTP/2 connection error {ErrorCode.name(code)}: {reason}")
        return self.terminated

    def _end_all(self, status: str, message: str) -> None:
        for stream in self.streams.values():
            if stream.outcome is None:
                stream.outcome = (status, message)
                stream._closed = True
                self.touched.append(stream)
        self._blocked.clear()

    def _parse(self, buffer: bytearray, events: list[Any]) -> None:
        start = 0
        end = len(buffer)
        max_frame = DEFAULT_MAX_FRAME_SIZE
        try:
            if not self._preface_checked:
                # The server's preface is a SETTINGS frame, first.
                if end < 9:
                    return
                if buffer[3] != SETTINGS or buffer[4] & ACK:
                    raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "the server's preface is not SETTINGS")
                self._preface_checked = True
            while end - start >= 9:
                length = (buffer[start] << 16) | (buffer[start + 1] << 8) | buffer[start + 2]
                if length > max_frame:
                    raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                if end - start < 9 + length:
                    break
                frame_type = buffer[start + 3]
                flags = buffer[start + 4]
                stream_id = _unpack_u32(buffer, start + 5)[0] & 0x7FFFFFFF
                payload = bytes(buffer[start + 9 : start + 9 + length])
                start += 9 + length
                if self._header_block is not None and frame_type != CONTINUATION:
                    raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "expected CONTINUATION")
                if frame_type == DATA:
                    self._on_data(flags, stream_id, payload)
                elif frame_type == HEADERS:
                    self._on_headers(flags, stream_id, payload)
                elif frame_type == CONTINUATION:
                    self._on_continuation(flags, stream_id, payload)
                elif frame_type == SETTINGS:
                    self._on_settings(flags, stream_id, payload, events)
                elif frame_type == WINDOW_UPDATE:
                    self._on_window_update(stream_id, payload)
                elif frame_type == PING:
                    if stream_id or length != 8:
                        raise _ProtocolViolation(
                            ErrorCode.FRAME_SIZE_ERROR if length != 8 else ErrorCode.PROTOCOL_ERROR, "bad PING"
                        )
                    if flags & ACK:
                        events.append(PingAcknowledged(payload))
                    else:
                        self._frame(PING, ACK, 0, payload)
                elif frame_type == RST_STREAM:
                    self._on_reset(stream_id, payload)
                elif frame_type == GOAWAY:
                    self._on_goaway(stream_id, payload, events)
                elif frame_type == PRIORITY:
                    if not stream_id:
                        raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
                    if length != 5:
                        raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of the wrong size")
                elif frame_type == PUSH_PROMISE:
                    raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE with push disabled")
                # unknown frame types are ignored (RFC 9113 section 4.1)
                if self.terminated is not None:
                    return
        finally:
            if self.terminated is None:
                del buffer[:start]

    def _known_stream(self, stream_id: int, what: str) -> GrpcStream | None:
        """The stream a frame is for; None for one that ended (the frame is ignored). A frame on a
        stream that was never opened, or on stream 0, is a connection error."""
        if stream_id == 0 or not stream_id & 1 or stream_id >= self._next_stream_id:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"{what} on stream {stream_id}, which was never opened")
        return self.streams.get(stream_id)

    def _unpad(self, flags: int, payload: bytes, what: str) -> bytes:
        if flags & PADDED:
            if not payload:
                raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, f"padded {what} without a pad length")
            pad = payload[0]
            if pad >= len(payload):
                raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"{what} padding longer than the frame")
            return payload[1 : len(payload) - pad]
        return payload

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        # `_known_stream`, inline: this runs for every DATA frame.
        if stream_id == 0 or not stream_id & 1 or stream_id >= self._next_stream_id:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
        stream = self.streams.get(stream_id)
        size = len(payload)
        # The connection window: given back as bytes arrive (the per-stream window is the bound).
        self._receive_window -= size
        if self._receive_window < 0:
            raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._connection_credit += size
        if self._connection_credit >= self.connection_window >> 1:
            self._frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._connection_credit))
            self._receive_window += self._connection_credit
            self._connection_credit = 0
        if stream is None or stream._reset:
            return  # a stream we reset: its frames in flight are dropped
        if stream._closed:
            raise _ProtocolViolation(ErrorCode.STREAM_CLOSED, f"DATA on stream {stream_id} after its end")
        if stream.response_headers is None:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"DATA before HEADERS on stream {stream_id}")
        if stream._held + stream._credit + size > self.stream_window:
            raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, f"DATA beyond the window of stream {stream_id}")
        stream._held += size
        data = self._unpad(flags, payload, "DATA") if flags & PADDED else payload
        queued_before = stream._queued_bytes
        if data:
            self._cut_messages(stream, data)
        # Bytes that are not whole queued messages (padding, a partial message) go back at once.
        credit = stream._held - stream._queued_bytes
        if credit > 0:
            stream._held -= credit
            stream._credit += credit
            if stream._credit >= self.stream_window >> 1:
                self._frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream._credit))
                stream._credit = 0
        if flags & END_STREAM:
            self._end_without_trailers(stream)
        elif stream._queued_bytes != queued_before:
            self.touched.append(stream)

    def _cut_messages(self, stream: GrpcStream, data: bytes) -> None:
        messages = stream.messages
        partial = stream._partial
        if not partial and stream._need < 0:
            # The hot path: whole messages within this frame.
            position = 0
            size = len(data)
            while size - position >= 5:
                if data[position]:
                    self._fail_stream(stream, "INTERNAL", "compressed message without grpc-encoding")
                    return
                length = _unpack_u32(data, position + 1)[0]
                if length > self.max_receive_message:
                    self._fail_stream(stream, "RESOURCE_EXHAUSTED", f"message of {length} bytes is too large")
                    return
                if size - position - 5 < length:
                    break
                messages.append(data[position + 5 : position + 5 + length])
                stream._queued_bytes += length + 5
                position += length + 5
            if position == size:
                return
            data = data[position:]
        partial += data
        while True:
            if stream._need < 0:
                if len(partial) < 5:
                    return
                if partial[0]:
                    self._fail_stream(stream, "INTERNAL", "compressed message without grpc-encoding")
                    return
                length = _unpack_u32(partial, 1)[0]
                if length > self.max_receive_message:
                    self._fail_stream(stream, "RESOURCE_EXHAUSTED", f"message of {length} bytes is too large")
                    return
                stream._need = length
            if len(partial) - 5 < stream._need:
                return
            length = stream._need
            messages.append(bytes(partial[5 : 5 + length]))
            stream._queued_bytes += length + 5
            del partial[: 5 + length]
            stream._need = -1

    def _fail_stream(self, stream: GrpcStream, status: str, message: str) -> None:
        """End a call on our side with an error of our own, resetting its stream."""
        if stream.outcome is None:
            stream.outcome = (status, message)
            self.touched.append(stream)
        stream._partial.clear()
        stream._need = -1
        if not stream._closed and not stream._reset:
            self._frame(RST_STREAM, 0, stream.stream_id, _U32.pack(ErrorCode.CANCEL))
        stream._reset = True
        stream._send_buffer = b""

    def _end_without_trailers(self, stream: GrpcStream) -> None:
        stream._closed = True
        if stream.outcome is None:
            stream.outcome = ("INTERNAL", "stream ended without trailers")
            self.touched.append(stream)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._known_stream(stream_id, "HEADERS")
        block = self._unpad(flags, payload, "HEADERS") if flags & PADDED else payload
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            self._on_header_block(stream_id, flags, block)
        else:
            self._header_block = bytearray(block)
            self._header_stream = stream_id
            self._header_flags = flags

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._header_block
        if block is None or stream_id != self._header_stream:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS before it")
        block += payload
        if len(block) > MAX_HEADER_BLOCK:
            raise _ProtocolViolation(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            self._header_block = None
            self._on_header_block(stream_id, self._header_flags, bytes(block))

    def _decode_header_block(self, block: bytes) -> dict[str, str]:
        """The fields of `block`, decoded whatever the stream's state: the decoder's table must see
        every block that may change it.

        A server's blocks for a call's response headers and trailers are, after its first calls,
        the same few bytes each time: every field an index into the tables (`hpack` spends ~6-14 µs
        decoding each, on the first token's path). A block of one-byte indexed fields only (RFC
        7541, 6.1: 0x81-0xfe, index 1-126) neither adds to the dynamic table nor evicts from it, so
        its fields stay what they were until a block of another kind is decoded, which may change
        the table: that empties the cache.
        """
        fields = self._indexed_blocks.get(block)
        if fields is not None:
            return fields.copy()
        try:
            headers = self._decoder.decode(block, raw=False)
        except (HPACKError, UnicodeDecodeError, ValueError) as error:
            raise _ProtocolViolation(ErrorCode.COMPRESSION_ERROR, f"cannot decode headers: {error}") from None
        fields = {str(name): str(value) for name, value in headers}
        if block and not block.translate(None, _ONE_BYTE_INDEXED):
            if len(self._indexed_blocks) >= _MAX_INDEXED_BLOCKS:
                self._indexed_blocks.clear()
            self._indexed_blocks[block] = fields.copy()
        elif self._indexed_blocks:
            self._indexed_blocks.clear()
        return fields

    def _on_header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        fields = self._decode_header_block(block)
        stream = self.streams.get(stream_id)
        if stream is None or stream._reset:
            return
        if stream._closed:
            raise _ProtocolViolation(ErrorCode.STREAM_CLOSED, f"HEADERS on stream {stream_id} after its end")
        if stream.response_headers is None:
            stream.response_headers = fields
            status = fields.get(":status")
            if status != "200":
                code = int(status) if status is not None and status.isdigit() else 0
                grpc = _HTTP_TO_GRPC.get(code, "UNKNOWN")
                self._fail_stream(stream, grpc, f"HTTP status {status} from the engine")
                return
            if "grpc-status" in fields:  # trailers-only
                self._trailers(stream, fields, flags)
            elif flags & END_STREAM:
                self._end_without_trailers(stream)
            return
        if not flags & END_STREAM:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, f"trailers without END_STREAM on stream {stream_id}")
        self._trailers(stream, fields, flags)

    def _trailers(self, stream: GrpcStream, fields: dict[str, str], flags: int) -> None:
        if not flags & END_STREAM:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
        stream._closed = True
        if stream.outcome is not None:
            return
        raw = fields.get("grpc-status")
        if raw is None:
            outcome = ("UNKNOWN", "trailers without grpc-status")
        else:
            code = int(raw) if raw.isdigit() else -1
            name = _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else "UNKNOWN"
            message = fields.get("grpc-message", "")
            outcome = (name, unquote(message) if message else "")
        if stream._partial or stream._need >= 0:
            outcome = ("INTERNAL", "stream ended inside a message")
        stream.outcome = outcome
        self.touched.append(stream)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes, events: list[Any]) -> None:
        if stream_id:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a size not a multiple of 6")
        for offset in range(0, len(payload), 6):
            code, value = _SETTING.unpack_from(payload, offset)
            if code == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.max_concurrent_streams = value
            elif code == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self.streams.values():
                    stream._send_window += delta
                    if stream._send_window > MAX_WINDOW:
                        raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "stream window overflow")
            elif code == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME_SIZE <= value <= MAX_MAX_FRAME_SIZE:
                    raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "MAX_FRAME_SIZE out of range")
                self._peer_max_frame = value
            elif code == SETTINGS_ENABLE_PUSH and value > 1:
                raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "ENABLE_PUSH not 0 or 1")
            # HEADER_TABLE_SIZE: our encoder never indexes, so any size fits; others are advisory
        self.settings_received = True
        self._frame(SETTINGS, ACK, 0, b"")
        self._flush_blocked()
        events.append(SettingsReceived(self.max_concurrent_streams))

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = _unpack_u32(payload)[0] & 0x7FFFFFFF
        if increment == 0:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            stream = self._known_stream(stream_id, "WINDOW_UPDATE")
            if stream is None:
                return
            stream._send_window += increment
            if stream._send_window > MAX_WINDOW:
                raise _ProtocolViolation(ErrorCode.FLOW_CONTROL_ERROR, f"window overflow on stream {stream_id}")
        self._flush_blocked()

    def _on_reset(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        stream = self._known_stream(stream_id, "RST_STREAM")
        if stream is None or stream._reset:
            return
        code = _unpack_u32(payload)[0]
        stream._closed = True
        stream._send_buffer = b""
        if stream.outcome is None:
            status = "CANCELLED" if code == ErrorCode.CANCEL else "UNAVAILABLE"
            if code == ErrorCode.ENHANCE_YOUR_CALM:
                status = "RESOURCE_EXHAUSTED"
            stream.outcome = (status, f"stream reset by the engine ({ErrorCode.name(code)})")
            self.touched.append(stream)

    def _on_goaway(self, stream_id: int, payload: bytes, events: list[Any]) -> None:
        if stream_id:
            raise _ProtocolViolation(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _ProtocolViolation(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        last = _unpack_u32(payload)[0] & 0x7FFFFFFF
        code = _unpack_u32(payload, 4)[0]
        self.closing = True
        for stream in list(self.streams.values()):
            if stream.stream_id > last and stream.outcome is None:
                stream.outcome = ("UNAVAILABLE", f"engine going away ({ErrorCode.name(code)}): stream not processed")
                stream._reset = True
                self.touched.append(stream)
        events.append(GoAwayReceived(last, code, payload[8:]))
