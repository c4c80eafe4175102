"""The frontend's KV-event subscription against the mock engine's SGLang publisher, over loopback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import zmq
from support import kv_events_config, wait_until

from trio_direct.fleet.card import KvEventSource
from trio_direct.kv_sync import subscriber as subscriber_module
from trio_direct.kv_sync.subscriber import END_SEQ, KvEventSubscriber
from trio_direct.mock import kv_types as mock
from trio_direct.mock.kv_publisher import (
    KvEventPublisher,
    KvEventPublishers,
    KvEventsConfig,
    bind_kv_publishers,
    encode_batch,
    open_kv_publishers,
)
from trio_direct.routing.kv_events import BlockRemoved, BlockStored, KvEvent
from trio_direct.zmqio import TrioSocket

#: Published until the subscriber has caught up; the sink leaves it out of what it records.
PROBE = BlockRemoved(block_hashes=(-1,))


def _mark(i: int) -> BlockRemoved:
    return BlockRemoved(block_hashes=(1000 + i,))


class RecordingSink:
    def __init__(self) -> None:
        self.events: dict[int, list[KvEvent]] = {}
        self.clears: list[tuple[int, str]] = []

    def on_events(self, dp_rank: int, events: tuple[KvEvent, ...]) -> None:
        self.events.setdefault(dp_rank, []).extend(event for event in events if event != PROBE)

    def on_clear(self, dp_rank: int, reason: str) -> None:
        self.clears.append((dp_rank, reason))


def _sources(publishers: KvEventPublishers) -> list[KvEventSource]:
    return [
        KvEventSource(p.dp_rank, p.bound_endpoint, publishers.config.topic, p.bound_replay_endpoint) for p in publishers
    ]


def _mock(event: KvEvent) -> mock.KvEvent:
    """The same event as the mock engine's type, to publish it."""
    if isinstance(event, BlockStored):
        return mock.BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size)
    if isinstance(event, BlockRemoved):
        return mock.BlockRemoved(event.block_hashes)
    return mock.AllBlocksCleared()


class RawPublisher:
    """A bare PUB (and optional replay ROUTER) for what the mock publisher never sends."""

    def __init__(self, ctx: zmq.Context, replay: str | None = None) -> None:
        self.dp_rank = 0
        self.next_seq = 0
        self.pub = TrioSocket(ctx, zmq.PUB)
        self.endpoint = self.pub.bind("tcp://127.0.0.1:0")
        self.router = TrioSocket(ctx, zmq.ROUTER) if replay else None
        self.replay_mode = replay
        self.history: list[bytes] = []
        self.release = trio.Event()
        self.release.set()
        self.requests = 0
        self.replay_endpoint = self.router.bind("tcp://127.0.0.1:0") if self.router else None

    def source(self) -> KvEventSource:
        return KvEventSource(0, self.endpoint, "kv", self.replay_endpoint)

    def send(self, *frames: bytes) -> None:
        self.pub.send_multipart_nowait(frames)

    def publish(self, events: list[KvEvent], payload: bytes | None = None, *, drop: bool = False) -> None:
        if payload is None:
            payload = encode_batch(1.0, [_mock(e) for e in events], 0, "map")
        self.history.append(payload)
        if not drop:
            self.send(b"kv", self.next_seq.to_bytes(8, "big"), payload)
        self.next_seq += 1

    async def serve_replay(self) -> None:
        """``"end"``: answer every request with an immediate end marker; ``"silent"``: never
        answer; ``"history"``: once ``release`` is set, everything published from the start seq.
        """
        assert self.router is not None
        while True:
            identity, _, start = await self.router.recv_multipart()
            self.requests += 1
            if self.replay_mode == "history":
                await self.release.wait()
                for seq in range(int.from_bytes(start, "big"), self.next_seq):
                    frames = [identity, b"", b"kv", seq.to_bytes(8, "big"), self.history[seq]]
                    await self.router.send_multipart(frames)
            if self.replay_mode != "silent":
                await self.router.send_multipart([identity, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self.pub.close()
        if self.router is not None:
            self.router.close()


Publisher = KvEventPublisher | RawPublisher


def _caught_up(publisher: Publisher, subscriber: KvEventSubscriber) -> bool:
    return subscriber.last_applied(publisher.dp_rank) == publisher.next_seq - 1


async def _join(publisher: Publisher, subscriber: KvEventSubscriber) -> None:
    """Publish probes until the subscriber applies everything published (a SUB joins late)."""
    with trio.fail_after(10):
        while not _caught_up(publisher, subscriber):
            publisher.publish([_mock(PROBE)] if isinstance(publisher, KvEventPublisher) else [PROBE])
            with trio.move_on_after(0.05):
                while not _caught_up(publisher, subscriber):
                    await trio.sleep(0.002)


@asynccontextmanager
async def _subscribed(
    ctx: zmq.Context, sources: list[KvEventSource], **options: Any
) -> AsyncIterator[tuple[KvEventSubscriber, RecordingSink]]:
    sink = RecordingSink()
    subscriber = KvEventSubscriber("e1", sources, sink, ctx=ctx, **options)
    async with trio.open_nursery() as nursery:
        await nursery.start(subscriber.run)
        yield subscriber, sink
        nursery.cancel_scope.cancel()


# -- live events -----------------------------------------------------------------------


async def test_events_arrive_per_rank(ctx: zmq.Context) -> None:
    stored = BlockStored(block_hashes=(11, 12), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=2)
    async with (
        open_kv_publishers(kv_events_config(), 2, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        for publisher in publishers:
            await _join(publisher, subscriber)
        publishers[0].publish([_mock(stored)])
        publishers[1].publish([_mock(_mark(1)), _mock(_mark(2))])
        await wait_until(lambda: all(_caught_up(p, subscriber) for p in publishers))

    assert sink.events == {0: [stored], 1: [_mark(1), _mark(2)]}
    assert sink.clears == []
    assert subscriber.counters.bad_batches == subscriber.counters.lost == 0


@pytest.mark.parametrize("fmt", ["map", "array"], ids=["0.5.23 4-frame replay", "0.5.19 3-frame replay"])
async def test_a_gap_is_filled_from_the_replay_endpoint(
    ctx: zmq.Context, fmt: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        open_kv_publishers(kv_events_config(fmt), 1, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        publisher = publishers[0]
        await _join(publisher, subscriber)
        gaps, replays = subscriber.counters.gaps, subscriber.counters.replays
        expected = publisher.next_seq
        publisher.drop_next(3)
        for i in range(4):
            publisher.publish([_mock(_mark(i))])
        with caplog.at_level(logging.INFO, logger="trio_direct.kv_sync.subscriber"):
            await wait_until(lambda: _caught_up(publisher, subscriber))

    assert sink.events[0] == [_mark(0), _mark(1), _mark(2), _mark(3)]
    assert sink.clears == []
    assert subscriber.counters.gaps == gaps + 1
    assert subscriber.counters.replays == replays + 1
    assert subscriber.counters.lost == 0
    assert f"engine e1 rank 0: gap {expected}→{expected + 3}, replayed 4 batches" in caplog.messages


async def test_history_published_before_subscribing_is_replayed(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        for i in range(5):
            publisher.publish([_mock(_mark(i))])
        async with _subscribed(ctx, _sources(publishers)) as (subscriber, sink):
            await _join(publisher, subscriber)

    assert sink.events[0] == [_mark(i) for i in range(5)]
    assert sink.clears == []
    assert subscriber.counters.lost == 0


async def test_a_gap_older_than_the_replay_buffer_clears_the_rank(ctx: zmq.Context) -> None:
    async with (
        open_kv_publishers(kv_events_config(buffer_steps=2), 1, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        publisher = publishers[0]
        await _join(publisher, subscriber)
        sink.clears.clear()
        lost = subscriber.counters.lost
        publisher.drop_next(5)
        for i in range(6):
            publisher.publish([_mock(_mark(i))])
        await wait_until(lambda: _caught_up(publisher, subscriber))

    # The buffer still held the last dropped batch and the live one: those are applied.
    assert sink.events[0] == [_mark(4), _mark(5)]
    assert len(sink.clears) == 1
    rank, reason = sink.clears[0]
    assert rank == 0 and "history lost" in reason and "replay starts at" in reason
    assert subscriber.counters.lost == lost + 1


async def test_a_gap_without_replay_endpoint_clears_and_counts_lost(ctx: zmq.Context) -> None:
    async with (
        open_kv_publishers(kv_events_config(replay=False), 1, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        publisher = publishers[0]
        await _join(publisher, subscriber)
        sink.clears.clear()
        lost, gaps, replays = subscriber.counters.lost, subscriber.counters.gaps, subscriber.counters.replays
        publisher.drop_next(3)
        for i in range(4):
            publisher.publish([_mock(_mark(i))])
        await wait_until(lambda: _caught_up(publisher, subscriber))

    assert sink.events[0] == [_mark(3)]
    assert len(sink.clears) == 1
    assert sink.clears[0][0] == 0 and "no replay endpoint: history lost" in sink.clears[0][1]
    assert subscriber.counters.lost == lost + 1
    assert subscriber.counters.gaps == gaps + 1
    assert subscriber.counters.replays == replays


@pytest.mark.parametrize("mode", ["end", "silent"], ids=["immediate end marker", "no answer"])
async def test_a_replay_that_brings_nothing_clears_the_rank(ctx: zmq.Context, mode: str) -> None:
    publisher = RawPublisher(ctx, replay=mode)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.serve_replay)
            async with _subscribed(ctx, [publisher.source()], replay_timeout=0.2) as (subscriber, sink):
                await _join(publisher, subscriber)
                if mode == "silent":  # the join's replay failed too: the next one waits a second
                    await trio.sleep(1.1)
                sink.clears.clear()
                lost, replays = subscriber.counters.lost, subscriber.counters.replays
                publisher.next_seq += 2  # two batches the SUB never sees
                publisher.publish([_mark(0)])
                await wait_until(lambda: _caught_up(publisher, subscriber))
            nursery.cancel_scope.cancel()
    finally:
        publisher.close()

    assert sink.events[0] == [_mark(0)]
    assert len(sink.clears) == 1 and "history lost" in sink.clears[0][1]
    assert subscriber.counters.lost == lost + 1
    assert subscriber.counters.replays == replays + 1


@pytest.mark.parametrize("live_buffer", [1, 4096])
async def test_live_batches_arriving_during_a_replay_apply_after_it_in_order(
    ctx: zmq.Context, live_buffer: int
) -> None:
    publisher = RawPublisher(ctx, replay="history")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.serve_replay)
            async with _subscribed(ctx, [publisher.source()], live_buffer=live_buffer) as (subscriber, sink):
                await _join(publisher, subscriber)
                requests = publisher.requests
                publisher.release = trio.Event()
                publisher.publish([_mark(0)], drop=True)
                publisher.publish([_mark(1)], drop=True)
                publisher.publish([_mark(2)])  # reveals the gap; the replay now waits
                await wait_until(lambda: publisher.requests > requests)
                for i in range(3, 8):
                    publisher.publish([_mark(i)])
                await trio.sleep(0.02)  # let them reach the subscriber while it waits
                publisher.release.set()
                for i in range(8, 10):
                    publisher.publish([_mark(i)])
                await wait_until(lambda: _caught_up(publisher, subscriber))
            nursery.cancel_scope.cancel()
    finally:
        publisher.close()

    assert sink.events[0] == [_mark(i) for i in range(10)]
    assert sink.clears == []
    assert subscriber.counters.lost == 0


# -- restarts and engine loss ----------------------------------------------------------------


async def _rebind(config: KvEventsConfig, ctx: zmq.Context) -> KvEventPublishers:
    """Bind the same ports again; the old sockets may need a moment to let go of them."""
    with trio.fail_after(5):
        while True:
            try:
                return bind_kv_publishers(config, 1, ctx)
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise
            await trio.sleep(0.01)


@asynccontextmanager
async def _serving(publishers: KvEventPublishers) -> AsyncIterator[KvEventPublisher]:
    """Serve rank 0's replay endpoint for the block, then close every socket (engine stops)."""
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publishers[0].serve_replay)
            yield publishers[0]
            nursery.cancel_scope.cancel()
    finally:
        publishers.close()


async def test_a_restarted_publisher_clears_the_rank(ctx: zmq.Context) -> None:
    first = bind_kv_publishers(kv_events_config(), 1, ctx)
    async with _subscribed(ctx, _sources(first)) as (subscriber, sink):
        async with _serving(first) as publisher:
            await _join(publisher, subscriber)
            for i in range(200):  # far enough that the new publisher's probes stay below
                publisher.publish([_mock(_mark(i))])
            await wait_until(lambda: _caught_up(publisher, subscriber))
        assert sink.clears == []

        async with _serving(await _rebind(first.config, ctx)) as publisher:
            await _join(publisher, subscriber)
            publisher.publish([_mock(_mark(999))])
            await wait_until(lambda: _caught_up(publisher, subscriber))

    assert subscriber.counters.restarts == 1
    assert [rank for rank, reason in sink.clears if "publisher restarted" in reason] == [0]
    assert sink.events[0][-1] == _mark(999)
    # Whatever the SUB missed of the new publisher while reconnecting came back through replay.
    assert subscriber.counters.lost == 0


async def test_engine_down_clears_every_rank_and_resyncs(ctx: zmq.Context) -> None:
    async with (
        open_kv_publishers(kv_events_config(), 2, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        for publisher in publishers:
            await _join(publisher, subscriber)
        subscriber.engine_down()
        assert sink.clears == [(0, "engine down"), (1, "engine down")]
        assert subscriber.last_applied(0) is None

        # The engine was up after all: its next batch is a gap from 0, which replay fills.
        publishers[0].publish([_mock(_mark(1))])
        await wait_until(lambda: _caught_up(publishers[0], subscriber))

    assert sink.clears == [(0, "engine down"), (1, "engine down")]
    assert sink.events[0][-1] == _mark(1)


# -- first batches -----------------------------------------------------------------------------


@pytest.mark.parametrize("replay", [True, False])
async def test_a_publisher_numbering_from_1_or_joined_late_clears_nothing(ctx: zmq.Context, replay: bool) -> None:
    """SGLang's first batch is seq 1; a subscriber that joins later sees a higher one first."""
    publisher = RawPublisher(ctx, replay="history" if replay else None)
    publisher.publish([_mark(0)], drop=True)  # seq 0: never published by SGLang, here never seen
    publisher.publish([_mark(1)], drop=True)  # published before this subscriber joined
    try:
        async with trio.open_nursery() as nursery:
            if replay:
                nursery.start_soon(publisher.serve_replay)
            async with _subscribed(ctx, [publisher.source()]) as (subscriber, sink):
                await _join(publisher, subscriber)
            nursery.cancel_scope.cancel()
    finally:
        publisher.close()

    assert sink.clears == []
    assert subscriber.counters.lost == subscriber.counters.gaps == 0
    assert subscriber.counters.joins == 1
    # With a replay endpoint, what the engine stored before the subscription is learnt too.
    assert (sink.events[0][:2] == [_mark(0), _mark(1)]) == replay


async def test_a_publisher_jumping_its_seqs_counts_one_gap_and_one_restart(ctx: zmq.Context) -> None:
    """A broken or hostile publisher cannot inflate the counters by its seq arithmetic."""
    publisher = RawPublisher(ctx)
    try:
        async with _subscribed(ctx, [publisher.source()]) as (subscriber, sink):
            await _join(publisher, subscriber)
            sink.clears.clear()
            before = subscriber.counters.as_dict()
            publisher.next_seq = 2**64 - 3  # a jump of ~1.8e19
            publisher.publish([_mark(1)])
            await wait_until(lambda: _caught_up(publisher, subscriber))
            publisher.next_seq = 7  # and back again
            publisher.publish([_mark(2)])
            await wait_until(lambda: _caught_up(publisher, subscriber))
    finally:
        publisher.close()

    after = subscriber.counters.as_dict()
    assert after["gaps"] - before["gaps"] == 1
    assert after["lost"] - before["lost"] == 1  # no replay endpoint: that one gap lost history
    assert after["restarts"] - before["restarts"] == 1
    assert sink.events[0][-2:] == [_mark(1), _mark(2)]
    assert sink.clears and sink.clears[0][1].endswith("history lost")
    assert max(after[kind] for kind in ("joins", "gaps", "replays", "lost", "restarts")) < 10


# -- bad input and load ----------------------------------------------------------------------


async def test_malformed_messages_are_counted_and_later_batches_still_apply(ctx: zmq.Context) -> None:
    publisher = RawPublisher(ctx)
    try:
        async with _subscribed(ctx, [publisher.source()]) as (subscriber, sink):
            await _join(publisher, subscriber)
            sink.clears.clear()
            counters = subscriber.counters.as_dict()
            publisher.publish([], payload=b"\xc1 not msgpack")
            publisher.send(b"kv", b"only two frames")
            publisher.send(b"kv", b"\x00\x01", b"seq frame too short")
            publisher.send(b"kvx", (10**6).to_bytes(8, "big"), b"another topic: ignored")
            publisher.publish([_mark(1)])
            await wait_until(lambda: _caught_up(publisher, subscriber))
    finally:
        publisher.close()

    assert sink.events[0] == [_mark(1)]
    assert sink.clears == []
    after = subscriber.counters.as_dict()
    assert after["bad_batches"] == counters["bad_batches"] + 3
    assert after["gaps"] == counters["gaps"]
    assert after["batches"] == counters["batches"] + 1


async def test_bad_events_are_dropped_from_a_good_batch(ctx: zmq.Context) -> None:
    publisher = RawPublisher(ctx)
    bad_store = mock.BlockStored((1, 2), None, (1, 2, 3), 2)  # 3 tokens for 2 blocks of 2
    try:
        async with _subscribed(ctx, [publisher.source()]) as (subscriber, sink):
            await _join(publisher, subscriber)
            dropped = subscriber.counters.dropped_events
            publisher.publish([], payload=encode_batch(1.0, [bad_store, _mock(_mark(1))], 0, "array"))
            await wait_until(lambda: _caught_up(publisher, subscriber))
    finally:
        publisher.close()

    assert sink.events[0] == [_mark(1)]
    assert subscriber.counters.dropped_events == dropped + 1


async def test_a_flood_arrives_without_gaps_and_without_starving_other_tasks(ctx: zmq.Context) -> None:
    flood = 50_000
    async with (
        open_kv_publishers(kv_events_config(replay=False), 1, ctx) as publishers,
        _subscribed(ctx, _sources(publishers)) as (subscriber, sink),
    ):
        publisher = publishers[0]
        await _join(publisher, subscriber)
        start = subscriber.counters.as_dict()
        # All at once, without yielding: the whole flood queues up in the SUB (RCVHWM).
        for i in range(flood):
            publisher.publish([_mock(_mark(i))])
        seen_by_ticker: list[int] = []

        async def ticker() -> None:
            while True:
                seen_by_ticker.append(subscriber.counters.batches)
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            await wait_until(lambda: _caught_up(publisher, subscriber), timeout=60)
            nursery.cancel_scope.cancel()

    end = subscriber.counters.as_dict()
    assert end["batches"] - start["batches"] == flood
    assert (end["gaps"], end["lost"], end["bad_batches"]) == (start["gaps"], start["lost"], 0)
    assert sink.events[0][-1] == _mark(flood - 1)
    # The ticker ran while the flood was still being worked through.
    assert any(start["batches"] < n < start["batches"] + flood for n in seen_by_ticker)


async def test_an_unreachable_endpoint_just_waits_and_closes_cleanly(ctx: zmq.Context) -> None:
    with TrioSocket(ctx, zmq.PUB) as probe:
        endpoint = probe.bind("tcp://127.0.0.1:0")  # a port that nobody listens on after this
    sources = [KvEventSource(0, endpoint, "", endpoint)]
    async with _subscribed(ctx, sources) as (subscriber, sink):
        await trio.sleep(0.05)
    assert sink.events == {} and sink.clears == []
    assert subscriber.counters.as_dict() == dict.fromkeys(subscriber.counters.as_dict(), 0)


def test_duplicate_ranks_are_refused() -> None:
    source = KvEventSource(0, "tcp://127.0.0.1:1")
    with pytest.raises(ValueError, match="duplicate"):
        KvEventSubscriber("e1", [source, source], RecordingSink())


# -- floods: junk, engines not serving, oversized frames, failing replays ---------------------------


async def test_a_flood_of_bad_batches_logs_one_line_per_interval_with_its_count(ctx: zmq.Context, caplog) -> None:
    publisher = RawPublisher(ctx)
    try:
        async with _subscribed(ctx, [publisher.source()], warning_interval=0.5) as (subscriber, sink):
            await _join(publisher, subscriber)
            caplog.clear()
            bad = subscriber.counters.bad_batches
            for _ in range(500):  # (under the PUB's send HWM: none is dropped on the way)
                publisher.publish([], payload=b"\xc1 not msgpack")
            await wait_until(lambda: subscriber.counters.bad_batches == bad + 500, timeout=20)
            await trio.sleep(0.6)
            publisher.publish([], payload=b"\xc1 one more")
            publisher.publish([_mark(1)])
            await wait_until(lambda: _caught_up(publisher, subscriber))
    finally:
        publisher.close()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert 2 <= len(lines) <= 4, lines  # the first at once, then one per interval for the rest
    assert any("more like it in the last 0.5s" in line for line in lines), lines
    assert sink.events[0] == [_mark(1)]


async def test_batches_that_arrive_while_the_engine_is_not_serving_are_dropped(ctx: zmq.Context) -> None:
    serving = [True]
    publisher = RawPublisher(ctx)
    try:
        async with _subscribed(ctx, [publisher.source()], serving=lambda: serving[0]) as (subscriber, sink):
            await _join(publisher, subscriber)
            serving[0] = False
            subscriber.engine_down()
            for i in range(100):
                publisher.publish([_mark(i)])
            await wait_until(lambda: subscriber.counters.ignored == 100)
            assert sink.events.get(0, []) == []
            serving[0] = True  # back: its batches are indexed again
            publisher.publish([_mark(100)])
            await wait_until(lambda: _caught_up(publisher, subscriber))
    finally:
        publisher.close()
    assert sink.events[0] == [_mark(100)]


async def test_an_oversized_frame_is_refused_and_later_batches_still_arrive(ctx: zmq.Context) -> None:
    publisher = RawPublisher(ctx, replay="history")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.serve_replay)
            async with _subscribed(ctx, [publisher.source()]) as (subscriber, sink):
                await _join(publisher, subscriber)
                batches = subscriber.counters.batches
                publisher.send(b"kv", (10**9).to_bytes(8, "big"), b"x" * (subscriber_module.MAX_MESSAGE_BYTES + 1))
                publisher.publish([PROBE])
                await _join(publisher, subscriber)  # the SUB reconnects; what it missed is replayed
                assert subscriber.counters.batches > batches
                assert subscriber.counters.restarts == 0 and subscriber.counters.bad_batches == 0
            nursery.cancel_scope.cancel()
    finally:
        publisher.close()


async def test_after_a_failed_replay_gaps_are_handled_at_once_until_the_backoff_ends(ctx: zmq.Context) -> None:
    publisher = RawPublisher(ctx, replay="silent")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher.serve_replay)
            async with _subscribed(ctx, [publisher.source()], replay_timeout=0.3) as (subscriber, sink):
                await _join(publisher, subscriber)
                publisher.next_seq += 1
                publisher.publish([PROBE])  # a gap whose replay finds no answer: the next waits a second
                await wait_until(lambda: _caught_up(publisher, subscriber))
                replays = subscriber.counters.replays
                started = trio.current_time()
                for i in range(5):
                    publisher.next_seq += 1  # a batch the SUB never sees: a gap each time
                    publisher.publish([_mark(i)])
                    await wait_until(lambda: _caught_up(publisher, subscriber))
                assert trio.current_time() - started < 0.3  # no replay timeout was waited for
                assert subscriber.counters.replays == replays and subscriber.counters.lost >= 5
            nursery.cancel_scope.cancel()
    finally:
        publisher.close()
    assert sink.events[0][-5:] == [_mark(i) for i in range(5)]
