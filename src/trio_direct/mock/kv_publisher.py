"""SGLang's ZMQ KV-event publisher, one per DP rank, for the mock engine.

Speaks exactly what a stock SGLang engine puts on the wire (sglang's
``python/sglang/srt/disaggregation/kv_events.py``, ``ZmqEventPublisher``) so the
frontend's subscriber, gap detection and replay can be tested against it: a PUB socket
sending ``[topic, seq (8-byte big-endian), msgpack batch]`` and an optional ROUTER
answering replay requests from a ring of the last ``buffer_steps`` batches. ``format``
picks the generation: ``"map"`` is 0.5.23 (map-encoded events, 4-frame replay replies),
``"array"`` is 0.5.19 (tagged arrays with trailing ``medium``, 3-frame replies). Batches are
numbered from 1, as a stock SGLang engine's are (a subscriber there sees 1 as the first seq).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import msgspec
import trio
import zmq

from trio_direct.mock.kv_types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from trio_direct.zmqio import TrioSocket

__all__ = [
    "END_SEQ",
    "KvEventPublisher",
    "KvEventPublishers",
    "KvEventsConfig",
    "bind_kv_publishers",
    "decode_batch",
    "describe",
    "encode_batch",
    "open_kv_publishers",
    "rank_endpoint",
]

log = logging.getLogger(__name__)

EventFormat = Literal["map", "array"]

#: Sequence frame of the replay end marker: -1 as eight 0xFF bytes.
END_SEQ = b"\xff" * 8

#: The seq of a publisher's first batch: SGLang's first is 1.
FIRST_SEQ = 1

DEFAULT_ENDPOINT = "tcp://*:5557"
DEFAULT_BUFFER_STEPS = 10_000
DEFAULT_HWM = 100_000
#: Longest a replay may wait on a peer that is not reading its replies.
REPLAY_SEND_TIMEOUT = 10.0

#: Storage tier of every block the mock reports; a real engine also says CPU_PINNED, DISK...
MEDIUM = "GPU"

_WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]"})
# SGLang 0.5.23 calls its map encoding "default"; "dynamo" (namespaced hashes) is not mocked.
_FORMAT_ALIASES: dict[str, EventFormat] = {"map": "map", "default": "map", "array": "array"}
_BIND_ATTEMPTS = 20
_encoder = msgspec.msgpack.Encoder()


@dataclasses.dataclass(slots=True, frozen=True)
class KvEventsConfig:
    """The ``--kv-events-config`` JSON of an SGLang engine, plus the mock's ``format``."""

    publisher: Literal["null", "zmq"] = "null"
    endpoint: str = DEFAULT_ENDPOINT
    replay_endpoint: str | None = None
    buffer_steps: int = DEFAULT_BUFFER_STEPS
    hwm: int = DEFAULT_HWM
    topic: str = ""
    format: EventFormat = "map"

    @property
    def enabled(self) -> bool:
        return self.publisher == "zmq"

    @classmethod
    def from_json(cls, text: str | None) -> KvEventsConfig:
        """Parse the CLI JSON; empty or ``None`` means publishing is off.

        Keys SGLang has but the mock does not model (``bind``, ``max_queue_size``...)
        are ignored, as are unknown ones.
        """
        if not text:
            return cls()
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError("kv-events config must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> KvEventsConfig:
        publisher = raw.get("publisher", "null")
        if publisher not in ("null", "zmq"):
            raise ValueError(f"unsupported kv-events publisher {publisher!r}")
        name = raw.get("format", "map")
        fmt = _FORMAT_ALIASES.get(name) if isinstance(name, str) else None
        if fmt is None:
            raise ValueError(f"unsupported kv-events format {name!r}")
        config = cls(
            publisher=publisher,
            endpoint=str(raw.get("endpoint") or DEFAULT_ENDPOINT),
            replay_endpoint=raw.get("replay_endpoint") or None,
            buffer_steps=int(raw.get("buffer_steps", DEFAULT_BUFFER_STEPS)),
            hwm=int(raw.get("hwm", DEFAULT_HWM)),
            topic=str(raw.get("topic") or ""),
            format=fmt,
        )
        if config.buffer_steps < 0 or config.hwm < 0:
            raise ValueError("buffer_steps and hwm must not be negative")
        return config


def rank_endpoint(endpoint: str, dp_rank: int) -> str:
    """The address DP rank ``dp_rank`` uses: TCP port + rank, or ``<endpoint>_dp<rank>``.

    Port 0 stays 0 for every rank (each gets its own ephemeral port).
    """
    if endpoint.startswith("tcp://"):
        host, port = _split_tcp(endpoint)
        return f"tcp://{host}:{port + dp_rank if port else 0}"
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{dp_rank}"
    raise ValueError(f"kv-events endpoint must be tcp://, ipc:// or inproc://: {endpoint!r}")


def encode_batch(ts: float, events: Sequence[KvEvent], dp_rank: int | None, fmt: EventFormat) -> bytes:
    """msgpack of SGLang's ``[ts, [events...], dp_rank]`` batch in the given generation."""
    encode = _event_as_map if fmt == "map" else _event_as_array
    return _encoder.encode([ts, [encode(event) for event in events], dp_rank])


def decode_batch(payload: bytes) -> tuple[float, list[KvEvent], int | None]:
    """Inverse of ``encode_batch`` for both generations; bad events are skipped, not fatal."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError("not a KV event batch")
    ts = raw[0]
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise ValueError("KV event batch without a timestamp")
    rank = raw[2] if len(raw) > 2 and _is_int(raw[2]) else None
    events = [event for item in raw[1] if (event := _decode_event(item)) is not None]
    return float(ts), events, rank


class KvEventPublisher:
    """The PUB socket (and optional replay ROUTER) of one DP rank; binds on construction."""

    def __init__(self, config: KvEventsConfig, dp_rank: int, ctx: zmq.Context | None = None) -> None:
        if not config.enabled:
            raise ValueError("kv-events publisher is 'null'; nothing to publish on")
        ctx = ctx if ctx is not None else zmq.Context.instance()
        self.config = config
        self.dp_rank = dp_rank
        self._topic = config.topic.encode()
        self._seq = FIRST_SEQ
        self._skip = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps if config.replay_endpoint else 0)
        self._replay: TrioSocket | None = None
        self.bound_replay_endpoint: str | None = None
        self._pub = TrioSocket(ctx, zmq.PUB, sndhwm=config.hwm)
        try:
            self.bound_endpoint = self._pub.bind(rank_endpoint(config.endpoint, dp_rank))
            if config.replay_endpoint:
                self._replay = TrioSocket(ctx, zmq.ROUTER)
                # Make a full reply queue wait for the peer (and an unknown peer an error)
                # instead of dropping replayed batches silently.
                self._replay.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
                self.bound_replay_endpoint = self._replay.bind(rank_endpoint(config.replay_endpoint, dp_rank))
        except BaseException:
            self.close()
            raise

    @property
    def next_seq(self) -> int:
        """Sequence number the next published batch will carry."""
        return self._seq

    @property
    def bound_port(self) -> int | None:
        return _tcp_port(self.bound_endpoint)

    @property
    def bound_replay_port(self) -> int | None:
        return _tcp_port(self.bound_replay_endpoint) if self.bound_replay_endpoint else None

    def publish(self, events: Sequence[KvEvent], ts: float | None = None) -> None:
        """Publish one scheduler step's events as one batch; an empty step sends nothing.

        Like SGLang, a PUB at its HWM drops the batch; its seq is still used up.
        """
        if not events:
            return
        ts = time.time() if ts is None else ts
        payload = encode_batch(ts, events, self.dp_rank, self.config.format)
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self._skip:
            self._skip -= 1
            return
        self._pub.send_multipart_nowait([self._topic, seq.to_bytes(8, "big"), payload])

    def drop_next(self, n: int = 1) -> None:
        """Test hook: the next ``n`` batches use up their seq but are only kept for replay.

        Subscribers then see a gap, exactly as after a HWM drop.
        """
        if n < 0:
            raise ValueError("n must not be negative")
        self._skip += n

    def publish_payload(self, payload: bytes) -> int:
        """Test hook: publish ``payload`` as-is as the next batch, however malformed; returns its seq.

        The seq is used up and the payload kept for replay, as a corrupt batch would be.
        """
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        self._pub.send_multipart_nowait([self._topic, seq.to_bytes(8, "big"), payload])
        return seq

    def send_frames(self, frames: Sequence[bytes]) -> None:
        """Test hook: put raw multipart ``frames`` on the PUB socket; no seq is used up."""
        self._pub.send_multipart_nowait(list(frames))

    def restart_sequence(self) -> None:
        """Test hook: number from the start again with an empty replay ring, as a restarted publisher does."""
        self._seq = FIRST_SEQ
        self._skip = 0
        self._buffer.clear()

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled; returns at once without a replay endpoint."""
        if self._replay is None:
            await trio.lowlevel.checkpoint()
            return
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("ignoring malformed KV replay request (%d frames)", len(frames))
                continue
            identity, start_seq = frames[0], int.from_bytes(frames[2], "big")
            replies = [
                self._replay_frames(identity, seq.to_bytes(8, "big"), payload)
                for seq, payload in self._buffer
                if seq >= start_seq
            ]
            replies.append(self._replay_frames(identity, END_SEQ, b"", topic=b""))
            # A peer that stops reading must not stall replay for everyone else.
            with trio.move_on_after(REPLAY_SEND_TIMEOUT) as scope:
                try:
                    for reply in replies:
                        await self._replay.send_multipart(reply)
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    log.info("KV replay peer went away mid-replay")
            if scope.cancelled_caught:
                log.warning("KV replay peer stopped reading; abandoned its replay")

    def close(self) -> None:
        self._pub.close()
        if self._replay is not None:
            self._replay.close()

    def _replay_frames(self, identity: bytes, seq: bytes, payload: bytes, topic: bytes | None = None) -> list[bytes]:
        if self.config.format == "array":
            return [identity, b"", seq, payload]
        return [identity, b"", self._topic if topic is None else topic, seq, payload]


@dataclasses.dataclass(slots=True)
class KvEventPublishers:
    """Every rank's publisher of one engine; ``config`` has the ports actually bound."""

    config: KvEventsConfig
    ranks: list[KvEventPublisher]

    def __getitem__(self, dp_rank: int) -> KvEventPublisher:
        return self.ranks[dp_rank]

    def __len__(self) -> int:
        return len(self.ranks)

    def __iter__(self) -> Iterator[KvEventPublisher]:
        return iter(self.ranks)

    def close(self) -> None:
        for publisher in self.ranks:
            publisher.close()


def bind_kv_publishers(config: KvEventsConfig, dp_size: int, ctx: zmq.Context | None = None) -> KvEventPublishers:
    """Bind every rank; with port 0, pick a free block of consecutive ports.

    Consecutive ports keep ``endpoint_port_base + rank`` (what a subscriber dials) true
    even for ephemeral test ports.
    """
    if dp_size < 1:
        raise ValueError("dp_size must be at least 1")
    if not config.enabled:
        return KvEventPublishers(config, [])
    ephemeral = _tcp_port(config.endpoint) == 0 or (
        config.replay_endpoint is not None and _tcp_port(config.replay_endpoint) == 0
    )
    for attempt in range(_BIND_ATTEMPTS):
        ranks: list[KvEventPublisher] = []
        try:
            ranks.append(KvEventPublisher(config, 0, ctx))
            resolved = _resolve_ports(config, ranks[0])
            for dp_rank in range(1, dp_size):
                ranks.append(KvEventPublisher(resolved, dp_rank, ctx))
        except zmq.ZMQError as exc:
            for publisher in ranks:
                publisher.close()
            if exc.errno != zmq.EADDRINUSE or not ephemeral or attempt == _BIND_ATTEMPTS - 1:
                raise
            continue
        return KvEventPublishers(resolved, ranks)
    raise AssertionError("unreachable")


@asynccontextmanager
async def open_kv_publishers(
    config: KvEventsConfig, dp_size: int, ctx: zmq.Context | None = None
) -> AsyncIterator[KvEventPublishers]:
    """Bind all ranks and serve their replay endpoints for the duration of the block."""
    publishers = bind_kv_publishers(config, dp_size, ctx)
    try:
        async with trio.open_nursery() as nursery:
            for publisher in publishers:
                if publisher.bound_replay_endpoint is not None:
                    nursery.start_soon(publisher.serve_replay)
            try:
                yield publishers
            finally:
                nursery.cancel_scope.cancel()
    finally:
        publishers.close()


def describe(host: str, config: KvEventsConfig, dp_size: int, block_size: int) -> dict[str, Any]:
    """The ``kv_events`` (and 0.5.23 ``kv_event_sources``) entries of GetServerInfo.

    ``config`` must carry real ports (``KvEventPublishers.config``). ``host`` replaces a
    wildcard bind host in ``kv_event_sources``, which name a directly dialable address.
    ``format="array"`` describes a 0.5.19 engine: no replay port, no sources list.
    """
    newest = config.format == "map"
    if not config.enabled or not config.endpoint.startswith("tcp://"):
        return {"kv_events": None, "kv_event_sources": []} if newest else {"kv_events": None}
    bind_host, port = _split_tcp(config.endpoint)
    replay_port = None
    if config.replay_endpoint and config.replay_endpoint.startswith("tcp://"):
        replay_port = _split_tcp(config.replay_endpoint)[1]
    if port == 0 or replay_port == 0:
        raise ValueError("describe() needs bound ports; pass KvEventPublishers.config")
    descriptor: dict[str, Any] = {
        "publisher": "zmq",
        "endpoint_host": bind_host,
        "endpoint_port_base": port,
        "topic": config.topic,
        "block_size": block_size,
        "dp_size": dp_size,
    }
    if not newest:
        return {"kv_events": descriptor}
    if replay_port is not None:
        descriptor["replay_endpoint_port_base"] = replay_port
    dial_host = host if bind_host in _WILDCARD_HOSTS else bind_host
    sources = []
    for dp_rank in range(dp_size):
        source: dict[str, Any] = {
            "dp_rank": dp_rank,
            "endpoint": f"tcp://{dial_host}:{port + dp_rank}",
            "topic": config.topic,
            "block_size": block_size,
        }
        if replay_port is not None:
            source["replay_endpoint"] = f"tcp://{dial_host}:{replay_port + dp_rank}"
        sources.append(source)
    return {"kv_events": descriptor, "kv_event_sources": sources}


# -- wire encoding ---------------------------------------------------------------------


def _event_as_map(event: KvEvent) -> dict[str, Any]:
    # SGLang 0.5.23: "type"-tagged maps; lora_id is always present, null-valued optional
    # keys (cache_salt, session_id, lora_name) are omitted.
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM,
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": MEDIUM}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {event!r}")


def _event_as_array(event: KvEvent) -> list[Any]:
    # SGLang 0.5.19: tag-first arrays, trailing medium on stores and removals.
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            None,
            MEDIUM,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, MEDIUM]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def _decode_event(item: Any) -> KvEvent | None:
    fields: tuple[Any, ...]
    try:
        if isinstance(item, dict):
            tag = item["type"]
            if tag == "BlockStored":
                fields = (
                    item["block_hashes"],
                    item.get("parent_block_hash"),
                    item["token_ids"],
                    item["block_size"],
                )
            elif tag == "BlockRemoved":
                fields = (item["block_hashes"],)
            else:
                fields = ()
        elif isinstance(item, list) and item:
            tag, fields = item[0], tuple(item[1:5])
        else:
            return None
        if tag == "BlockStored":
            hashes, parent, token_ids, block_size = fields
            if not _is_int_list(hashes) or not (parent is None or _is_int(parent)):
                return None
            if not isinstance(token_ids, list) or not _is_int(block_size) or block_size < 1:
                return None
            # Ids pass through unchecked, and EAGLE bigram [token, next] pairs as tuples: not the
            # tuple[int, ...] that BlockStored declares, so the checker is told Any.
            tokens: tuple[Any, ...] = tuple(tuple(t) if isinstance(t, list) else t for t in token_ids)
            return BlockStored(
                block_hashes=tuple(hashes), parent_block_hash=parent, token_ids=tokens, block_size=block_size
            )
        if tag == "BlockRemoved":
            (hashes,) = fields[:1]
            return BlockRemoved(block_hashes=tuple(hashes)) if _is_int_list(hashes) else None
        if tag == "AllBlocksCleared":
            return AllBlocksCleared()
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


# -- endpoints -------------------------------------------------------------------------


def _split_tcp(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not sep or not host:
        raise ValueError(f"tcp endpoint needs host:port: {endpoint!r}")
    return host, int(port)


def _tcp_port(endpoint: str) -> int | None:
    return _split_tcp(endpoint)[1] if endpoint.startswith("tcp://") else None


def _resolve_ports(config: KvEventsConfig, rank0: KvEventPublisher) -> KvEventsConfig:
    """``config`` with port 0 replaced by the ports rank 0 actually got."""
    if _tcp_port(config.endpoint) == 0:
        config = dataclasses.replace(config, endpoint=f"tcp://{_split_tcp(config.endpoint)[0]}:{rank0.bound_port}")
    if config.replay_endpoint and _tcp_port(config.replay_endpoint) == 0:
        host = _split_tcp(config.replay_endpoint)[0]
        config = dataclasses.replace(config, replay_endpoint=f"tcp://{host}:{rank0.bound_replay_port}")
    return config
