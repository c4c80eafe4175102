"""KV-aware routing: send a prompt where its prefix is cached, unless that worker is too busy.

Dynamo's default cost (``lib/kv-router/src/scheduling/selector/default.rs`` in ai-dynamo 1.6), per candidate
worker (an engine's DP rank):

    prefill_blocks = max(prompt_tokens - credit * overlap_blocks * block_size, 0) / block_size
                     + pending_prefill_tokens(worker) / block_size
    decode_blocks  = active_blocks(worker) + prompt blocks not already active there
    cost           = prefill_load_scale * prefill_blocks + decode_blocks

Overlap comes from the event-driven ``KvIndex`` or, for engines without KV events, from the
``ApproximateIndex`` fed by this router's own decisions. Load comes from ``ActiveSequences``:
counted from dispatch, so a burst does not pile onto the worker that looked idle, and merged
with engine polls so other frontends' load counts too. Overlap alone would send every request
of a hot prefix to one worker; with load in the same unit (blocks), each request routed there
makes the next one less likely to follow (the pile-up users report in peer routers).

Temperature 0 picks the cheapest, ties broken at random (never "first worker", which would
bounce multi-turn chats or pile up on one engine). Temperature ``T > 0`` min-max normalises
the costs to [0, 1] and samples ``p ∝ exp(-normalised / T)``: at ``T = 1`` the cheapest is
``e`` times likelier than the dearest, whatever the costs' scale; equal costs are uniform.

Every decision is a ``Decision`` listing each candidate's overlap, load and cost, for the log
line (``explain``) and ``GET /debug/routing`` (``to_json``). A candidate's overlap says how much
of it the frontend saw stored and how much it holds only by inference (``KvIndex`` anchors:
history the frontend never saw, located from the prompts it routed).

The same router serves the load-only policies (``selection``): ``least-load`` takes the worker
with the fewest requests in flight (ties: fewer KV blocks in use, then random), ``power-of-two``
the less loaded of two drawn at random. Their load is the same as the cost's: polled from the
engines and corrected by this router's own in-flight requests (``ActiveSequences``).

Sans-IO: plain synchronous code; the frontend calls ``route``, then ``first_token`` and
``free`` as the request progresses.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trio_direct.routing.active_sequences import ActiveSequences
from trio_direct.routing.approximate_index import DEFAULT_MAX_BLOCKS, ApproximateIndex
from trio_direct.routing.block_hash import RoutingKey, prefix_hashes
from trio_direct.routing.kv_index import KvIndex
from trio_direct.routing.simple import NoWorkerAvailable

__all__ = ["SELECTIONS", "Candidate", "Decision", "KvRouter", "KvRouterConfig", "worker_label"]

Worker = Hashable

_TIE = 1e-9  # relative: costs this close count as equal

#: How a worker is picked: by the KV cost, or by load alone.
SELECTIONS = ("cost", "least-load", "power-of-two")


@dataclass(frozen=True, slots=True)
class KvRouterConfig:
    """Knobs of the cost and selection, named after Dynamo's ``--router-*`` flags."""

    overlap_score_credit: float = 1.0
    """Weight of cached blocks against prefill work; 0 ignores the cache (load only)."""
    prefill_load_scale: float = 1.0
    """Weight of prefill blocks against decode blocks in the cost."""
    temperature: float = 0.0
    """0: cheapest wins; > 0: sample, softer the higher."""
    use_kv_events: bool = True
    """False: learn overlap from own routing decisions (``ApproximateIndex``)."""
    ttl_secs: float = 120.0
    """How long a routed prefix is assumed cached, without KV events."""
    block_size: int = 16
    """Routing block in tokens: a multiple of every engine's page size."""
    approximate_max_blocks: int = DEFAULT_MAX_BLOCKS
    """Memory bound of the approximate index, in (worker, block) entries."""
    selection: str = "cost"
    """``cost`` (overlap and load), or load alone: ``least-load``, ``power-of-two``."""

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {', '.join(SELECTIONS)}")
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.overlap_score_credit < 0 or self.prefill_load_scale < 0:
            raise ValueError("overlap_score_credit and prefill_load_scale must be >= 0")
        if not self.temperature >= 0:
            raise ValueError("temperature must be >= 0")
        if not self.ttl_secs > 0:
            raise ValueError("ttl_secs must be > 0")


@dataclass(frozen=True, slots=True)
class Candidate:
    """One worker as the router weighed it."""

    worker: Worker
    overlap_blocks: int
    prefill_blocks: float
    decode_blocks: int
    cost: float
    probability: float | None = None
    """Chance it was drawn (temperature > 0); ``None`` at temperature 0."""
    inferred_blocks: int = 0
    """Leading overlap blocks held only by inference, never seen stored (``KvIndex`` anchors)."""
    requests: int = 0
    """Requests in flight on the worker (polled and own), what the load-only policies weigh."""

    @property
    def overlap_source(self) -> str | None:
        """``stored``, ``inferred`` or ``stored+inferred``: where the overlap came from."""
        if not self.overlap_blocks:
            return None
        if not self.inferred_blocks:
            return "stored"
        return "inferred" if self.inferred_blocks >= self.overlap_blocks else "stored+inferred"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"worker": worker_label(self.worker)}
        if isinstance(self.worker, RoutingKey):
            out["engine_id"] = self.worker.engine_id
            out["dp_rank"] = self.worker.dp_rank
        out["overlap_blocks"] = self.overlap_blocks
        out["overlap_source"] = self.overlap_source
        out["overlap_stored_blocks"] = self.overlap_blocks - self.inferred_blocks
        out["overlap_inferred_blocks"] = self.inferred_blocks
        out["requests"] = self.requests
        out["prefill_blocks"] = self.prefill_blocks
        out["decode_blocks"] = self.decode_blocks
        out["cost"] = self.cost
        out["probability"] = self.probability
        return out


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and why: every candidate's overlap, load and cost."""

    worker: Worker
    candidates: tuple[Candidate, ...]
    prompt_tokens: int
    overlap_blocks: int
    """Leading prompt blocks the chosen worker caches (as far as the router knows)."""
    reason: str
    request_id: str | None = None
    mode: str = "events"
    """``events`` (KvIndex), ``approximate`` (learned from routing) or ``load`` (load-only policies)."""
    seq_hashes: tuple[int, ...] = field(default=(), repr=False)

    @property
    def prompt_blocks(self) -> int:
        """Complete routing blocks in the prompt: what overlap is out of."""
        return len(self.seq_hashes)

    @property
    def chosen(self) -> Candidate:
        return next(c for c in self.candidates if c.worker == self.worker)

    def explain(self) -> str:
        """One log line: the choice, then every candidate's overlap, load and cost."""
        parts = []
        for c in self.candidates:
            inferred = f" ({c.inferred_blocks} inferred)" if c.inferred_blocks else ""
            text = (
                f"{worker_label(c.worker)} overlap {c.overlap_blocks}{inferred} prefill"
                f" {c.prefill_blocks:.1f} decode {c.decode_blocks} requests {c.requests} cost {c.cost:.1f}"
            )
            if c.probability is not None:
                text += f" p {c.probability:.2f}"
            parts.append(text)
        rid = f" {self.request_id}" if self.request_id is not None else ""
        return (
            f"kv route{rid} -> {worker_label(self.worker)}: overlap {self.overlap_blocks}/"
            f"{self.prompt_blocks} blocks ({self.mode}); {', '.join(parts)}; {self.reason}"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, for ``GET /debug/routing``."""
        return {
            "request_id": self.request_id,
            "worker": worker_label(self.worker),
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "prompt_blocks": self.prompt_blocks,
            "overlap_blocks": self.overlap_blocks,
            "reason": self.reason,
            "candidates": [c.to_json() for c in self.candidates],
        }


def worker_label(worker: Worker) -> str:
    """``engine/rank`` for a ``RoutingKey`` (``engine`` without DP), ``str()`` otherwise."""
    if isinstance(worker, RoutingKey):
        if worker.dp_rank is None:
            return worker.engine_id
        return f"{worker.engine_id}/{worker.dp_rank}"
    return str(worker)


class KvRouter:
    """Chooses a worker per request from prefix overlap and load, and tracks that load."""

    __slots__ = ("_active", "_approx", "_clock", "_config", "_index", "_rng")

    def __init__(
        self,
        config: KvRouterConfig,
        index: KvIndex | None = None,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``index`` is the event-fed KV index (one is created if omitted: feed ``.index``);
        unused when ``config.use_kv_events`` is false. ``clock`` times the approximate index.
        """
        self._config = config
        if index is not None and index.block_size != config.block_size:
            raise ValueError(f"index block size {index.block_size} != router block size {config.block_size}")
        self._index: KvIndex | None = None
        self._approx: ApproximateIndex | None = None
        if config.selection != "cost":
            pass  # load alone: no index of any kind
        elif config.use_kv_events:
            self._index = index if index is not None else KvIndex(config.block_size)
        else:
            self._approx = ApproximateIndex(
                config.block_size, config.ttl_secs, max_blocks=config.approximate_max_blocks
            )
        self._active = ActiveSequences(config.block_size)
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock

    @property
    def config(self) -> KvRouterConfig:
        return self._config

    @property
    def index(self) -> KvIndex | None:
        """The event-fed index (``None`` in approximate mode)."""
        return self._index

    @property
    def approximate(self) -> ApproximateIndex | None:
        """The routing-fed index (``None`` when KV events are used)."""
        return self._approx

    @property
    def active(self) -> ActiveSequences:
        """Per-worker load; feed engine polls with ``active.set_external_load``."""
        return self._active

    # -- routing ---------------------------------------------------------------------------

    def decide(
        self,
        token_ids: Sequence[int],
        workers: Sequence[Worker],
        *,
        request_id: str | None = None,
        pinned: Worker | None = None,
    ) -> Decision:
        """Weigh every worker for this prompt and pick one; records nothing.

        ``pinned``, if among ``workers``, is picked whatever its cost (session affinity).
        """
        if not workers:
            raise NoWorkerAvailable("no healthy worker to route to")
        config = self._config
        block = config.block_size
        prompt_tokens = len(token_ids)
        seq_hashes = tuple(prefix_hashes(token_ids, block))
        load_only = config.selection != "cost"
        credit = 0.0 if load_only else config.overlap_score_credit
        matches = self._matches(seq_hashes) if credit else {}
        kv_index = self._index
        scale = config.prefill_load_scale
        active = self._active
        n_blocks = len(seq_hashes)

        candidates: list[Candidate] = []
        for worker in dict.fromkeys(workers):
            overlap = matches.get(worker, 0)
            prefill = (max(prompt_tokens - credit * overlap * block, 0.0) + active.prefill_tokens(worker)) / block
            decode = active.decode_blocks(worker) + n_blocks
            if decode > n_blocks:  # blocks already active there are not added again
                decode -= active.active_overlap(worker, seq_hashes)
            requests = active.active_requests(worker)
            inferred = kv_index.inferred_blocks(worker, seq_hashes, overlap) if kv_index and overlap else 0
            cost = float(requests) if load_only else scale * prefill + decode
            candidates.append(Candidate(worker, overlap, prefill, decode, cost, None, inferred, requests))

        keys = [c.worker for c in candidates]
        if pinned is not None and pinned in keys:
            index, reason = keys.index(pinned), "session affinity"
        else:
            index, reason = self._select_by_load(candidates) if load_only else self._select(candidates)
        chosen = candidates[index]
        best = max(candidates, key=lambda c: c.overlap_blocks)
        if best.overlap_blocks > chosen.overlap_blocks:
            reason += f"; longest prefix ({best.overlap_blocks} blocks on {worker_label(best.worker)})" + (
                " elsewhere" if reason == "session affinity" else " passed over for load"
            )
        return Decision(
            worker=chosen.worker,
            candidates=tuple(candidates),
            prompt_tokens=prompt_tokens,
            overlap_blocks=chosen.overlap_blocks,
            reason=reason,
            request_id=request_id,
            mode="load" if load_only else "events" if self._index is not None else "approximate",
            seq_hashes=seq_hashes,
        )

    def route(
        self, request_id: str, token_ids: Sequence[int], workers: Sequence[Worker], *, pinned: Worker | None = None
    ) -> Decision:
        """``decide``, then count the request on the chosen worker (and, without KV events,
        remember its prefix there). Pair with ``free`` whatever happens to the request.
        """
        decision = self.decide(token_ids, workers, request_id=request_id, pinned=pinned)
        self._active.add(
            request_id,
            decision.worker,
            decision.seq_hashes,
            decision.prompt_tokens,
            decision.overlap_blocks,
        )
        if self._approx is not None and decision.seq_hashes:
            self._approx.insert(decision.worker, decision.seq_hashes, self._clock())
        if self._index is not None:
            self._index.note_routed(decision.worker, token_ids)
        return decision

    def first_token(self, request_id: str) -> None:
        """The request's prefill is done: release its prefill load."""
        self._active.first_token(request_id)

    def grow(self, request_id: str, new_tokens: int) -> None:
        """The request generated ``new_tokens`` more (optional: grows its decode load)."""
        self._active.grow(request_id, new_tokens)

    def free(self, request_id: str) -> None:
        """The request ended (completion, abort, error); idempotent."""
        self._active.free(request_id)

    def remove_worker(self, worker: Worker) -> None:
        """Drop the router's own state about ``worker``: its load and learned prefixes.

        The event-fed ``index`` belongs to whatever feeds it and is left alone.
        """
        self._active.remove_worker(worker)
        if self._approx is not None:
            self._approx.remove_worker(worker)

    # -- internals -------------------------------------------------------------------------

    def _matches(self, seq_hashes: Sequence[int]) -> dict[Worker, int]:
        if not seq_hashes:
            return {}
        if self._index is not None:
            return self._index.find_matches_hashes(seq_hashes)
        assert self._approx is not None
        return self._approx.find_matches_hashes(seq_hashes, self._clock())

    def _select_by_load(self, candidates: list[Candidate]) -> tuple[int, str]:
        """``least-load`` or ``power-of-two``: fewest requests, then fewest KV blocks, then random."""
        if len(candidates) == 1:
            return 0, "only candidate"
        pool = list(range(len(candidates)))
        reason = "least load"
        if self._config.selection == "power-of-two":
            pool = self._rng.sample(pool, 2)
            reason = f"less loaded of two drawn ({', '.join(worker_label(candidates[i].worker) for i in pool)})"

        def load(i: int) -> tuple[int, int]:
            return candidates[i].requests, candidates[i].decode_blocks

        best = min(load(i) for i in pool)
        tied = [i for i in pool if load(i) == best]
        if len(tied) > 1:
            return self._rng.choice(tied), f"{reason}, tie of {len(tied)} broken at random"
        return tied[0], reason

    def _select(self, candidates: list[Candidate]) -> tuple[int, str]:
        """Index of the chosen candidate and why; fills in probabilities when sampling."""
        if len(candidates) == 1:
            return 0, "only candidate"
        costs = [c.cost for c in candidates]
        low, high = min(costs), max(costs)
        temperature = self._config.temperature
        if temperature == 0:
            tied = [i for i, cost in enumerate(costs) if cost <= low + _TIE * max(1.0, abs(low))]
            if len(tied) == 1:
                return tied[0], "lowest cost"
            return self._rng.choice(tied), f"lowest cost, tie of {len(tied)} broken at random"
        spread = high - low
        if spread <= _TIE * max(1.0, abs(high)):
            weights = [1.0] * len(costs)
        else:
            scale = spread * temperature
            weights = [math.exp(-(cost - low) / scale) for cost in costs]
        total = sum(weights)
        probabilities = [w / total for w in weights]
        for i, (c, p) in enumerate(zip(candidates, probabilities, strict=True)):
            candidates[i] = Candidate(
                c.worker, c.overlap_blocks, c.prefill_blocks, c.decode_blocks, c.cost, p, c.inferred_blocks, c.requests
            )
        draw = self._rng.random()
        acc = 0.0
        chosen = len(candidates) - 1
        for i, p in enumerate(probabilities):
            acc += p
            if draw < acc:
                chosen = i
                break
        return chosen, f"sampled at temperature {temperature:g}"
