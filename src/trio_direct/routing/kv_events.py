"""SGLang KV-event batches and per-socket sequence tracking, without I/O.

Two jobs the ZMQ subscriber needs and a unit test can check on its own:

* ``decode_batch`` turns one msgpack payload into events, whatever the engine's generation
  (``kv-events.md`` §4): 0.5.23 ``type``-tagged maps, 0.5.9–0.5.19 tag-first arrays with a
  trailing ``medium``, 0.5.4 arrays. It is lenient the way the smg relay is: extra keys and
  trailing fields are ignored and one bad event is dropped (and counted) without losing the
  rest of its batch. Only a payload that is no batch at all raises ``BadBatch``.
* ``SequenceTracker`` decides, from a batch's sequence number alone, whether to apply it,
  skip it, recover a gap through replay, or treat the publisher as restarted (§3, §8). The
  first batch from a publisher sets the baseline: SGLang numbers its first batch 1, and a
  subscriber that joins late never saw the earlier ones, so neither is a gap.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "APPLY",
    "SKIP",
    "Action",
    "AllBlocksCleared",
    "Apply",
    "BadBatch",
    "BlockRemoved",
    "BlockStored",
    "DecodedBatch",
    "Gap",
    "Join",
    "KvEvent",
    "Restart",
    "SequenceTracker",
    "Skip",
    "decode_batch",
]

#: Router-side block keys hash token ids as little-endian u32 (``kv-events.md`` §7).
_U32 = "I" if array("I").itemsize == 4 else "L"


# -- events ------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class BlockStored:
    """A run of full pages entered the engine's prefix cache.

    ``len(token_ids) == len(block_hashes) * block_size``; the hashes are the engine's opaque
    ids, ``parent_block_hash`` the page before the run (``None`` at the radix root).
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(slots=True, frozen=True)
class BlockRemoved:
    """Pages evicted from the engine's prefix cache."""

    block_hashes: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class AllBlocksCleared:
    """The engine flushed its whole prefix cache."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True, frozen=True)
class DecodedBatch:
    """One published batch: ``dp_rank`` as the engine filled it (may be ``None``)."""

    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None
    dropped_events: int


class BadBatch(ValueError):
    """The payload is not a KV event batch; the caller counts it and moves on."""


# -- decoding ----------------------------------------------------------------------------


def decode_batch(payload: bytes) -> DecodedBatch:
    """Decode ``[ts, [events...], dp_rank]`` in any SGLang generation."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        # Bytes from the network: msgspec also raises UnicodeDecodeError (a str that is not UTF-8)
        # and RecursionError (deep nesting); none of it may take the subscriber down.
        raise BadBatch(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if isinstance(raw, dict):
        # Not what SGLang sends (its batch is array_like), but cheap to accept.
        raw = [raw.get("ts"), raw.get("events"), raw.get("dp_rank", raw.get("data_parallel_rank"))]
    if not isinstance(raw, list) or len(raw) < 2:
        raise BadBatch("not a [ts, events, dp_rank] batch")
    ts, items = raw[0], raw[1]
    if type(ts) not in (int, float):
        raise BadBatch(f"batch timestamp is not a number: {ts!r}")
    if not isinstance(items, list):
        raise BadBatch("batch events are not a list")
    rank = raw[2] if len(raw) > 2 and type(raw[2]) is int else None
    events: list[KvEvent] = []
    for item in items:
        event = _decode_event(item)
        if event is not None:
            events.append(event)
    return DecodedBatch(float(ts), tuple(events), rank, len(items) - len(events))


def _decode_event(item: Any) -> KvEvent | None:
    """One event, or ``None`` when it is malformed or of a kind this router does not know."""
    if isinstance(item, dict):
        tag = item.get("type")
        if tag == "BlockStored":
            return _stored(
                item.get("block_hashes"),
                item.get("parent_block_hash"),
                item.get("token_ids"),
                item.get("block_size"),
            )
        if tag == "BlockRemoved":
            return _removed(item.get("block_hashes"))
        return AllBlocksCleared() if tag == "AllBlocksCleared" else None
    if isinstance(item, list) and item:
        tag = item[0]
        # Trailing lora_id / medium (and anything newer) are ignored; 0.5.9's omit_defaults
        # may leave them out altogether.
        if tag == "BlockStored":
            return _stored(*item[1:5]) if len(item) >= 5 else None
        if tag == "BlockRemoved":
            return _removed(item[1]) if len(item) >= 2 else None
        return AllBlocksCleared() if tag == "AllBlocksCleared" else None
    return None


def _stored(hashes: Any, parent: Any, token_ids: Any, block_size: Any) -> BlockStored | None:
    if type(block_size) is not int or block_size < 1:
        return None
    block_hashes = _hashes(hashes)
    if block_hashes is None or not (parent is None or type(parent) is int):
        return None
    # A store that names one block twice (or its own parent) would make a cycle in the index;
    # Dynamo drops these as "self-referencing".
    if len(set(block_hashes)) != len(block_hashes) or parent in block_hashes:
        return None
    tokens = _token_ids(token_ids)
    if tokens is None or len(tokens) != len(block_hashes) * block_size:
        return None
    return BlockStored(block_hashes, parent, tokens, block_size)


def _removed(hashes: Any) -> BlockRemoved | None:
    block_hashes = _hashes(hashes)
    return None if block_hashes is None else BlockRemoved(block_hashes)


def _hashes(raw: Any) -> tuple[int, ...] | None:
    # Engine hashes are opaque int64 or uint64 values; only their type is checked.
    if not isinstance(raw, list) or not all(type(h) is int for h in raw):
        return None
    return tuple(raw)


def _token_ids(raw: Any) -> tuple[int, ...] | None:
    # Checked by packing into u32 (type and range at C speed): a page-1 engine sends every
    # prompt token through here, so a per-item Python check would cost milliseconds per request.
    if not isinstance(raw, list):
        return None
    if not _fit_u32(raw):
        # EAGLE bigram hashing sends [token, next] pairs; the block's own token is the first.
        raw = [t[0] if type(t) is list and len(t) == 2 else t for t in raw]
        if not _fit_u32(raw):
            return None
    return tuple(raw)


def _fit_u32(values: list[Any]) -> bool:
    """Every value is an int in ``[0, 2**32)``."""
    try:
        array(_U32).fromlist(values)
    except (TypeError, OverflowError):
        return False
    return True


# -- sequence tracking -------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Apply:
    """The batch is the next one: apply it."""


@dataclass(slots=True, frozen=True)
class Skip:
    """Already applied (it came in through replay): ignore it."""


@dataclass(slots=True, frozen=True)
class Gap:
    """Batches ``expected`` .. ``got - 1`` never arrived.

    However far a publisher jumps, it is one gap: counters count gaps, never ``missing``,
    which a broken or hostile publisher can make as large as 2**64.
    """

    expected: int
    got: int

    @property
    def missing(self) -> int:
        return self.got - self.expected


@dataclass(slots=True, frozen=True)
class Join:
    """The first batch seen from this publisher, numbered ``got`` > 0: it sets the baseline.

    The batches before it were published before this socket subscribed (or never existed:
    SGLang numbers its first batch 1). They were never seen, so nothing is lost and nothing
    needs clearing; with a replay endpoint the caller may fetch them to learn what the engine
    cached, then ``start_at`` the first one it got.
    """

    got: int


@dataclass(slots=True, frozen=True)
class Restart:
    """The live stream went backwards: a new publisher (engine restart) numbering afresh."""

    last: int
    got: int


Action = Apply | Skip | Gap | Join | Restart

APPLY = Apply()
SKIP = Skip()


class SequenceTracker:
    """Sequence state of one SUB socket (one engine DP rank).

    Two watermarks: the last seq *applied* (live or replayed) and the last seq seen on the
    *live* socket. A PUB delivers each batch once and in order, so a live seq that does not
    rise is a new publisher, however small the step back; a live seq that rises but is not
    above the applied watermark was already applied through replay. A fresh tracker takes the
    first live seq as its baseline (``Join``, or ``APPLY`` for seq 0): joining a publisher
    mid-stream, or SGLang's first batch being 1, is not a gap.

    After a ``Restart`` the tracker is fresh again: observe the same seq once more to learn
    what to do with that batch.
    """

    __slots__ = ("_applied", "_live")

    def __init__(self) -> None:
        self._applied: int | None = None
        self._live: int | None = None

    @property
    def last_applied(self) -> int | None:
        return self._applied

    @property
    def expected(self) -> int:
        """The seq the next applied batch must carry (0 before the baseline is set)."""
        return 0 if self._applied is None else self._applied + 1

    def observe(self, seq: int) -> Action:
        """Classify a batch from the live socket (and apply it to the state when ``APPLY``)."""
        if self._live is not None and seq <= self._live:
            restart = Restart(self._live, seq)
            self.reset()
            return restart
        self._live = seq
        if self._applied is None and seq > 0:
            return Join(seq)
        return self.observe_replayed(seq)

    def observe_replayed(self, seq: int) -> Action:
        """Classify a batch that may have been seen already (a replayed one).

        Never reports a restart: replayed seqs say nothing about the live stream.
        """
        expected = self.expected
        if seq < expected:
            return SKIP
        if seq > expected:
            return Gap(expected, seq)
        self._applied = seq
        return APPLY

    def start_at(self, seq: int) -> None:
        """Set the baseline after a ``Join``: ``seq`` is the next batch to apply."""
        self._applied = seq - 1 if seq > 0 else None

    def replay_result(self, first_seq: int | None) -> bool:
        """Whether a replay from ``expected`` proves history lost.

        ``first_seq`` is the first replayed seq, ``None`` for an immediate end marker: the
        publisher's buffer no longer reaches back to ``expected``.
        """
        return first_seq is None or first_seq > self.expected

    def accept_loss(self, resume_seq: int) -> None:
        """Give up on everything before ``resume_seq``; it is the next batch to apply.

        The caller has cleared the rank's index entries, so later batches stand on their own.
        """
        self.start_at(resume_seq)

    def reset(self) -> None:
        """Forget everything: the next live batch is judged as if just subscribed."""
        self._applied = None
        self._live = None
