"""The frontend's KV-event subscription over vLLM's gRPC API (`SubscribeKvEvents`): against the mock
engine's stream, and against scripted servers for what a mock does not do on its own (gaps, a relay
without history, an engine without KV events)."""

from __future__ import annotations

import json

import pytest
import trio
from support import wait_until

from trio_direct._proto.smg import common_pb2 as common
from trio_direct.engine import vllm
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.kv_sync.grpc_subscriber import GrpcKvEventSubscriber, KvStreamState, convert_batch
from trio_direct.routing.kv_events import BlockRemoved, BlockStored, KvEvent

KV_EVENTS = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": ""})
TYPES = {vllm.SUBSCRIBE_KV_EVENTS: (True, common.SubscribeKvEventsRequest, common.KvEventBatch)}


class RecordingSink:
    def __init__(self) -> None:
        self.events: dict[int, list[KvEvent]] = {}
        self.clears: list[tuple[int, str]] = []

    def on_events(self, dp_rank: int, events: tuple[KvEvent, ...]) -> None:
        self.events.setdefault(dp_rank, []).extend(events)

    def on_clear(self, dp_rank: int, reason: str) -> None:
        self.clears.append((dp_rank, reason))

    def stored_tokens(self, rank: int = 0) -> list[int]:
        return [t for e in self.events.get(rank, []) if isinstance(e, BlockStored) for t in e.token_ids]


def removed(seq: int, *hashes: int, rank: int = 0) -> common.KvEventBatch:
    event = common.KvCacheEvent(removed=common.KvBlocksRemoved(block_hashes=hashes or (seq,)))
    return common.KvEventBatch(sequence_number=seq, events=[event], dp_rank=rank)


async def generate(port: int, dial, rid: str, prompt: list[int]) -> None:
    client = vllm.VllmEngineClient(dial(port))
    async with client.generate(GenerateInput(rid, prompt, SamplingOptions(max_new_tokens=2))) as chunks:
        async for _ in chunks:
            pass


async def test_what_the_engine_cached_before_the_subscription_is_caught_up_then_live(mock_engine_factory, dial):
    engine = await mock_engine_factory(api="vllm", kv_events_config=KV_EVENTS, dp_size=2)
    await generate(engine.port, dial, "before", list(range(100, 120)))
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, range(2), sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: list(range(100, 120)) == (sink.stored_tokens(0) + sink.stored_tokens(1))[:20])
        await generate(engine.port, dial, "after", list(range(200, 230)))
        await wait_until(lambda: 200 in sink.stored_tokens(0) + sink.stored_tokens(1))
        nursery.cancel_scope.cancel()
    assert not sink.clears
    assert subscriber.counters.joins >= 1 and subscriber.counters.lost == 0


async def test_a_gap_reopens_the_stream_from_the_missing_sequence(fake_engine_factory):
    engine = await fake_engine_factory(TYPES)
    starts: list[int] = []

    def subscribe(call):
        start = call.request.start_sequence_number
        starts.append(start)
        if start == 1:  # history: 1, 2, then the stream skips 3
            for seq in (1, 2, 4):
                call.send(removed(seq))
        elif start == 2:  # reopened from the last applied sequence: 2 again (skipped), then 3 on
            for seq in (2, 3, 4, 5):
                call.send(removed(seq))

    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = subscribe
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, [0], sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: len(sink.events.get(0, [])) == 5)
        nursery.cancel_scope.cancel()
    assert starts == [1, 2]  # the reopened stream starts at the last applied sequence
    assert [e.block_hashes[0] for e in sink.events[0] if isinstance(e, BlockRemoved)] == [1, 2, 3, 4, 5]
    assert (subscriber.counters.gaps, subscriber.counters.replays, subscriber.counters.lost) == (1, 1, 0)
    assert not sink.clears


async def test_a_relay_without_history_is_followed_live_and_a_refused_resume_clears(fake_engine_factory):
    """smg-grpc-servicer's Python relay refuses every cursor but 0 (OUT_OF_RANGE)."""
    engine = await fake_engine_factory(TYPES)
    starts: list[int] = []

    def subscribe(call):
        start = call.request.start_sequence_number
        starts.append(start)
        if start:
            call.fail("OUT_OF_RANGE", "KV event replay cursors are per subscription; resubscribe with zero")
        elif len(starts) == 2:
            call.send(removed(7))
            call.send(removed(8))
            call.finish()  # the stream ends: the subscriber resumes from 8, which is refused
        else:
            call.send(removed(40))

    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = subscribe
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, [0], sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: len(sink.events.get(0, [])) == 3)
        nursery.cancel_scope.cancel()
    assert starts == [1, 0, 8, 0]
    assert len(sink.clears) == 1 and "history lost" in sink.clears[0][1]
    assert subscriber.counters.lost == 1


async def test_an_engine_without_kv_events_is_asked_again_later(fake_engine_factory):
    engine = await fake_engine_factory(TYPES)
    calls: list[int] = []

    def subscribe(call):
        calls.append(call.request.start_sequence_number)
        call.fail("UNIMPLEMENTED", "KV cache events not enabled")

    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = subscribe
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, [0], RecordingSink(), unimplemented_retry=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: len(calls) >= 3)
        nursery.cancel_scope.cancel()


def test_a_resumed_stream_skips_what_it_replays_and_a_sequence_going_back_is_a_restart():
    state = KvStreamState()
    assert state.start_sequence() == 1
    state.opened(1)
    for seq in (1, 2, 3):
        assert state.observe(0, seq)[0] == "apply"
        state.applied(0, seq)
    assert state.start_sequence() == 3
    state.opened(3)
    assert state.observe(0, 3) == ("skip", 4)
    assert state.observe(0, 4)[0] == "apply"
    assert state.observe(0, 6) == ("gap", 4)
    assert state.observe(0, 1) == ("restart", 4)  # below where the stream resumed: a new publisher
    state.forget()
    state.live_only = True
    assert state.start_sequence() == 0


def test_blocks_off_the_device_or_remote_are_not_indexed_and_malformed_stores_are_counted():
    def stored(size: int, tokens: list[int], **extra) -> common.KvCacheEvent:
        block = common.KvBlock(block_hash=9, token_ids=tokens, block_size=size)
        return common.KvCacheEvent(stored=common.KvBlocksStored(blocks=[block], **extra))

    batch = common.KvEventBatch(
        sequence_number=1,
        events=[
            stored(2, [1, 2], tier=common.KV_CACHE_TIER_DEVICE),
            stored(2, [1, 2], tier=common.KV_CACHE_TIER_HOST),
            stored(2, [1, 2], locality=common.KV_CACHE_LOCALITY_REMOTE),
            stored(2, [1, 2, 3]),
            common.KvCacheEvent(cleared=common.KvCacheCleared()),
        ],
    )
    events, dropped = convert_batch(batch)
    assert [type(e).__name__ for e in events] == ["BlockStored", "AllBlocksCleared"]
    assert dropped == 1


@pytest.mark.parametrize("rank", [0, 1])
async def test_engine_down_clears_every_rank(fake_engine_factory, rank):
    engine = await fake_engine_factory(TYPES)
    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = lambda call: call.send(removed(1, rank=rank))
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, range(2), sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: rank in sink.events)
        subscriber.engine_down()
        nursery.cancel_scope.cancel()
    assert sorted(r for r, _ in sink.clears) == [0, 1]
    assert subscriber.last_applied(rank) is None


async def test_a_relay_snapshot_resyncs_the_rank_and_live_batches_follow_it(fake_engine_factory):
    """The Rust servicer's snapshot: chunks numbered up to the state's sequence, the first one
    starting with a clear of the rank, then live batches with no gap."""
    engine = await fake_engine_factory(TYPES)

    def stored(seq: int, token: int, index: int) -> common.KvEventBatch:
        block = common.KvBlock(block_hash=token, token_ids=[token], block_size=1)
        events = [common.KvCacheEvent(stored=common.KvBlocksStored(blocks=[block]))]
        if index == 0:
            events.insert(0, common.KvCacheEvent(cleared=common.KvCacheCleared()))
        snapshot = common.KvSnapshotChunk(index=index, count=2, blocks=2)
        return common.KvEventBatch(sequence_number=seq, events=events, dp_rank=0, snapshot=snapshot)

    def subscribe(call):
        call.send(stored(9, 1, 0))
        call.send(stored(10, 2, 1))
        call.send(removed(11, 1))

    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = subscribe
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, [0], sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: len(sink.events.get(0, [])) == 4)
        nursery.cancel_scope.cancel()
    assert [type(e).__name__ for e in sink.events[0]] == [
        "AllBlocksCleared",
        "BlockStored",
        "BlockStored",
        "BlockRemoved",
    ]
    assert subscriber.last_applied(0) == 11 and subscriber.counters.gaps == 0 and not sink.clears


@pytest.mark.parametrize(
    "uptimes",
    [[1000.0, 1.0, 2.0], [3.0, 0.5, 1.0]],
    ids=["after a long life", "2.5 seconds after its own start"],
)
async def test_an_engine_that_started_again_is_cleared_and_followed_from_its_first_batch(fake_engine_factory, uptimes):
    """A restarted engine numbers afresh: a cursor into the old one must not skip the new batches,
    however short the old engine's life was."""
    from trio_direct._proto.vllm import vllm_engine_pb2 as pb

    engine = await fake_engine_factory(
        {**TYPES, vllm.GET_SERVER_INFO: (False, pb.GetServerInfoRequest, pb.GetServerInfoResponse)}
    )
    uptimes = iter(uptimes)
    starts: list[int] = []

    def server_info(call):
        call.send(pb.GetServerInfoResponse(uptime_seconds=next(uptimes, 3.0)))
        call.finish()

    def subscribe(call):
        starts.append(call.request.start_sequence_number)
        if len(starts) == 1:
            for seq in (1, 2, 3):
                call.send(removed(seq))
            call.finish()  # the old engine goes away
        else:
            for seq in (1, 2, 3, 4):  # the new one's own numbering
                call.send(removed(seq, 100 + seq))

    engine.handlers[vllm.GET_SERVER_INFO] = server_info
    engine.handlers[vllm.SUBSCRIBE_KV_EVENTS] = subscribe
    sink = RecordingSink()
    subscriber = GrpcKvEventSubscriber("e0", "127.0.0.1", engine.port, [0], sink)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        await wait_until(lambda: len(sink.events.get(0, [])) == 7)
        nursery.cancel_scope.cancel()
    assert starts == [1, 1]  # not resumed at 3: everything the new engine holds
    assert all(isinstance(e, BlockStored | BlockRemoved) for e in sink.events[0])
    assert [e.block_hashes[0] for e in sink.events[0] if isinstance(e, BlockStored | BlockRemoved)] == [
        1,
        2,
        3,
        101,
        102,
        103,
        104,
    ]
    assert sink.clears == [(0, "engine restarted")] and subscriber.counters.restarts == 1
