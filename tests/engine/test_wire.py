"""The sans-IO gRPC HTTP/2 client (`transport.wire`) against h2 as the oracle.

An h2 server connection answers the client's requests; its bytes reach the client in random
pieces, and what the client makes of them is compared with what an h2 client makes of the same
bytes. Malformed input must end the connection with an error code, never raise or wait forever.
"""

from __future__ import annotations

import random
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_direct.engine.transport import wire
from trio_direct.engine.transport.wire import ConnectionTerminated, ErrorCode, GrpcConnection

PATH = "/sglang.runtime.v1.SglangService/Generate"


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


class Pair:
    """A `GrpcConnection` and an h2 server, with the bytes between them moved by hand."""

    def __init__(self, **server_settings: int) -> None:
        self.client = GrpcConnection("engine:1")
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        if server_settings:
            codes = {getattr(h2.settings.SettingCodes, k.upper()): v for k, v in server_settings.items()}
            self.server.local_settings = h2.settings.Settings(client=False, initial_values=codes)
        self.server.initiate_connection()
        self.client.initiate()
        self.server_events: list = []
        self.client_events: list = []
        self.to_client = b""  # every byte the server sent, for the oracle client

    def to_server(self) -> list:
        events = self.server.receive_data(self.client.data_to_send())
        self.server_events += events
        return events

    def deliver(self, pieces: int = 1, rng: random.Random | None = None) -> list:
        data = self.server.data_to_send()
        self.to_client += data
        events: list = []
        for piece in split(data, pieces, rng or random.Random(0)):
            events += self.client.receive_data(piece)
        self.client_events += events
        return events

    def handshake(self) -> None:
        self.to_server()
        self.deliver()
        self.to_server()


def split(data: bytes, pieces: int, rng: random.Random) -> list[bytes]:
    if pieces <= 1 or len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(pieces - 1, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


def oracle(pair: Pair, stream_ids: list[int]) -> dict[int, tuple[list[bytes], dict[str, str]]]:
    """What an h2 client makes of every byte the server sent: each stream's gRPC messages and its
    trailers (or its response headers for a trailers-only answer)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    client.initiate_connection()
    for stream_id in stream_ids:
        client.send_headers(stream_id, [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "e")])
    body: dict[int, bytes] = {i: b"" for i in stream_ids}
    ends: dict[int, dict[str, str]] = {}
    for event in client.receive_data(pair.to_client):
        if isinstance(event, h2.events.DataReceived):
            body[event.stream_id] += event.data
        elif isinstance(event, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
            headers = dict(event.headers)
            if "grpc-status" in headers or isinstance(event, h2.events.TrailersReceived):
                ends[event.stream_id] = headers  # type: ignore[assignment]  # header_encoding="utf-8": h2 hands str pairs, its types say bytes
    result = {}
    for stream_id, data in body.items():
        messages, position = [], 0
        while position < len(data):
            length = int.from_bytes(data[position + 1 : position + 5], "big")
            messages.append(data[position + 5 : position + 5 + length])
            position += 5 + length
        result[stream_id] = (messages, ends.get(stream_id, {}))
    return result


def test_a_request_is_what_an_h2_server_expects():
    pair = Pair()
    pair.handshake()
    stream = pair.client.start_call(PATH, b"\x01\x02" * 10, timeout=2.5)
    events = pair.to_server()
    request = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    headers = dict((k.decode(), v.decode()) for k, v in request.headers)
    assert headers[":path"] == PATH and headers[":method"] == "POST" and headers["te"] == "trailers"
    assert headers["content-type"] == "application/grpc" and headers["grpc-timeout"] == "2500000u"
    data = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert data == grpc_frame(b"\x01\x02" * 10)
    assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == stream.stream_id for e in events)
    # The same path again reuses the header block, and the h2 server still decodes it.
    pair.client.start_call(PATH, b"")
    events = pair.to_server()
    assert any(isinstance(e, h2.events.RequestReceived) and e.stream_id == 3 for e in events)


def test_a_large_request_waits_for_window_and_respects_the_frame_size():
    pair = Pair(initial_window_size=1000)
    pair.handshake()
    body = bytes(range(256)) * 800  # 200 KiB, far past both windows
    pair.client.start_call(PATH, body)
    received = b""
    for _ in range(1000):
        events = pair.to_server()
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                received += event.data
                assert len(event.data) <= 16384
                pair.server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if any(isinstance(e, h2.events.StreamEnded) for e in events):
            break
        pair.deliver()
    assert received == grpc_frame(body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(st.lists(st.binary(max_size=3000), max_size=6), min_size=1, max_size=4),
    padding=st.lists(st.integers(0, 255), min_size=1, max_size=8),
    pieces=st.integers(1, 40),
    big_header=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_interleaved_streams_in_random_pieces_match_the_h2_client(messages, padding, pieces, big_header, seed):
    rng = random.Random(seed)
    pair = Pair()
    pair.handshake()
    streams = [pair.client.start_call(PATH, b"req") for _ in messages]
    pair.to_server()
    # every frame of every stream, interleaved at random (each stream's own order kept)
    plans = []
    for index, (stream, replies) in enumerate(zip(streams, messages)):
        extra = [("x-big", "v" * 40_000)] if big_header and index == 0 else []
        steps: list[tuple[str, Any]] = [("headers", [(":status", "200"), ("content-type", "application/grpc"), *extra])]
        steps += [("data", grpc_frame(m)) for m in replies]
        steps.append(("trailers", [("grpc-status", str(index)), ("grpc-message", f"msg%20{index}")]))
        plans.append((stream.stream_id, steps))
    cursor = [0] * len(plans)
    while any(c < len(p[1]) for c, p in zip(cursor, plans)):
        index = rng.choice([i for i, (c, p) in enumerate(zip(cursor, plans)) if c < len(p[1])])
        stream_id, steps = plans[index]
        kind, value = steps[cursor[index]]
        cursor[index] += 1
        if kind == "headers":
            pair.server.send_headers(stream_id, value)
        elif kind == "data":
            pad = rng.choice(padding)
            pad = pad if len(value) + pad + 1 <= 16384 else None
            pair.server.send_data(stream_id, value, pad_length=pad)
        else:
            pair.server.send_headers(stream_id, value, end_stream=True)
        if rng.random() < 0.3:
            pair.deliver(pieces, rng)
    assert not [e for e in pair.deliver(pieces, rng) if isinstance(e, ConnectionTerminated)]
    assert not [e for e in pair.client_events if isinstance(e, ConnectionTerminated)]
    expected = oracle(pair, [s.stream_id for s in streams])
    for index, stream in enumerate(streams):
        got = [pair.client.take(stream) for _ in range(len(stream.messages))]
        want, trailers = expected[stream.stream_id]
        assert got == want == messages[index]
        assert stream.outcome == (wire._STATUS_NAMES[index], f"msg {index}")
        assert trailers["grpc-status"] == str(index)
    pair.to_server()  # our window updates and acks are valid for h2


def test_trailers_only_and_http_errors_and_resets():
    pair = Pair()
    pair.handshake()
    a, b, c = (pair.client.start_call(PATH, b"") for _ in range(3))
    pair.to_server()
    pair.server.send_headers(
        a.stream_id, [(":status", "200"), ("grpc-status", "5"), ("grpc-message", "no")], end_stream=True
    )
    pair.server.send_headers(b.stream_id, [(":status", "503")], end_stream=True)
    pair.server.reset_stream(c.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
    pair.deliver()
    assert a.outcome == ("NOT_FOUND", "no")
    assert b.outcome is not None and b.outcome[0] == "UNAVAILABLE"
    assert c.outcome is not None and c.outcome[0] == "UNAVAILABLE" and "REFUSED_STREAM" in c.outcome[1]
    assert {a, b, c} <= set(pair.client.touched)


def test_repeated_header_blocks_decode_as_the_table_says_when_it_changes():
    """A server's repeated response headers and trailers are indexed-only blocks, kept decoded; a
    block that adds to the table (a new message, evicting older entries) may give the same bytes
    other fields afterwards, and every call still ends with exactly the status its server sent."""
    pair = Pair()
    pair.handshake()
    rng = random.Random(7)
    usual = [("0", ""), ("5", "gone"), ("14", "busy")]
    for _ in range(400):
        stream = pair.client.start_call(PATH, b"")
        pair.to_server()
        if rng.random() < 0.85:
            status, message = rng.choice(usual)
        else:
            status, message = rng.choice(["3", "8", "13"]), "m" * rng.randint(1, 300) + str(rng.random())
        pair.server.send_headers(stream.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        pair.server.send_data(stream.stream_id, grpc_frame(b"x"))
        trailers = [("grpc-status", status)] + ([("grpc-message", message)] if message else [])
        pair.server.send_headers(stream.stream_id, trailers, end_stream=True)
        pair.deliver()
        assert stream.outcome == (wire._STATUS_NAMES[int(status)], message)
        assert stream.response_headers == {":status": "200", "content-type": "application/grpc"}
    assert pair.client._indexed_blocks  # the repeated blocks were served from the cache


def test_pings_are_answered_and_ours_acknowledged():
    pair = Pair()
    pair.handshake()
    pair.server.ping(b"12345678")
    pair.deliver()
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678" for e in pair.to_server())
    pair.client.ping(b"abcdefgh")
    pair.to_server()
    events = pair.deliver()
    assert [e.data for e in events if isinstance(e, wire.PingAcknowledged)] == [b"abcdefgh"]


def test_goaway_ends_only_the_streams_the_engine_never_processed():
    pair = Pair()
    pair.handshake()
    first, second = pair.client.start_call(PATH, b""), pair.client.start_call(PATH, b"")
    pair.to_server()
    pair.server.close_connection(last_stream_id=first.stream_id)
    events = pair.deliver()
    assert [e.last_stream_id for e in events if isinstance(e, wire.GoAwayReceived)] == [first.stream_id]
    assert first.outcome is None and second.outcome is not None and second.outcome[0] == "UNAVAILABLE"
    assert pair.client.closing
    with pytest.raises(RuntimeError):
        pair.client.start_call(PATH, b"")


def test_settings_set_the_stream_limit():
    pair = Pair(max_concurrent_streams=2)
    pair.to_server()
    events = pair.deliver()
    assert [e.max_concurrent_streams for e in events if isinstance(e, wire.SettingsReceived)] == [2]
    pair.client.start_call(PATH, b"")
    assert pair.client.open_slots() == 1


def test_a_stream_whose_consumer_stops_buffers_at_most_its_window():
    """The engine can send one stream window; taking messages gives it more, in few frames."""
    pair = Pair()
    pair.handshake()
    stream = pair.client.start_call(PATH, b"")
    pair.to_server()
    sid = stream.stream_id
    pair.server.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    message = grpc_frame(b"t" * 59)  # 64 bytes on the wire
    sent = 0
    while pair.server.local_flow_control_window(sid) >= len(message):
        pair.server.send_data(sid, message)
        sent += 1
    pair.deliver()
    assert sent * len(message) <= pair.client.stream_window
    assert len(stream.messages) == sent
    assert pair.server.local_flow_control_window(sid) < len(message), "the engine must wait"
    for _ in range(sent // 2 + 1):
        pair.client.take(stream)
    updates = [e for e in pair.to_server() if isinstance(e, h2.events.WindowUpdated) and e.stream_id == sid]
    assert len(updates) == 1 and pair.server.local_flow_control_window(sid) >= pair.client.stream_window // 2


MALFORMED = [
    ("DATA on stream 0", (0, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR),
    ("DATA on a stream never opened", (0, 0, 7, b"x"), ErrorCode.PROTOCOL_ERROR),
    ("padding longer than the frame", (0, 0x8, 1, b"\x05ab"), ErrorCode.PROTOCOL_ERROR),
    ("PING of 7 bytes", (6, 0, 0, b"1234567"), ErrorCode.FRAME_SIZE_ERROR),
    ("SETTINGS of 5 bytes", (4, 0, 0, b"12345"), ErrorCode.FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE of 0", (8, 0, 0, b"\x00\x00\x00\x00"), ErrorCode.PROTOCOL_ERROR),
    ("window overflow", (8, 0, 0, b"\x7f\xff\xff\xff"), ErrorCode.FLOW_CONTROL_ERROR),
    ("PUSH_PROMISE", (5, 0x4, 1, b"\x00\x00\x00\x02\x82"), ErrorCode.PROTOCOL_ERROR),
    ("CONTINUATION out of nowhere", (9, 0x4, 1, b"\x82"), ErrorCode.PROTOCOL_ERROR),
    ("undecodable header block", (1, 0x5, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
    ("frame above the max frame size", (0, 0, 1, b"x" * 16385), ErrorCode.FRAME_SIZE_ERROR),
    ("MAX_FRAME_SIZE too small", (4, 0, 0, b"\x00\x05\x00\x00\x00\x10"), ErrorCode.PROTOCOL_ERROR),
    ("INITIAL_WINDOW_SIZE too large", (4, 0, 0, b"\x00\x04\x80\x00\x00\x00"), ErrorCode.FLOW_CONTROL_ERROR),
]


def frame(frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([frame_type, flags]) + stream_id.to_bytes(4, "big") + payload


@pytest.mark.parametrize(("frame_spec", "code"), [(m[1], m[2]) for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_a_malformed_frame_is_a_connection_error_for_us_and_for_h2(frame_spec, code):
    pair = Pair()
    pair.handshake()
    stream = pair.client.start_call(PATH, b"")
    pair.to_server()
    pair.deliver()
    bad = frame(*frame_spec)
    events = pair.client.receive_data(bad)
    assert [(type(e), e.error_code) for e in events] == [(ConnectionTerminated, code)]
    assert stream.outcome is not None and stream.outcome[0] == "UNAVAILABLE" and pair.client.closing
    goaway = pair.server.receive_data(pair.client.data_to_send())
    assert any(isinstance(e, h2.events.ConnectionTerminated) and e.error_code == code for e in goaway)
    assert pair.client.receive_data(b"anything") == []  # later input is ignored
    # h2's client rejects the same bytes too
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "e")])
    client.receive_data(pair.to_client)
    with pytest.raises(h2.exceptions.ProtocolError):
        client.receive_data(bad)


def test_a_server_preface_that_is_not_settings_is_a_connection_error():
    connection = GrpcConnection("e:1")
    connection.initiate()
    events = connection.receive_data(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert [type(e) for e in events] == [ConnectionTerminated]


@settings(max_examples=200, deadline=None)
@given(noise=st.binary(max_size=400), position=st.integers(0, 10_000), seed=st.integers(0, 2**32))
def test_mangled_input_never_raises(noise, position, seed):
    pair = Pair()
    pair.handshake()
    stream = pair.client.start_call(PATH, b"")
    pair.to_server()
    pair.server.send_headers(stream.stream_id, [(":status", "200"), ("content-type", "application/grpc")])
    pair.server.send_data(stream.stream_id, grpc_frame(b"hello") * 3, pad_length=3)
    pair.server.send_headers(stream.stream_id, [("grpc-status", "0")], end_stream=True)
    data = bytearray(pair.server.data_to_send())
    cut = position % (len(data) + 1)
    data[cut:cut] = noise
    for piece in split(bytes(data), 5, random.Random(seed)):
        events = pair.client.receive_data(piece)
        assert all(type(e).__module__ == wire.__name__ for e in events)
    assert stream.outcome is None or stream.outcome[0] in wire._STATUS_NAMES
    if pair.client.terminated is not None:
        assert stream.outcome is not None, "a connection error ends every open stream"
    pair.client.data_to_send()


def test_grpc_timeouts_fit_eight_digits_and_round_up():
    assert wire.grpc_timeout(0.3) == "300000u"
    assert wire.grpc_timeout(1e-9) == "1u"
    assert wire.grpc_timeout(1000) == "1000000m"
    assert wire.grpc_timeout(1e9) == "99999999S"
    assert all(len(wire.grpc_timeout(t)) <= 9 for t in (0.0001, 99.9, 1e5, 1e7, 1e12))
