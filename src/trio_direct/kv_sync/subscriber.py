"""Subscribes to one SGLang engine's ZMQ KV-event publishers and keeps its index honest.

One SUB socket per DP rank receives ``[topic, seq (8-byte big-endian), msgpack batch]``.
Every batch goes through the rank's ``SequenceTracker``. The first batch from a publisher sets
the baseline: with a replay endpoint, what the publisher still buffers before it is fetched
first (the engine's cache as it was before this frontend subscribed); without one, nothing is
cleared for batches this socket never saw. A later gap is filled from the engine's replay
ROUTER when it has one, and whenever history is provably lost -- no replay endpoint, replay
too short or failed, publisher restarted, engine down -- the sink is told to clear that rank,
because routing on a stale index is worse than routing on an empty one. Decoding and sequence
rules live in ``kv_events``; this module only moves frames and applies the decisions.

Counters count incidents, not sequence arithmetic: a publisher that jumps from seq 5 to 2**63
caused one gap (and, if history was lost, one loss), one that steps back one restart.

A feed can be flooded (a stray or hostile publisher bound on a dead engine's port), so: batches
that arrive while the engine is not serving (`serving`) are counted and dropped, never indexed;
warnings are rate-limited per engine and kind (one line per `WARNING_INTERVAL`, with the count of
those it stands for); a frame over `MAX_MESSAGE_BYTES` is refused by ZMQ and at most `RCVHWM`
messages queue in a SUB; a replay holds live batches for at most `DEFAULT_REPLAY_TIMEOUT`, and
after a failed one the next is tried only after a backoff (1 s doubling to `MAX_REPLAY_BACKOFF`),
gaps meanwhile clearing the rank as without a replay endpoint.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import Protocol

import trio
import zmq

from trio_direct.fleet.card import KvEventSource
from trio_direct.routing.kv_events import (
    Apply,
    BadBatch,
    Gap,
    Join,
    KvEvent,
    Restart,
    SequenceTracker,
    Skip,
    decode_batch,
)
from trio_direct.zmqio import TrioSocket

__all__ = [
    "DEFAULT_LIVE_BUFFER",
    "DEFAULT_REPLAY_TIMEOUT",
    "END_SEQ",
    "MAX_MESSAGE_BYTES",
    "MAX_REPLAY_BACKOFF",
    "RCVHWM",
    "WARNING_INTERVAL",
    "KvEventCounters",
    "KvEventSink",
    "KvEventSubscriber",
]

log = logging.getLogger(__name__)

#: A SUB drops silently at its receive HWM; the default 1000 lost ~4 % of a flood. A bound all the
#: same: a flood of junk cannot queue without end.
RCVHWM = 100_000
#: Largest KV-event frame accepted (ZMQ drops the peer that sends a larger one). A batch of a
#: chunked prefill at page size 1 stays well under a megabyte.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Seq frame of the replay end marker (-1).
END_SEQ = b"\xff" * 8
#: Longest a whole replay may take (live batches wait meanwhile) before the rank is cleared instead.
DEFAULT_REPLAY_TIMEOUT = 1.0
#: Longest wait after failed replays before the next is tried.
MAX_REPLAY_BACKOFF = 30.0
#: One warning line per engine and kind in this many seconds, with the count it stands for.
WARNING_INTERVAL = 10.0
#: Live batches held while a replay runs (Dynamo's bootstrap uses 4096); beyond it they
#: wait in the socket's own queue.
DEFAULT_LIVE_BUFFER = 4096
#: Frames handled between checkpoints when working through held live batches.
_CHUNK = 256


class KvEventSink(Protocol):
    """Where decoded events go: the routing index, keyed by this engine's DP rank."""

    def on_events(self, dp_rank: int, events: tuple[KvEvent, ...]) -> None: ...

    def on_clear(self, dp_rank: int, reason: str) -> None: ...


def _monitor_event(frames: list[bytes]) -> int:
    """The event number of a ZMQ socket-monitor message (its first frame: a little-endian uint16
    event, then a uint32 value). Parsed here rather than with `zmq.utils.monitor`, which imports
    `zmq.asyncio` and with it asyncio into a frontend that runs on trio alone."""
    return int.from_bytes(frames[0][:2], "little") if frames and len(frames[0]) >= 2 else 0


@dataclass(slots=True)
class KvEventCounters:
    """What happened on this engine's sockets, summed over its ranks.

    ``batches``/``events``: applied to the sink. ``dropped_events``: malformed events left out
    of otherwise good batches. ``bad_batches``: undecodable payloads or malformed frames.
    ``joins``: first batches from a publisher (at start-up, after a restart or an engine down).
    ``gaps``: sequence gaps seen after the first batch, each counted once however many seqs it
    skipped. ``replays``: replay requests. ``lost``: gaps (or holes in a replay) whose batches
    could not be had, each once: the rank was cleared. ``restarts``: publisher restarts.
    ``ignored``: batches that arrived while the engine was not serving.
    """

    batches: int = 0
    events: int = 0
    dropped_events: int = 0
    bad_batches: int = 0
    joins: int = 0
    gaps: int = 0
    replays: int = 0
    lost: int = 0
    restarts: int = 0
    #: Batches received while the engine was not serving: dropped, not indexed.
    ignored: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class _Rank:
    """One DP rank's socket and sequence state."""

    source: KvEventSource
    sub: TrioSocket
    topic: bytes
    tracker: SequenceTracker = field(default_factory=SequenceTracker)
    #: Live frames received but not yet handled (held during a replay).
    pending: deque[list[bytes]] = field(default_factory=deque)
    #: Bumped by ``engine_down`` so an in-flight replay knows its result is stale.
    epoch: int = 0
    rank_mismatch_logged: bool = False
    #: No replay is asked before this (trio time): the last one failed.
    replay_after: float = -math.inf
    #: The wait after the next failed replay.
    replay_backoff: float = 1.0
    #: Where the SUB reports its disconnections.
    monitor: TrioSocket | None = None


class _Warnings:
    """Warnings of one engine's feed, at most one line per kind and interval, with counts."""

    def __init__(self, engine: str, interval: float) -> None:
        self.engine = engine
        self.interval = interval
        self._reported_at: dict[str, float] = {}
        self._unreported: dict[str, int] = {}

    def log(self, level: int, kind: str, message: str, *args: object) -> None:
        now = trio.current_time()
        count = self._unreported.get(kind, 0) + 1
        if now - self._reported_at.get(kind, -math.inf) < self.interval:
            self._unreported[kind] = count
            return
        self._unreported[kind] = 0
        self._reported_at[kind] = now
        more = f" ({count - 1} more like it in the last {self.interval:g}s)" if count > 1 else ""
        log.log(level, "engine %s " + message + "%s", self.engine, *args, more)


class _ReplayFailed(Exception):
    pass


class KvEventSubscriber:
    """The KV-event subscription of one engine, all its DP ranks.

    ``await nursery.start(subscriber.run)`` returns once every SUB is connecting; ``run``
    returns only when cancelled, and closes its sockets on the way out. An endpoint nobody
    listens on is fine: ZMQ keeps reconnecting by itself.
    """

    def __init__(
        self,
        engine: str,
        sources: Sequence[KvEventSource],
        sink: KvEventSink,
        *,
        ctx: zmq.Context | None = None,
        replay_timeout: float = DEFAULT_REPLAY_TIMEOUT,
        live_buffer: int = DEFAULT_LIVE_BUFFER,
        serving: Callable[[], bool] | None = None,
        warning_interval: float = WARNING_INTERVAL,
    ) -> None:
        if live_buffer < 1:
            raise ValueError("live_buffer must be at least 1")
        ranks = [source.dp_rank for source in sources]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"duplicate DP ranks in KV event sources: {ranks}")
        self.engine = engine
        self.sources = tuple(sources)
        self.sink = sink
        self.counters = KvEventCounters()
        self.replay_timeout = replay_timeout
        self.live_buffer = live_buffer
        self._ctx = ctx if ctx is not None else zmq.Context.instance()
        self._ranks: dict[int, _Rank] = {}
        #: Whether the engine is serving now (None: always): batches from one that is not are dropped.
        self._serving = serving
        self._warnings = _Warnings(engine, warning_interval)

    def last_applied(self, dp_rank: int) -> int | None:
        """Seq of the last batch applied for ``dp_rank`` (``None`` before the first)."""
        rank = self._ranks.get(dp_rank)
        return None if rank is None else rank.tracker.last_applied

    def engine_down(self) -> None:
        """The engine is gone: clear every rank and start each sequence afresh.

        A restarted engine numbers from 0 again, which a fresh tracker simply applies; if the
        engine was in fact still up, its next batch shows as a gap from 0 and gets replayed.
        """
        for source in self.sources:
            rank = self._ranks.get(source.dp_rank)
            if rank is not None:
                rank.tracker.reset()
                rank.epoch += 1
            log.info("engine %s rank %d: engine down, index cleared", self.engine, source.dp_rank)
            self.sink.on_clear(source.dp_rank, "engine down")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Receive and apply events on every rank until cancelled."""
        try:
            for source in self.sources:
                sub, monitor = self._open_sub(source)
                self._ranks[source.dp_rank] = _Rank(source, sub, source.topic.encode(), monitor=monitor)
            async with trio.open_nursery() as nursery:
                for rank in self._ranks.values():
                    nursery.start_soon(self._run_rank, rank)
                task_status.started()
        finally:
            for rank in self._ranks.values():
                self._close_sub(rank)
            self._ranks.clear()

    def _open_sub(self, source: KvEventSource) -> tuple[TrioSocket, TrioSocket]:
        """A SUB connecting to `source`, and the PAIR its disconnections are reported on."""
        sub = TrioSocket(self._ctx, zmq.SUB, rcvhwm=RCVHWM)
        sub.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        address = f"inproc://kv-events-monitor-{id(sub)}"
        sub.socket.monitor(address, zmq.EVENT_DISCONNECTED)
        monitor = TrioSocket(self._ctx, zmq.PAIR)
        monitor.connect(address)
        sub.subscribe(source.topic.encode())
        sub.connect(source.endpoint)
        return sub, monitor

    @staticmethod
    def _close_sub(rank: _Rank) -> None:
        if not rank.sub.closed:
            rank.sub.socket.disable_monitor()
        rank.sub.close()
        if rank.monitor is not None:
            rank.monitor.close()

    async def _run_rank(self, rank: _Rank) -> None:
        """Receive on the rank's SUB; after each disconnection, on a fresh one. ZMQ reconnects a
        SUB by itself after a lost connection, but never after one it dropped for a protocol error
        (a frame over `MAX_MESSAGE_BYTES`): one junk frame would end the feed for good."""
        while True:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive, rank)
                await self._disconnected(rank)
                nursery.cancel_scope.cancel()
            with suppress(trio.ClosedResourceError, zmq.ZMQError):
                while True:  # what already arrived is kept
                    rank.pending.append(rank.sub.socket.recv_multipart(zmq.NOBLOCK))
            self._close_sub(rank)
            rank.sub, rank.monitor = self._open_sub(rank.source)

    @staticmethod
    async def _disconnected(rank: _Rank) -> None:
        assert rank.monitor is not None
        while True:
            frames = await rank.monitor.recv_multipart()
            if _monitor_event(frames) == zmq.EVENT_DISCONNECTED:
                return

    async def _receive(self, rank: _Rank) -> None:
        while True:
            if rank.pending:
                # Held frames from a replay: work through them, but stay fair.
                await trio.lowlevel.checkpoint()
            else:
                rank.pending.extend(await rank.sub.recv_batch())
            for _ in range(min(len(rank.pending), _CHUNK)):
                await self._on_live(rank, rank.pending.popleft())

    async def _on_live(self, rank: _Rank, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._bad_frames(rank, f"{len(frames)} frames")
            return
        topic, seq_frame, payload = frames
        if topic != rank.topic:
            return  # the SUB filter is a prefix match; another topic's batch is not ours
        if self._serving is not None and not self._serving():
            self.counters.ignored += 1
            self._warnings.log(
                logging.WARNING, "ignored", "rank %d: KV events while the engine is not serving: dropped",
                rank.source.dp_rank,
            )  # fmt: skip
            return
        seq = int.from_bytes(seq_frame, "big")
        action = rank.tracker.observe(seq)
        if isinstance(action, Restart):
            self.counters.restarts += 1
            self._warnings.log(
                logging.INFO, "restart", "rank %d: publisher restarted (seq %d after %d), index cleared",
                rank.source.dp_rank, action.got, action.last,
            )  # fmt: skip
            reason = f"publisher restarted (seq {action.got} after {action.last})"
            self.sink.on_clear(rank.source.dp_rank, reason)
            action = rank.tracker.observe(seq)
        if isinstance(action, Apply):
            self._apply(rank, seq, payload)
        elif isinstance(action, Join):
            await self._join(rank, seq, payload)
        elif isinstance(action, Gap):
            await self._recover(rank, action, payload)

    def _apply(self, rank: _Rank, seq: int, payload: bytes) -> None:
        """Hand one in-sequence batch to the sink; a bad payload still uses up its seq."""
        try:
            batch = decode_batch(payload)
        except BadBatch as exc:
            self.counters.bad_batches += 1
            self._warnings.log(
                logging.WARNING, "bad", "rank %d: skipped bad batch %d: %s", rank.source.dp_rank, seq, exc
            )
            return
        self.counters.batches += 1
        self.counters.dropped_events += batch.dropped_events
        if batch.dropped_events:
            self._warnings.log(
                logging.WARNING, "dropped", "rank %d: dropped %d malformed events of batch %d",
                rank.source.dp_rank, batch.dropped_events, seq,
            )  # fmt: skip
        mismatch = batch.dp_rank is not None and batch.dp_rank != rank.source.dp_rank
        if mismatch and not rank.rank_mismatch_logged:
            rank.rank_mismatch_logged = True
            log.warning(
                "engine %s rank %d: batches say dp_rank %d; indexing them under the endpoint's rank %d",
                self.engine,
                rank.source.dp_rank,
                batch.dp_rank,
                rank.source.dp_rank,
            )
        if batch.events:
            self.counters.events += len(batch.events)
            self.sink.on_events(rank.source.dp_rank, batch.events)

    def _bad_frames(self, rank: _Rank, what: str) -> None:
        self.counters.bad_batches += 1
        self._warnings.log(logging.WARNING, "bad", "rank %d: skipped malformed message (%s)", rank.source.dp_rank, what)

    # -- joins and gaps ----------------------------------------------------------------------

    async def _join(self, rank: _Rank, seq: int, payload: bytes) -> None:
        """The first batch from a publisher, numbered ``seq`` > 0: take what replay still has
        from before it (if there is a replay endpoint), then apply it."""
        self.counters.joins += 1
        dp_rank = rank.source.dp_rank
        if not self._may_replay(rank):
            self._warnings.log(
                logging.INFO, "join", "rank %d: first batch is seq %d, %s: what the engine cached before is learnt "
                "as it stores on top of it", dp_rank, seq, self._no_replay_reason(rank),
            )  # fmt: skip
            rank.tracker.start_at(seq)
            self._apply_next(rank, seq, payload)
            return
        self.counters.replays += 1
        epoch = rank.epoch
        try:
            replayed = await self._replay_holding_live(rank, 0)
        except _ReplayFailed as exc:
            if rank.epoch == epoch:
                self._warnings.log(
                    logging.INFO, "join", "rank %d: first batch is seq %d, replay failed (%s)", dp_rank, seq, exc
                )
                rank.tracker.start_at(seq)
                self._apply_next(rank, seq, payload)
            return
        if rank.epoch != epoch:
            return  # engine_down reset the rank meanwhile: its next batch joins again
        first = min(replayed[0][0], seq) if replayed else seq
        rank.tracker.start_at(first)
        applied, lost = self._apply_in_order(rank, replayed, seq, payload, f"joined at seq {seq}")
        log.info(
            "engine %s rank %d: first batch is seq %d; replayed %d earlier batches%s",
            self.engine, dp_rank, seq, applied, " (with a hole: index cleared)" if lost else "",
        )  # fmt: skip

    async def _recover(self, rank: _Rank, gap: Gap, payload: bytes) -> None:
        """Fill ``gap`` from replay if possible, else clear the rank; then apply ``gap.got``."""
        self.counters.gaps += 1
        dp_rank = rank.source.dp_rank
        what = f"gap {gap.expected}→{gap.got}"
        if not self._may_replay(rank):
            reason = self._no_replay_reason(rank)
            self._lose(rank, gap.got, f"{what}, {reason}")
            self._warnings.log(
                logging.WARNING, "lost", "rank %d: %s, %s: history lost, index cleared", dp_rank, what, reason
            )
            self._apply_next(rank, gap.got, payload)
            return

        self.counters.replays += 1
        epoch = rank.epoch
        try:
            replayed = await self._replay_holding_live(rank, gap.expected)
        except _ReplayFailed as exc:
            if rank.epoch == epoch:
                self._lose(rank, gap.got, f"{what}, replay failed ({exc})")
                self._warnings.log(
                    logging.WARNING, "lost", "rank %d: %s, replay failed (%s): history lost, index cleared",
                    dp_rank, what, exc,
                )  # fmt: skip
                self._apply_next(rank, gap.got, payload)
            return
        if rank.epoch != epoch:
            # engine_down cleared the rank meanwhile; these batches predate the clear.
            return

        lost_history = rank.tracker.replay_result(replayed[0][0] if replayed else None)
        applied, lost = self._apply_in_order(rank, replayed, gap.got, payload, what)
        if lost_history or lost:
            self._warnings.log(
                logging.WARNING, "lost", "rank %d: %s, history lost: index cleared, replayed %d batches",
                dp_rank, what, applied,
            )  # fmt: skip
        else:
            self._warnings.log(logging.INFO, "replayed", "rank %d: %s, replayed %d batches", dp_rank, what, applied)

    def _apply_in_order(
        self, rank: _Rank, replayed: list[tuple[int, bytes]], seq: int, payload: bytes, what: str
    ) -> tuple[int, bool]:
        """Apply replayed batches and then the live one that revealed the need, in seq order.

        A hole (replay starting past what is needed, or missing a seq) loses history once.
        Returns (replayed batches applied, whether history was lost).
        """
        first = replayed[0][0] if replayed else None
        applied = 0
        lost = False
        for index, (number, data) in enumerate([*replayed, (seq, payload)]):
            action = rank.tracker.observe_replayed(number)
            if isinstance(action, Gap):
                why = "replay had nothing" if first is None else f"replay starts at {first}"
                self._lose(rank, number, f"{what}, {why}")
                lost = True
                action = rank.tracker.observe_replayed(number)
            if isinstance(action, Apply):
                self._apply(rank, number, data)
                applied += index < len(replayed)
            else:
                assert isinstance(action, Skip)
        return applied, lost

    def _apply_next(self, rank: _Rank, seq: int, payload: bytes) -> None:
        """Apply the batch that ``start_at`` / ``accept_loss`` made the next one."""
        action = rank.tracker.observe_replayed(seq)
        assert isinstance(action, Apply), action
        self._apply(rank, seq, payload)

    def _lose(self, rank: _Rank, resume: int, why: str) -> None:
        """History before ``resume`` is gone: clear the rank (one loss), resume at ``resume``."""
        self.counters.lost += 1
        self.sink.on_clear(rank.source.dp_rank, f"{why}: history lost")
        rank.tracker.accept_loss(resume)

    def _may_replay(self, rank: _Rank) -> bool:
        return rank.source.replay_endpoint is not None and trio.current_time() >= rank.replay_after

    @staticmethod
    def _no_replay_reason(rank: _Rank) -> str:
        if rank.source.replay_endpoint is None:
            return "no replay endpoint"
        return "replay backing off after a failed one"

    async def _replay_holding_live(self, rank: _Rank, start_seq: int) -> list[tuple[int, bytes]]:
        """Replay from ``start_seq`` while holding live batches that arrive meanwhile; a failure
        puts off the next replay (doubling, up to `MAX_REPLAY_BACKOFF`), a success ends that."""
        try:
            result = await self._replay_holding_live_once(rank, start_seq)
        except _ReplayFailed:
            rank.replay_after = trio.current_time() + rank.replay_backoff
            rank.replay_backoff = min(rank.replay_backoff * 2, MAX_REPLAY_BACKOFF)
            raise
        rank.replay_backoff = 1.0
        return result

    async def _replay_holding_live_once(self, rank: _Rank, start_seq: int) -> list[tuple[int, bytes]]:
        result: list[tuple[int, bytes]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._hold_live, rank)
            try:
                result = await self._fetch_replay(rank.source, start_seq)
            except _ReplayFailed as exc:
                failure: _ReplayFailed | None = exc
            else:
                failure = None
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return result

    async def _hold_live(self, rank: _Rank) -> None:
        # Past the bound, stop reading: the socket's RCVHWM queue holds the rest.
        while len(rank.pending) < self.live_buffer:
            rank.pending.extend(await rank.sub.recv_batch(self.live_buffer - len(rank.pending)))
        await trio.sleep_forever()

    async def _fetch_replay(self, source: KvEventSource, start_seq: int) -> list[tuple[int, bytes]]:
        """Every batch the publisher still buffers from ``start_seq`` on, in order.

        Replies come as ``[b"", seq, payload]`` (SGLang ≤ 0.5.19) or ``[b"", topic, seq,
        payload]`` (0.5.23); the end marker has seq ``0xFF×8`` in either layout.
        """
        assert source.replay_endpoint is not None
        batches: list[tuple[int, bytes]] = []
        try:
            with TrioSocket(self._ctx, zmq.DEALER) as dealer, trio.fail_after(self.replay_timeout):
                dealer.socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
                dealer.connect(source.replay_endpoint)
                await dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
                while True:
                    for frames in await dealer.recv_batch():
                        if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != 8:
                            raise _ReplayFailed(f"malformed reply of {len(frames)} frames")
                        if frames[-2] == END_SEQ:
                            return batches
                        batches.append((int.from_bytes(frames[-2], "big"), frames[-1]))
        except trio.TooSlowError:
            raise _ReplayFailed(f"no end marker within {self.replay_timeout:g}s") from None
        except zmq.ZMQError as exc:
            raise _ReplayFailed(str(exc)) from None
