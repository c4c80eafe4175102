"""Decoding SGLang KV-event batches of every generation, and the per-socket sequence rules."""

from typing import Any

import msgspec
import pytest

from trio_direct.routing.kv_events import (
    APPLY,
    SKIP,
    AllBlocksCleared,
    BadBatch,
    BlockRemoved,
    BlockStored,
    Gap,
    Join,
    Restart,
    SequenceTracker,
    decode_batch,
)

STORED = BlockStored(block_hashes=(11, -12), parent_block_hash=10, token_ids=(1, 2, 3, 4), block_size=2)
ROOT = BlockStored(block_hashes=(5,), parent_block_hash=None, token_ids=(9, 9), block_size=2)
REMOVED = BlockRemoved(block_hashes=(11,))
CLEARED = AllBlocksCleared()


def _payload(events: list[Any], ts: Any = 1.5, rank: Any = 0) -> bytes:
    return msgspec.msgpack.encode([ts, events, rank])


# 0.5.23: "type"-tagged maps, optional keys omitted when null, lora_id always present.
MAP_EVENTS: list[dict[str, Any]] = [
    {
        "type": "BlockStored",
        "block_hashes": [11, -12],
        "parent_block_hash": 10,
        "token_ids": [1, 2, 3, 4],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
    },
    {
        "type": "BlockStored",
        "block_hashes": [5],
        "parent_block_hash": None,
        "token_ids": [9, 9],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "cache_salt": "s",
        "lora_name": "x",
    },
    {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
    {"type": "AllBlocksCleared"},
]
# 0.5.19: tag-first arrays with lora_id and a trailing medium.
ARRAY_0519 = [
    ["BlockStored", [11, -12], 10, [1, 2, 3, 4], 2, None, "GPU"],
    ["BlockStored", [5], None, [9, 9], 2, None, "CPU_PINNED"],
    ["BlockRemoved", [11], "GPU"],
    ["AllBlocksCleared"],
]
# 0.5.4: arrays ending at lora_id, no medium.
ARRAY_054 = [
    ["BlockStored", [11, -12], 10, [1, 2, 3, 4], 2, None],
    ["BlockStored", [5], None, [9, 9], 2, None],
    ["BlockRemoved", [11]],
    ["AllBlocksCleared"],
]


@pytest.mark.parametrize("events", [MAP_EVENTS, ARRAY_0519, ARRAY_054], ids=["0.5.23", "0.5.19", "0.5.4"])
def test_every_generation_decodes_to_the_same_events(events: list[Any]) -> None:
    batch = decode_batch(_payload(events, ts=1.5, rank=3))
    assert batch.ts == 1.5
    assert batch.dp_rank == 3
    assert batch.events == (STORED, ROOT, REMOVED, CLEARED)
    assert batch.dropped_events == 0


def test_extra_keys_and_trailing_fields_are_ignored() -> None:
    events = [
        {**MAP_EVENTS[0], "session_id": "abc", "future_key": [1, 2]},
        ["BlockRemoved", [11], "GPU", "something newer"],
        ["AllBlocksCleared", "extra"],
    ]
    assert decode_batch(_payload(events)).events == (STORED, REMOVED, CLEARED)


def test_batch_without_rank_and_with_integer_timestamp() -> None:
    batch = decode_batch(msgspec.msgpack.encode([7, [["AllBlocksCleared"]]]))
    assert (batch.ts, batch.dp_rank, batch.events) == (7.0, None, (CLEARED,))
    assert decode_batch(_payload([], rank=None)).dp_rank is None


def test_eagle_bigram_token_pairs_keep_the_first_token() -> None:
    event = {**MAP_EVENTS[0], "token_ids": [[1, 100], [2, 101], [3, 102], [4, 103]]}
    assert decode_batch(_payload([event])).events == (STORED,)


BAD_EVENTS = {
    "token count not hashes x block size": {**MAP_EVENTS[0], "token_ids": [1, 2, 3]},
    "block size zero": {**MAP_EVENTS[0], "block_size": 0, "token_ids": []},
    "hash not an integer": {**MAP_EVENTS[0], "block_hashes": [11, "12"]},
    "parent not an integer": {**MAP_EVENTS[0], "parent_block_hash": 1.5},
    "token not an integer": {**MAP_EVENTS[0], "token_ids": [1, 2, 3, "4"]},
    "negative token": {**MAP_EVENTS[0], "token_ids": [1, 2, 3, -4]},
    "token beyond u32": {**MAP_EVENTS[0], "token_ids": [1, 2, 3, 2**32]},
    "bad token pair": {**MAP_EVENTS[0], "token_ids": [[1, 2, 3], 2, 3, 4]},
    "same hash twice": {**MAP_EVENTS[0], "block_hashes": [11, 11]},
    "own parent": {**MAP_EVENTS[0], "parent_block_hash": 11},
    "store missing token_ids": {"type": "BlockStored", "block_hashes": [1], "block_size": 1},
    "removal without hashes": {"type": "BlockRemoved"},
    "unknown type": {"type": "BlockMoved", "block_hashes": [1]},
    "map without type": {"block_hashes": [1]},
    "short stored array": ["BlockStored", [1], None, [1]],
    "unknown array tag": ["Nope", 1],
    "empty array": [],
    "not a container": 42,
}


@pytest.mark.parametrize("event", BAD_EVENTS.values(), ids=BAD_EVENTS.keys())
def test_a_bad_event_is_dropped_and_counted_but_its_batch_survives(event: Any) -> None:
    batch = decode_batch(_payload([MAP_EVENTS[2], event, ARRAY_0519[3]]))
    assert batch.events == (REMOVED, CLEARED)
    assert batch.dropped_events == 1


BAD_PAYLOADS = {
    "not msgpack": b"\xc1\xc1\xc1",
    "empty": b"",
    "truncated": _payload(MAP_EVENTS)[:-3],
    "not an array": msgspec.msgpack.encode("hello"),
    "too short": msgspec.msgpack.encode([1.0]),
    "events not a list": msgspec.msgpack.encode([1.0, {"a": 1}, 0]),
    "timestamp not a number": msgspec.msgpack.encode(["now", [], 0]),
    "timestamp is a bool": msgspec.msgpack.encode([True, [], 0]),
    "a str that is not UTF-8": b"\xa2\xff\xfe",
    "nested too deep": b"\x91" * 100_000 + b"\xc0",
}


@pytest.mark.parametrize("payload", BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_a_payload_that_is_no_batch_raises_bad_batch(payload: bytes) -> None:
    with pytest.raises(BadBatch):
        decode_batch(payload)


# -- sequence tracking -------------------------------------------------------------------


def test_in_order_batches_apply_from_zero() -> None:
    tracker = SequenceTracker()
    assert tracker.expected == 0
    assert [tracker.observe(seq) for seq in range(3)] == [APPLY] * 3
    assert tracker.last_applied == 2
    assert tracker.expected == 3


@pytest.mark.parametrize("first", [1, 57, 2**63])
def test_the_first_batch_sets_the_baseline_whatever_its_seq(first: int) -> None:
    """SGLang's first batch is 1, and a late subscriber's first is whatever is live: no gap."""
    tracker = SequenceTracker()
    assert tracker.observe(first) == Join(got=first)
    assert tracker.last_applied is None
    tracker.start_at(first)
    assert tracker.observe_replayed(first) == APPLY
    assert tracker.observe(first + 1) == APPLY


def test_a_join_may_take_earlier_batches_from_replay_first() -> None:
    tracker = SequenceTracker()
    assert tracker.observe(5) == Join(got=5)
    tracker.start_at(1)  # the replay buffer begins at SGLang's first batch
    assert [tracker.observe_replayed(seq) for seq in (1, 2, 3, 4, 5)] == [APPLY] * 5
    assert tracker.observe(6) == APPLY


def test_a_jump_of_any_size_is_one_gap_and_going_back_is_a_restart() -> None:
    tracker = SequenceTracker()
    tracker.observe(0)
    gap = tracker.observe(2**64 - 2)
    assert gap == Gap(expected=1, got=2**64 - 2)
    tracker.accept_loss(gap.got)
    assert tracker.observe_replayed(gap.got) == APPLY
    assert tracker.observe(3) == Restart(last=2**64 - 2, got=3)


def test_a_skipped_seq_is_a_gap_and_replayed_batches_fill_it() -> None:
    tracker = SequenceTracker()
    for seq in range(42):
        tracker.observe(seq)
    gap = tracker.observe(45)
    assert gap == Gap(expected=42, got=45)
    assert gap.missing == 3
    # The replay covers 42..46; the live 45 that revealed the gap comes after it.
    assert not tracker.replay_result(42)
    assert [tracker.observe_replayed(seq) for seq in (42, 43, 44, 45, 46)] == [APPLY] * 5
    assert tracker.observe_replayed(45) == SKIP
    # Live batches held during the replay: already applied ones skip, the next applies.
    assert tracker.observe(46) == SKIP
    assert tracker.observe(47) == APPLY


def test_replay_result_says_when_history_is_lost() -> None:
    tracker = SequenceTracker()
    for seq in range(10):
        tracker.observe(seq)
    assert tracker.observe(20) == Gap(10, 20)
    assert tracker.replay_result(None)  # immediate end marker
    assert tracker.replay_result(15)  # buffer starts past what we need
    assert not tracker.replay_result(10)
    assert not tracker.replay_result(9)  # overlapping is fine: the old ones skip


def test_a_hole_inside_a_replay_is_a_gap() -> None:
    tracker = SequenceTracker()
    tracker.observe(0)
    assert tracker.observe_replayed(1) == APPLY
    assert tracker.observe_replayed(3) == Gap(2, 3)


def test_accept_loss_resumes_at_the_given_seq() -> None:
    tracker = SequenceTracker()
    tracker.observe(0)
    tracker.observe(9)
    tracker.accept_loss(9)
    assert tracker.observe_replayed(9) == APPLY
    assert tracker.observe(10) == APPLY
    tracker.accept_loss(0)
    assert tracker.last_applied is None


@pytest.mark.parametrize("last", [0, 3, 1000])
def test_a_live_seq_that_does_not_rise_is_a_restart(last: int) -> None:
    tracker = SequenceTracker()
    for seq in range(last + 1):
        tracker.observe(seq)
    assert tracker.observe(0) == Restart(last=last, got=0)
    # Fresh again: the same batch is now judged as if just subscribed.
    assert tracker.last_applied is None
    assert tracker.observe(0) == APPLY


def test_restart_seen_after_the_new_publisher_moved_on_is_then_a_join() -> None:
    tracker = SequenceTracker()
    for seq in range(100):
        tracker.observe(seq)
    assert tracker.observe(4) == Restart(last=99, got=4)
    assert tracker.observe(4) == Join(4)


def test_a_replayed_seq_never_counts_as_a_restart() -> None:
    tracker = SequenceTracker()
    for seq in range(5):
        tracker.observe(seq)
    assert tracker.observe_replayed(0) == SKIP
    assert tracker.observe(5) == APPLY


def test_reset_forgets_everything() -> None:
    tracker = SequenceTracker()
    for seq in range(5):
        tracker.observe(seq)
    tracker.reset()
    assert tracker.expected == 0
    assert tracker.observe(0) == APPLY
