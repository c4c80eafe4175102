"""The mock engine's trio shell: one scheduler loop per DP rank, the live requests, PD legs.

The sans-IO `Scheduler` decides what a step does and how long it takes; this module makes the
time pass, hands each step's outputs to the request that owns them and publishes the step's KV
events. It also owns what both gRPC services share: request admission (DP rank choice, PD
rendezvous), `Abort` with SGLang's exact-then-prefix matching, client cancellation and the
accounting tests read to prove that a cancel or an abort reached the engine.

Everything here is synchronous except the rank loops and the PD leg tasks, so the gRPC handlers
(plain functions called on the trio thread) can submit, abort and cancel directly.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import trio

from trio_direct.mock.bootstrap import BootstrapFailed, BootstrapServer, BootstrapTimeout, receive_kv
from trio_direct.mock.kv_publisher import KvEventPublishers
from trio_direct.mock.kv_types import KvEvent
from trio_direct.mock.scheduler import Finish, MockRequest, RequestOutput, Scheduler, SchedulerConfig
from trio_direct.mock.scripted import ScriptedOutputs

__all__ = [
    "FAKE_BOOTSTRAP_HOST",
    "Accounting",
    "Bootstrap",
    "EngineInfo",
    "KvBatchListener",
    "MockEngine",
    "RequestSink",
    "Role",
]

log = logging.getLogger(__name__)

Role = Literal["aggregated", "prefill", "decode"]

#: Host smg's health probes put in DisaggregatedParams: no KV transfer happens for them.
FAKE_BOOTSTRAP_HOST = "2.2.2.2"

#: Simulated KV transfer cost per prompt token, before dividing by the speedup.
TRANSFER_SECONDS_PER_TOKEN = 2e-6

#: Bound on the per-request records kept for tests (first output times, abort RPCs).
_RECORD_LIMIT = 10_000

#: (dp_rank, sequence number, timestamp, events) of one published KV batch.
KvBatchListener = Callable[[int, int, float, Sequence[KvEvent]], None]


class RequestSink(Protocol):
    """Where a submitted request's results go; both methods are called on the trio thread."""

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        """One step's output for one request; the last one has ``finish`` set."""

    def aborted(self, rid: str) -> None:
        """An Abort (RPC or cascade) ended the request; no further output follows."""


@dataclass(slots=True, frozen=True)
class Bootstrap:
    """The PD rendezvous triple both legs of one request carry."""

    host: str
    port: int
    room: int

    @property
    def fake(self) -> bool:
        """A health probe's triple: answered without any transfer."""
        return self.host == FAKE_BOOTSTRAP_HOST


@dataclass(slots=True)
class EngineInfo:
    """What the info RPCs of both APIs report; the server fills it once its ports are bound.

    ``server_args`` mirrors SGLang's resolved ``ServerArgs`` (flat, JSON values);
    ``scheduler_info`` its scheduler start report.
    """

    model_path: str
    served_model_name: str
    tokenizer_path: str
    context_length: int
    max_total_num_tokens: int
    max_req_input_len: int
    vocab_size: int
    eos_token_ids: list[int]
    model_type: str = "unknown"
    architectures: list[str] = field(default_factory=list)
    server_args: dict[str, Any] = field(default_factory=dict)
    scheduler_info: dict[str, Any] = field(default_factory=dict)
    kv_events: dict[str, Any] | None = None
    kv_event_sources: list[dict[str, Any]] = field(default_factory=list)
    incremental_streaming_output: bool = False
    expose_accounting: bool = False
    #: ``--is-embedding``: `Embed` vectors of `embedding_dim` floats, no generation.
    is_embedding: bool = False
    #: ``--multimodal``: requests may carry images (`mock.pooling`).
    multimodal: bool = False
    embedding_dim: int = 1024
    #: Seed of the engine's sampling RNG (``--seed``, as SGLang's ``--random-seed``); None: fresh entropy.
    random_seed: int | None = None
    #: ``--scripted-outputs``: fixed answers for chosen prompts.
    scripts: ScriptedOutputs | None = None
    #: Wall-clock start (seconds) and its nanoseconds, the native API's ``instance_id``.
    start_time: float = field(default_factory=time.time)
    start_ns: int = field(default_factory=time.time_ns)
    #: A ``tokenizers.Tokenizer`` when the model directory has one (Tokenize, Detokenize).
    tokenizer: Any = None
    #: The folder the model's files were read from (`GetTokenizer` archives it); "" = `tokenizer_path`.
    model_directory: str = ""

    _sampling_rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._sampling_rng = random.Random(self.random_seed)

    def sample_variations(self, seed: int | None, n: int) -> list[int | None]:
        """The `MockRequest.variation` of each of a request's ``n`` samples.

        With a seed there is none: the seed decides every token, shared by the samples (like
        SGLang's ``sampling_seed``), so the request is repeatable. Without one, each sample draws its
        own from the engine's RNG, so identical requests and the samples of one request differ, as on
        a real engine; a fresh engine with ``--seed`` draws the same sequence.
        """
        if seed is not None:
            return [None] * n
        return [self._sampling_rng.getrandbits(64) for _ in range(n)]

    @property
    def disaggregation_mode(self) -> str:
        return str(self.server_args.get("disaggregation_mode", "null"))


@dataclass(slots=True)
class Accounting:
    """What happened to every request, counted once each when it ends.

    ``finished``: ended by the scheduler (stop or length); ``aborted``: ended by an Abort RPC or
    its prefix cascade; ``cancelled``: the client went away; ``failed``: ended with an engine-side
    abort (PD rendezvous failure, a PD request without a room); ``rejected``: refused at
    admission (prompt too long, bad DP rank), never started.
    """

    started: int = 0
    finished: int = 0
    aborted: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0
    live: set[str] = field(default_factory=set)
    #: (rid, time.monotonic()) of every Abort RPC received, newest last.
    abort_rpcs: list[tuple[str, float]] = field(default_factory=list)
    #: rid -> time.monotonic() when its first output left the engine.
    first_output_at: dict[str, float] = field(default_factory=dict)
    #: rid -> how it ended: "finished", "aborted", "cancelled" or "failed" (most recent ones).
    outcomes: dict[str, str] = field(default_factory=dict)
    #: rid -> what the request carried besides its tokens (native API: priority, trace headers),
    #: and its prompt length (most recent ones).
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "finished": self.finished,
            "aborted": self.aborted,
            "cancelled": self.cancelled,
            "failed": self.failed,
            "rejected": self.rejected,
            "live": sorted(self.live),
            "abort_rpcs": [[rid, at] for rid, at in self.abort_rpcs],
            "first_output_at": dict(self.first_output_at),
            "outcomes": dict(self.outcomes),
            "requests": dict(self.requests),
        }


@dataclass(slots=True, eq=False)
class _Live:
    """One scheduler request (a sample, or one PD leg) between admission and its end."""

    rid: str
    api: str
    dp_rank: int
    sink: RequestSink
    prompt_tokens: int
    pd: str = "none"
    completion_tokens: int = 0
    cached_tokens: int = 0
    got_output: bool = False
    prefilled: trio.Event | None = None
    scope: trio.CancelScope | None = None
    #: A prefill whose decode leg pulls the KV after the prefill finished (vLLM's connectors),
    #: rather than one that finishes once its KV went out (SGLang's bootstrap).
    pull: bool = False


class MockEngine:
    """Schedulers for every DP rank plus the registry of live requests.

    Run `run()` in a nursery before submitting: it starts the rank loops and the nursery that PD
    leg tasks live in.
    """

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        *,
        dp_size: int = 1,
        role: Role = "aggregated",
        bootstrap_timeout: float = 30.0,
        decode_text: Callable[[list[int]], str] | None = None,
        bootstrap_server: BootstrapServer | None = None,
        publishers: KvEventPublishers | None = None,
    ) -> None:
        if dp_size < 1:
            raise ValueError("dp_size must be at least 1")
        if role == "prefill" and bootstrap_server is None:
            raise ValueError("a prefill engine needs a bootstrap server")
        self.dp_size = dp_size
        self.role = role
        self.bootstrap_timeout = bootstrap_timeout
        self.speedup = scheduler_config.speedup
        self.accounting = Accounting()
        self.shutting_down = False
        self._schedulers = [
            Scheduler(_for_rank(scheduler_config, rank), decode_text=decode_text) for rank in range(dp_size)
        ]
        self._wakeups = [trio.Event() for _ in range(dp_size)]
        self._bootstrap = bootstrap_server
        self._publishers = publishers if publishers is not None and len(publishers) else None
        self._kv_listeners: list[KvBatchListener] = []
        self._live: dict[str, _Live] = {}
        self._next_rank = 0
        self._nursery: trio.Nursery | None = None

    # --- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Step every rank until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for rank in range(self.dp_size):
                    nursery.start_soon(self._run_rank, rank)
                task_status.started()
        finally:
            self.shutting_down = True
            self._nursery = None

    async def _run_rank(self, rank: int) -> None:
        scheduler = self._schedulers[rank]
        while True:
            result = scheduler.step()
            if result is None:
                wakeup = self._wakeups[rank] = trio.Event()
                await wakeup.wait()
                continue
            if result.seconds > 0:
                await trio.sleep(result.seconds)
            else:
                await trio.lowlevel.checkpoint()
            self._publish(rank, result.kv_events)
            for rid in result.prefill_done:
                live = self._live.get(rid)
                if live is not None and live.prefilled is not None:
                    live.prefilled.set()
            self._deliver(result.outputs)

    def _wake(self, rank: int) -> None:
        self._wakeups[rank].set()

    def _wake_all(self) -> None:
        for wakeup in self._wakeups:
            wakeup.set()

    def spawn(self, async_fn: Callable[..., Any], *args: Any) -> None:
        """Start a helper task that lives as long as the engine (health probes, timers)."""
        if self._nursery is None:
            raise RuntimeError("the engine is not running")
        self._nursery.start_soon(async_fn, *args)

    # --- state for the services ----------------------------------------------------------------

    @property
    def has_kv_publisher(self) -> bool:
        return self._publishers is not None

    @property
    def kv_listener_count(self) -> int:
        return len(self._kv_listeners)

    @property
    def live_requests(self) -> int:
        return len(self._live)

    def is_live(self, rid: str, api: str | None = None) -> bool:
        live = self._live.get(rid)
        return live is not None and (api is None or live.api == api)

    def loads(self) -> list[dict[str, Any]]:
        """Each rank's scheduler load (SGLang GetLoad core keys), rank order."""
        return [scheduler.load() for scheduler in self._schedulers]

    def add_kv_listener(self, listener: KvBatchListener) -> Callable[[], None]:
        """Also hand every published batch to ``listener``; returns its remover."""
        self._kv_listeners.append(listener)

        def remove() -> None:
            if listener in self._kv_listeners:
                self._kv_listeners.remove(listener)

        return remove

    def flush_cache(self) -> bool:
        """Drop every rank's prefix cache; refused (False) while requests are in flight, as SGLang."""
        if self._live:
            return False
        flushed = [scheduler.flush_cache() for scheduler in self._schedulers]
        for rank, events in enumerate(flushed):
            if events:
                self._publish(rank, events)
        return all(events is not None for events in flushed)

    # --- admission -----------------------------------------------------------------------------

    def submit(
        self,
        requests: Sequence[MockRequest],
        sink: RequestSink,
        *,
        api: str,
        routed_dp_rank: int | None = None,
        bootstrap: Bootstrap | None = None,
        pull: bool = False,
        local: bool = False,
    ) -> list[int]:
        """Admit ``requests`` (one per sample) for ``sink``; returns the DP rank of each.

        Raises ValueError with SGLang's message when a request cannot start (prompt too long,
        ``routed_dp_rank`` out of range); nothing of the batch stays admitted then. On a PD engine a
        request without a bootstrap room ends at once with an engine-side abort, as SGLang's does.
        ``pull``: a prefill finishes as soon as its prompt is in, and its room waits for the decode
        leg afterwards (vLLM's KV connectors), instead of finishing once the KV went out.
        ``local``: run the request whole whatever the engine's role (a vLLM engine with a KV
        connector runs a request that carries no transfer parameters like any other).
        """
        if self._nursery is None:
            raise RuntimeError("the engine is not running")
        if routed_dp_rank is not None and not 0 <= routed_dp_rank < self.dp_size:
            self.accounting.rejected += len(requests)
            raise ValueError(f"routed_dp_rank={routed_dp_rank} out of range [0, {self.dp_size})")
        role_pd = "none" if self.role == "aggregated" or local else self.role
        pd = role_pd if bootstrap is not None else "none"
        added: list[tuple[int, MockRequest]] = []
        for request in requests:
            rank = self._pick_rank(routed_dp_rank)
            if request.pd != pd:
                request = dataclasses.replace(request, pd=pd)
            try:
                self._schedulers[rank].add(request)
            except ValueError:
                for rank_added, request_added in added:
                    self._schedulers[rank_added].abort(request_added.rid, prefix=False)
                self.accounting.rejected += len(requests)
                raise
            added.append((rank, request))
        admitted: list[_Live] = []
        for rank, request in added:
            live = _Live(request.rid, api, rank, sink, len(request.input_ids), pd, pull=pull)
            self._live[live.rid] = live
            self.accounting.live.add(live.rid)
            self.accounting.started += 1
            admitted.append(live)
            self._wake(rank)
        for index, live in enumerate(admitted):
            if role_pd != "none" and bootstrap is None:
                self._fail(live, _no_room_message(live.rid), status_code=400)
            elif pd != "none":
                assert bootstrap is not None
                # With n>1 SGLang gives sample i the room ``room + i``.
                room = bootstrap
                if len(admitted) > 1:
                    room = dataclasses.replace(bootstrap, room=bootstrap.room + index)
                if pd == "prefill":
                    live.prefilled = trio.Event()
                    self._start_leg(live, self._prefill_leg, live, room)
                else:
                    self._start_leg(live, self._decode_leg, live, room)
        return [live.dp_rank for live in admitted]

    def _pick_rank(self, routed_dp_rank: int | None) -> int:
        if routed_dp_rank is not None and self.dp_size > 1:
            return routed_dp_rank
        rank = self._next_rank
        self._next_rank = (rank + 1) % self.dp_size
        return rank

    # --- abort and cancel ----------------------------------------------------------------------

    def abort(self, rid: str, *, abort_all: bool = False, exact_first: bool) -> list[str]:
        """An Abort RPC: returns the rids it ended.

        ``exact_first`` is the native API's TokenizerManager stage: act only if ``rid`` names a
        live native request. Either way the schedulers then abort every request whose rid starts
        with ``rid`` (all of them for ``abort_all`` or an empty rid).
        """
        records = self.accounting.abort_rpcs
        records.append((rid, time.monotonic()))
        if len(records) > _RECORD_LIMIT:
            del records[: len(records) - _RECORD_LIMIT]
        if abort_all:
            rid = ""
        elif exact_first and not self.is_live(rid, "native"):
            return []
        hits: list[str] = []
        for scheduler in self._schedulers:
            hits.extend(scheduler.abort(rid, prefix=True))
        for hit in hits:
            self._terminate(hit, "abort")
        self._wake_all()  # freed pages may let waiting requests in
        return hits

    def cancel(self, rids: Sequence[str]) -> None:
        """The client of ``rids`` went away: abort them like SGLang's server does on a cancel."""
        own = set(rids)
        for rid in rids:
            live = self._live.get(rid)
            if live is None:
                continue
            for scheduler in self._schedulers:  # SGLang broadcasts an abort to every rank
                for hit in scheduler.abort(rid, prefix=True):
                    if hit not in own:
                        self._terminate(hit, "abort")
            self._terminate(rid, "cancel")
        self._wake_all()

    def _terminate(self, rid: str, cause: str) -> None:
        live = self._live.get(rid)
        if live is None:
            return
        self._forget(live)
        if cause == "cancel":
            self.accounting.cancelled += 1
            _record(self.accounting.outcomes, rid, "cancelled")
        else:
            self.accounting.aborted += 1
            _record(self.accounting.outcomes, rid, "aborted")
            live.sink.aborted(rid)

    def _forget(self, live: _Live) -> None:
        if self._live.get(live.rid) is live:
            del self._live[live.rid]
            self.accounting.live.discard(live.rid)
        if live.scope is not None:
            live.scope.cancel()

    # --- outputs and KV events -----------------------------------------------------------------

    def _deliver(self, outputs: Sequence[RequestOutput]) -> None:
        accounting = self.accounting
        for out in outputs:
            live = self._live.get(out.rid)
            if live is None:
                continue  # aborted or cancelled while its step ran
            live.completion_tokens = out.completion_tokens
            live.cached_tokens = out.cached_tokens
            if not live.got_output:
                live.got_output = True
                _record(accounting.first_output_at, out.rid, time.monotonic())
            if out.finish is not None:
                self._forget(live)
                if out.finish.kind == "abort":
                    accounting.failed += 1
                    _record(accounting.outcomes, out.rid, "failed")
                else:
                    accounting.finished += 1
                    _record(accounting.outcomes, out.rid, "finished")
            live.sink.output(out, live.dp_rank)

    def _publish(self, rank: int, events: Sequence[KvEvent]) -> None:
        if not events or self._publishers is None:
            return
        publisher = self._publishers[rank]
        seq = publisher.next_seq
        ts = time.time()
        publisher.publish(events, ts)
        for listener in list(self._kv_listeners):
            listener(rank, seq, ts, events)

    def _fail(self, live: _Live, message: str, *, status_code: int = 500) -> None:
        """End ``live`` with an engine-side abort (a normal end of its stream, like SGLang's)."""
        if self._live.get(live.rid) is not live:
            return
        self._schedulers[live.dp_rank].abort(live.rid, prefix=False)
        self._forget(live)
        self._wake(live.dp_rank)
        self.accounting.failed += 1
        _record(self.accounting.outcomes, live.rid, "failed")
        finish = Finish("abort", message=message, status_code=status_code)
        live.sink.output(
            RequestOutput(live.rid, [], finish, live.prompt_tokens, live.completion_tokens, live.cached_tokens),
            live.dp_rank,
        )

    # --- PD legs -------------------------------------------------------------------------------

    def _start_leg(self, live: _Live, leg: Callable[..., Any], *args: Any) -> None:
        scope = live.scope = trio.CancelScope()
        assert self._nursery is not None

        async def run_leg() -> None:
            with scope:
                await leg(*args)

        self._nursery.start_soon(run_leg)

    async def _prefill_leg(self, live: _Live, bootstrap: Bootstrap) -> None:
        assert live.prefilled is not None
        if bootstrap.fake:
            await live.prefilled.wait()
        elif live.pull:
            await live.prefilled.wait()
            self.spawn(self._hand_off, bootstrap, live.prompt_tokens)
        else:
            assert self._bootstrap is not None
            try:
                handle = await self._bootstrap.wait_for_decode(bootstrap.room, self.bootstrap_timeout)
                try:
                    await live.prefilled.wait()
                except BaseException:
                    handle.abort()
                    raise
                seconds = (
                    0.0
                    if math.isinf(self.speedup)
                    else (live.prompt_tokens * TRANSFER_SECONDS_PER_TOKEN / self.speedup)
                )
                await self._bootstrap.send_kv(handle, live.prompt_tokens, seconds)
            except (BootstrapTimeout, BootstrapFailed) as exc:
                self._fail(live, _transfer_failure(live.rid, bootstrap, exc))
                return
        if self._live.get(live.rid) is live:
            out = self._schedulers[live.dp_rank].transfer_done(live.rid)
            self._wake(live.dp_rank)  # its pages are free again
            if out is not None:
                self._deliver([out])

    async def _hand_off(self, bootstrap: Bootstrap, prompt_tokens: int) -> None:
        """A pulled prefill's KV, held for its decode leg until it comes or the bootstrap timeout."""
        assert self._bootstrap is not None
        try:
            handle = await self._bootstrap.wait_for_decode(bootstrap.room, self.bootstrap_timeout)
            seconds = 0.0 if math.isinf(self.speedup) else prompt_tokens * TRANSFER_SECONDS_PER_TOKEN / self.speedup
            await self._bootstrap.send_kv(handle, prompt_tokens, seconds)
        except (BootstrapTimeout, BootstrapFailed) as exc:
            log.info("room %d: KV held for a decode leg that did not take it: %s", bootstrap.room, exc)

    async def _decode_leg(self, live: _Live, bootstrap: Bootstrap) -> None:
        if not bootstrap.fake:
            try:
                await receive_kv(bootstrap.host, bootstrap.port, bootstrap.room, self.bootstrap_timeout)
            except (BootstrapTimeout, BootstrapFailed) as exc:
                self._fail(live, _transfer_failure(live.rid, bootstrap, exc))
                return
        else:
            await trio.lowlevel.checkpoint()
        if self._live.get(live.rid) is live:
            self._schedulers[live.dp_rank].kv_received(live.rid)
            self._wake(live.dp_rank)


def _for_rank(config: SchedulerConfig, rank: int) -> SchedulerConfig:
    return dataclasses.replace(config, dp_rank=rank)


def record_request(accounting: Accounting, rid: str, details: dict[str, Any]) -> None:
    """Keep what a request carried (bounded, like the other per-request records)."""
    _record(accounting.requests, rid, details)


def _record(records: dict[str, Any], rid: str, at: Any) -> None:
    records[rid] = at
    if len(records) > _RECORD_LIMIT:
        del records[next(iter(records))]


def _no_room_message(rid: str) -> str:
    # SGLang's scheduler text (typo included) for a PD request that carries no bootstrap room.
    return f"Invalid request: Disaggregated request received without boostrap room id. req.rid={rid!r}"


def _transfer_failure(rid: str, bootstrap: Bootstrap, exc: Exception) -> str:
    return (
        f"KV transfer failed for request rid={rid} "
        f"(bootstrap {bootstrap.host}:{bootstrap.port} room {bootstrap.room}): {exc}"
    )
