"""Router-side load per worker: what this router has sent each worker and not yet seen finish.

The KV router's cost needs load that is fresh at dispatch time; engine load polls lag by seconds,
and a burst routed in between would all land on the worker that looked idle (user-asks.md §3).
So, as Dynamo's ``ActiveSequences`` (kv-events.md §10.4), every routed request is counted from
the moment it is routed:

* **pending prefill**: its uncached prompt tokens (``prompt_tokens - overlap_blocks * block_size``)
  until its first token arrives (``first_token``);
* **decode blocks**: its prompt's routing blocks, deduped by sequence hash against the blocks other
  requests already hold on the same worker (requests sharing a prefix share its KV), plus one
  private block every ``block_size`` tokens it generates (``grow``, optional);
* **requests**: one until ``free`` (completion, abort or error).

Load from other frontends (router replicas, ``--workers`` siblings, direct clients) is invisible
here; numbers polled from the engines (``GetLoad``) are merged in with ``set_external_load``. The
poll is the shared truth, this router's own in-flight count the correction on top: per worker,
load = own now + what *others* had there at the poll, i.e. ``max(0, polled - own at the poll)``,
for each of decode blocks (``ceil(used_tokens / block_size)``), pending prefill tokens
(``waiting_tokens``, when polled) and requests (``running + waiting``). A poll includes this
router's own requests as of the poll, so subtracting what it had then counts them once; requests
it routed or finished since move the estimate at once. Every replica thus sees the same load on
an engine, up to what each routed since its last poll, and so picks the same warm engine.

Sans-IO: plain synchronous bookkeeping, driven by the request lifecycle.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["ActiveSequences", "ExternalLoad", "OwnLoad"]

Worker = Hashable


@dataclass(frozen=True, slots=True)
class ExternalLoad:
    """Load polled from an engine rank, covering every frontend's requests there."""

    running: int
    waiting: int
    used_tokens: int
    waiting_tokens: int | None = None
    max_tokens: int | None = None
    """The engine's KV pool in tokens (``max_total_num_tokens``), when reported."""


@dataclass(frozen=True, slots=True)
class OwnLoad:
    """This router's own load on a worker at one moment (what a poll taken then includes)."""

    requests: int = 0
    decode_blocks: int = 0
    prefill_tokens: int = 0


_IDLE = OwnLoad()


@dataclass(slots=True)
class _Request:
    worker: Worker
    hashes: Sequence[int]
    prefill: int  # pending prefill tokens; 0 once the first token arrived
    tail: int  # prompt tokens past its last complete block
    generated: int = 0
    output_blocks: int = 0


@dataclass(slots=True)
class _WorkerLoad:
    blocks: dict[int, int]  # active prompt block (sequence hash) -> requests holding it
    output_blocks: int = 0
    prefill: int = 0
    requests: int = 0


class ActiveSequences:
    """In-flight requests per worker, as this router routed them."""

    __slots__ = ("_at_poll", "_block", "_external", "_requests", "_workers")

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self._block = block_size
        self._requests: dict[str, _Request] = {}
        self._workers: dict[Worker, _WorkerLoad] = {}
        self._external: dict[Worker, ExternalLoad] = {}
        self._at_poll: dict[Worker, OwnLoad] = {}

    @property
    def block_size(self) -> int:
        return self._block

    def __len__(self) -> int:
        """Requests in flight, all workers together."""
        return len(self._requests)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def worker_of(self, request_id: str) -> Worker | None:
        """Where ``request_id`` was routed, ``None`` if it is not in flight."""
        request = self._requests.get(request_id)
        return request.worker if request is not None else None

    # -- request lifecycle -----------------------------------------------------------------

    def add(
        self,
        request_id: str,
        worker: Worker,
        seq_hashes: Sequence[int],
        prompt_tokens: int,
        overlap_blocks: int,
    ) -> None:
        """Count a request just routed to ``worker``.

        ``seq_hashes`` are its prompt's routing-block sequence hashes, ``overlap_blocks`` how many
        leading blocks the worker was believed to cache. Adding an id already in flight moves it
        (a retry routed elsewhere): its old load is freed first.
        """
        if request_id in self._requests:
            self.free(request_id)
        block = self._block
        prefill = max(prompt_tokens - overlap_blocks * block, 0)
        tail = max(prompt_tokens - len(seq_hashes) * block, 0)
        request = _Request(worker, seq_hashes, prefill, tail)
        request.output_blocks = tail // block
        self._requests[request_id] = request
        load = self._workers.get(worker)
        if load is None:
            load = self._workers[worker] = _WorkerLoad({})
        blocks = load.blocks
        get = blocks.get
        for value in seq_hashes:
            blocks[value] = get(value, 0) + 1
        load.output_blocks += request.output_blocks
        load.prefill += prefill
        load.requests += 1

    def first_token(self, request_id: str) -> None:
        """The request's prefill is done: its prompt stops counting as pending prefill."""
        request = self._requests.get(request_id)
        if request is None or not request.prefill:
            return
        self._workers[request.worker].prefill -= request.prefill
        request.prefill = 0

    def grow(self, request_id: str, new_tokens: int) -> None:
        """The request generated ``new_tokens`` more: one more decode block per filled block."""
        request = self._requests.get(request_id)
        if request is None or new_tokens <= 0:
            return
        request.generated += new_tokens
        blocks = (request.tail + request.generated) // self._block
        if blocks != request.output_blocks:
            self._workers[request.worker].output_blocks += blocks - request.output_blocks
            request.output_blocks = blocks

    def free(self, request_id: str) -> None:
        """The request ended (completion, abort or error). Unknown or freed ids are ignored."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        load = self._workers[request.worker]
        blocks = load.blocks
        for value in request.hashes:
            left = blocks[value] - 1
            if left:
                blocks[value] = left
            else:
                del blocks[value]
        load.output_blocks -= request.output_blocks
        load.prefill -= request.prefill
        load.requests -= 1
        if not load.requests:
            del self._workers[request.worker]

    # -- workers ---------------------------------------------------------------------------

    def remove_worker(self, worker: Worker) -> None:
        """Forget ``worker``, its in-flight requests and its polled load (engine gone).

        Later ``first_token`` / ``free`` calls for those requests are no-ops.
        """
        if self._workers.pop(worker, None) is not None:
            gone = [rid for rid, request in self._requests.items() if request.worker == worker]
            for rid in gone:
                del self._requests[rid]
        self._external.pop(worker, None)
        self._at_poll.pop(worker, None)

    def own_load(self, worker: Worker) -> OwnLoad:
        """This router's own load on ``worker`` now: take it when a poll is sent."""
        load = self._workers.get(worker)
        if load is None:
            return _IDLE
        return OwnLoad(load.requests, len(load.blocks) + load.output_blocks, load.prefill)

    def set_external_load(
        self,
        worker: Worker,
        running: int,
        waiting: int,
        used_tokens: int,
        *,
        waiting_tokens: int | None = None,
        max_tokens: int | None = None,
        own_at_poll: OwnLoad | None = None,
    ) -> None:
        """Record load polled from the engine (``GetLoad``): running and waiting requests, KV
        tokens in use and, if known, uncached tokens waiting for prefill. Replaces the last poll.

        ``own_at_poll`` is ``own_load`` taken when the poll was sent (default: now).
        """
        self._external[worker] = ExternalLoad(running, waiting, used_tokens, waiting_tokens, max_tokens)
        self._at_poll[worker] = own_at_poll if own_at_poll is not None else self.own_load(worker)

    def clear_external_load(self, worker: Worker) -> None:
        """Drop a poll that can no longer be trusted (engine restarted, poller stopped)."""
        self._external.pop(worker, None)
        self._at_poll.pop(worker, None)

    def external_load(self, worker: Worker) -> ExternalLoad | None:
        """The last poll recorded for ``worker``."""
        return self._external.get(worker)

    # -- load ------------------------------------------------------------------------------

    def prefill_tokens(self, worker: Worker, *, own_only: bool = False) -> int:
        """Prompt tokens routed to ``worker`` and not yet prefilled, plus others' at the poll."""
        load = self._workers.get(worker)
        own = load.prefill if load is not None else 0
        external = None if own_only else self._external.get(worker)
        if external is None or external.waiting_tokens is None:
            return own
        return own + max(0, external.waiting_tokens - self._at_poll[worker].prefill_tokens)

    def decode_blocks(self, worker: Worker, *, own_only: bool = False) -> int:
        """KV blocks the worker's in-flight requests hold, plus others' at the poll."""
        load = self._workers.get(worker)
        own = len(load.blocks) + load.output_blocks if load is not None else 0
        external = None if own_only else self._external.get(worker)
        if external is None:
            return own
        return own + max(0, -(-external.used_tokens // self._block) - self._at_poll[worker].decode_blocks)

    def active_requests(self, worker: Worker, *, own_only: bool = False) -> int:
        """Requests in flight on ``worker``, plus others' at the poll."""
        load = self._workers.get(worker)
        own = load.requests if load is not None else 0
        external = None if own_only else self._external.get(worker)
        if external is None:
            return own
        return own + max(0, external.running + external.waiting - self._at_poll[worker].requests)

    def kv_usage(self, worker: Worker) -> float | None:
        """Fraction of the worker's KV pool in use (``None`` unless a poll reported the pool's size)."""
        external = self._external.get(worker)
        if external is None or not external.max_tokens:
            return None
        return self.decode_blocks(worker) * self._block / external.max_tokens

    def active_overlap(self, worker: Worker, seq_hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt are already active on ``worker``.

        A sequence hash names a whole prefix, so the blocks active on a worker are closed under
        prefixes: a binary search finds the shared run in O(log blocks).
        """
        load = self._workers.get(worker)
        if load is None:
            return 0
        blocks = load.blocks
        lo, hi = 0, len(seq_hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if seq_hashes[mid] in blocks:
                lo = mid + 1
            else:
                hi = mid
        return lo
