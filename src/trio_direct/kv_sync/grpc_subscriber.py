"""Follows one engine's KV events over its gRPC API (`SubscribeKvEvents`, vLLM's API) instead of ZMQ.

One server stream per engine carries every DP rank's batches, each under its rank's own sequence
numbers and tagged with the rank. The rules are the ZMQ subscriber's, moved onto the stream:

- The first subscription asks for everything the engine still holds (sequence 1 on), as the ZMQ
  subscriber replays what a publisher buffered before it joined: requests routed while the
  stream was being opened are not missed. An engine that keeps no history (smg-grpc-servicer's
  Python relay refuses any cursor but 0 with OUT_OF_RANGE) is then followed live only, and what
  it cached before is learnt as it stores on top of it.
- A reconnect resumes from the last sequence number applied (`start_sequence_number`, the lowest
  over the ranks; what a rank already has is skipped), so a dropped connection loses nothing while
  the engine still holds the batches since.
- A gap inside one stream is "replayed" the same way: the stream is reopened from the missing
  sequence. An engine that cannot serve a cursor answers OUT_OF_RANGE, and a relay that lost
  history ends the stream with DATA_LOSS: then history is provably lost, every rank is cleared
  and the subscription starts afresh from zero, because routing on a stale index is worse than
  routing on an empty one.
- A restarted engine numbers its batches afresh, so a cursor into the old one means nothing to it
  (worse: the new engine may hold batches with the very numbers the cursor names). Before every
  stream the engine's start time (`GetServerInfo`: now − ``uptime_seconds``) is read; an engine
  that started again since the last stream has every rank cleared and is followed from its first
  batch. A sequence that goes back within a stream is a restarted publisher too: its rank is
  cleared.

`KvStreamState` holds those decisions without I/O; `GrpcKvEventSubscriber` only moves batches.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import trio

from trio_direct._proto.smg import common_pb2 as common
from trio_direct.engine.errors import (
    EngineDeadlineExceeded,
    EngineError,
    EngineInternal,
    EngineInvalidArgument,
    EngineUnavailable,
    EngineUnimplemented,
)
from trio_direct.engine.transport import EngineChannel
from trio_direct.engine.vllm import VllmEngineClient
from trio_direct.kv_sync.subscriber import KvEventCounters, KvEventSink
from trio_direct.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = ["GrpcKvEventSubscriber", "KvStreamState", "convert_batch"]

log = logging.getLogger(__name__)

#: How far two readings of an engine's start time may differ and still be the same engine (seconds).
#: Two readings of one engine differ only by how late each answer was read (milliseconds, hundreds
#: under heavy load); an engine process cannot die and start again in less. At 5 s, an engine
#: restarted within 5 s of its own start passed for the old one, and a cursor into the old engine's
#: numbering was resumed against the new one's.
_SAME_START = 1.0
#: Reconnect backoff after a failed or ended stream: first delay, cap.
_RETRY_FIRST = 0.1
_RETRY_MAX = 5.0
#: Tiers a per-engine prefix index keeps: the device's own cache (unset means device).
_DEVICE_TIERS = frozenset({common.KV_CACHE_TIER_UNSPECIFIED, common.KV_CACHE_TIER_DEVICE})


Decision = Literal["apply", "skip", "gap"]


@dataclass(slots=True)
class KvStreamState:
    """Per-rank sequence state across the subscription's streams (sans-IO).

    ``resume_from`` is where the current stream was opened (0: live only); ``last`` the last
    sequence applied per rank.
    """

    last: dict[int, int] = field(default_factory=dict)
    resume_from: int = 0
    #: The engine refused a cursor while nothing was known: subscribe live (0) until a baseline.
    live_only: bool = False

    def start_sequence(self) -> int:
        """Where the next stream starts: the lowest last-applied sequence; with none known, the
        first sequence (everything the engine holds), or 0 (live) once the engine refused that."""
        if self.last:
            return min(self.last.values())
        return 0 if self.live_only else 1

    def opened(self, start: int) -> None:
        self.resume_from = start

    def observe(self, rank: int, seq: int) -> tuple[Decision | Literal["restart"], int]:
        """Classify one batch: ("apply" | "skip" | "gap" | "restart", the rank's expected seq)."""
        last = self.last.get(rank)
        if last is None:
            return "apply", seq
        if seq == last + 1:
            return "apply", seq
        if seq <= last:
            # On a resumed stream, what it replays from `resume_from` on is already applied.
            if self.resume_from and seq >= self.resume_from:
                return "skip", last + 1
            return "restart", last + 1
        return "gap", last + 1

    def applied(self, rank: int, seq: int) -> None:
        self.last[rank] = seq

    def forget(self, rank: int | None = None) -> None:
        """Drop a rank's baseline (all ranks for None): its next batch sets a new one."""
        if rank is None:
            self.last.clear()
            self.resume_from = 0
            self.live_only = False
        else:
            self.last.pop(rank, None)


def convert_batch(batch: common.KvEventBatch) -> tuple[list[KvEvent], int]:
    """The index's events of one batch, and how many events were malformed and left out.

    Blocks stored off the device (host, disk, external tiers) or reported as remote describe
    another cache than this engine's prefix cache and are not indexed.
    """
    events: list[KvEvent] = []
    dropped = 0
    for event in batch.events:
        kind = event.WhichOneof("data")
        if kind == "stored":
            stored = event.stored
            if stored.tier not in _DEVICE_TIERS or stored.locality == common.KV_CACHE_LOCALITY_REMOTE:
                continue
            blocks = list(stored.blocks)
            size = blocks[0].block_size if blocks else 0
            if size <= 0 or any(b.block_size != size or len(b.token_ids) != size for b in blocks):
                dropped += 1
                continue
            events.append(
                BlockStored(
                    block_hashes=tuple(b.block_hash for b in blocks),
                    parent_block_hash=stored.parent_block_hash if stored.HasField("parent_block_hash") else None,
                    token_ids=tuple(token for b in blocks for token in b.token_ids),
                    block_size=size,
                )
            )
        elif kind == "removed":
            if event.removed.tier in _DEVICE_TIERS and event.removed.locality != common.KV_CACHE_LOCALITY_REMOTE:
                events.append(BlockRemoved(tuple(event.removed.block_hashes)))
        elif kind == "cleared":
            events.append(AllBlocksCleared())
        else:
            dropped += 1
    return events, dropped


class GrpcKvEventSubscriber:
    """The KV-event subscription of one engine over its gRPC API, all its DP ranks.

    ``await nursery.start(subscriber.run)`` returns at once; ``run`` keeps a stream open (and
    reopens it) until cancelled, on a connection of its own, so the long-lived stream neither
    counts as a request on the engine nor holds up draining it. An engine that does not publish KV
    events (UNIMPLEMENTED) is routed by load only, and asked again after `unimplemented_retry`
    seconds.
    """

    def __init__(
        self,
        engine: str,
        host: str,
        port: int,
        dp_ranks: range | list[int],
        sink: KvEventSink,
        *,
        unimplemented_retry: float = 60.0,
    ) -> None:
        self.engine = engine
        self.host = host
        self.port = port
        self.dp_ranks = list(dp_ranks)
        self.sink = sink
        self.counters = KvEventCounters()
        self.state = KvStreamState()
        self.unimplemented_retry = unimplemented_retry
        #: Bumped by `engine_down`: a stream opened before it is stale.
        self._epoch = 0
        #: (rank, expected seq) of the gap the current stream was reopened for.
        self._replaying: tuple[int, int] | None = None
        #: The engine's start time (wall clock) as read before the last stream.
        self._started: float | None = None

    def last_applied(self, dp_rank: int) -> int | None:
        return self.state.last.get(dp_rank)

    def engine_down(self) -> None:
        """The engine is gone: clear every rank; the next stream starts afresh."""
        self._epoch += 1
        self.state.forget()
        for rank in self.dp_ranks:
            self.sink.on_clear(rank, "engine down")
        log.info("engine %s: engine down, KV index cleared", self.engine)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        channel = EngineChannel(self.host, self.port)
        try:
            task_status.started()
            await self._run(VllmEngineClient(channel))
        finally:
            channel.close()

    async def _run(self, client: VllmEngineClient) -> None:
        delay = _RETRY_FIRST
        while True:
            epoch = self._epoch
            start = 0
            try:
                await self._check_same_engine(client)
                start = self.state.start_sequence()
                got_any = await self._follow(client, start, epoch)
            except EngineUnimplemented as error:
                log.info(
                    "engine %s publishes no KV events (%s): routed by load; asking again in %.0fs",
                    self.engine, error.message or error.status, self.unimplemented_retry,
                )  # fmt: skip
                await trio.sleep(self.unimplemented_retry)
                continue
            except (EngineInvalidArgument, EngineInternal) as error:
                # OUT_OF_RANGE (the cursor is no longer held) or DATA_LOSS (the relay lost history).
                if start and not self.state.last:
                    log.info("engine %s keeps no KV event history (%s): following it live", self.engine, error)
                    self.state.live_only = True
                    continue
                if start or self.state.last:
                    self._lose_all(f"{error.status}: {error.message}")
                    self.state.live_only = True
                    delay = _RETRY_FIRST
                    continue
                log.warning("engine %s: KV event stream failed: %s", self.engine, error)
                got_any = False
            except EngineError as error:
                log.debug("engine %s: KV event stream broke: %s", self.engine, error)
                got_any = False
            delay = _RETRY_FIRST if got_any else min(delay * 2, _RETRY_MAX)
            await trio.sleep(delay)

    async def _check_same_engine(self, client: VllmEngineClient) -> None:
        """Clear every rank when the engine started again since the last stream was opened (an
        engine that does not say how long it has been up is taken to be the same)."""
        try:
            info = await client.server_info(timeout=5.0)
        except (EngineUnavailable, EngineDeadlineExceeded):
            raise
        except EngineError:
            return
        uptime = info.get("uptime_seconds")
        if not isinstance(uptime, int | float):
            return
        started = time.time() - uptime
        previous, self._started = self._started, started
        if previous is None or abs(started - previous) <= _SAME_START:
            return
        self.counters.restarts += 1  # counted even when `engine_down` already cleared the ranks
        if self.state.last:
            log.info("engine %s restarted: KV index cleared, following its events afresh", self.engine)
            self.state.forget()
            for rank in self.dp_ranks:
                self.sink.on_clear(rank, "engine restarted")

    async def _follow(self, client: VllmEngineClient, start: int, epoch: int) -> bool:
        """One stream from ``start``, until it ends or shows a gap; whether it delivered anything."""
        self.state.opened(start)
        got_any = False
        async with client.kv_events(start) as stream:
            async for batch in stream:
                got_any = True
                if epoch != self._epoch:
                    return got_any  # engine_down meanwhile: reopen from scratch
                if not self._on_batch(batch):
                    return got_any  # a gap: reopened from the missing sequence
        return got_any

    def _on_batch(self, batch: common.KvEventBatch) -> bool:
        """Apply one batch; False when a gap needs the stream reopened from the missing seq."""
        if batch.load.load_only:
            return True  # a load record repeating the last sequence: no events
        rank = batch.dp_rank if batch.HasField("dp_rank") else (self.dp_ranks[0] if self.dp_ranks else 0)
        seq = batch.sequence_number
        if batch.HasField("snapshot") and batch.snapshot.index == 0:
            # A relay's state snapshot: it starts with a clear of the rank and lists its live blocks.
            self.state.forget(rank)
        decision, expected = self.state.observe(rank, seq)
        if decision == "skip":
            return True
        if decision == "restart":
            self.counters.restarts += 1
            log.info(
                "engine %s rank %d: sequence went back (%d after %d), index cleared",
                self.engine,
                rank,
                seq,
                expected - 1,
            )
            self.sink.on_clear(rank, f"publisher restarted (seq {seq} after {expected - 1})")
            self.state.forget(rank)
        elif decision == "gap":
            self.counters.gaps += 1
            if self._replaying != (rank, expected):
                self._replaying = (rank, expected)
                self.counters.replays += 1
                log.warning(
                    "engine %s rank %d: gap %d→%d, reopening the stream from %d",
                    self.engine,
                    rank,
                    expected,
                    seq,
                    expected,
                )
                return False
            # The reopened stream has the same hole: what it lacks is gone.
            self._replaying = None
            self.counters.lost += 1
            log.warning(
                "engine %s rank %d: gap %d→%d again: history lost, index cleared", self.engine, rank, expected, seq
            )
            self.sink.on_clear(rank, f"gap {expected}→{seq}: history lost")
            self.state.forget(rank)
        if self.state.last.get(rank) is None:
            self.counters.joins += 1
        self.state.applied(rank, seq)
        events, dropped = convert_batch(batch)
        self.counters.batches += 1
        self.counters.dropped_events += dropped
        if events:
            self.counters.events += len(events)
            self.sink.on_events(rank, tuple(events))
        return True

    def _lose_all(self, why: str) -> None:
        self.counters.lost += 1
        log.warning("engine %s: KV history lost (%s): index cleared, subscribing afresh", self.engine, why)
        self.state.forget()
        for rank in self.dp_ranks:
            self.sink.on_clear(rank, f"{why}: history lost")
