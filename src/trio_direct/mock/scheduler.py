"""Continuous batching for one DP rank of the mock engine: plain synchronous code, no I/O.

A trio shell feeds it requests (``add``, ``abort``, PD ``transfer_done``/``kv_received``),
calls ``step`` and sleeps for the ``seconds`` each step reports before delivering its outputs.
The policy is SGLang's default (non-mixed, FCFS): a step is either a prefill batch of waiting
requests, which also samples each request's first token, or, when nothing can be admitted, a
decode batch giving every running request one token. KV memory is the prefix cache's page
pool: requests wait while their pages do not fit, and a decode step that runs out of pages
retracts the newest requests back to the queue, as SGLang does.

Output tokens are a pure function of (seed, prompt, position), so identical requests with the same
seed give identical outputs on any engine, and nothing here reads a clock. A request without a seed
carries a `variation` (the engine shell draws one per sample, as a real engine samples afresh): it
changes which tokens are sampled but not where the answer stops, which stays a function of the
prompt, so unseeded answers differ while their lengths and finish reasons stay repeatable.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Literal

import xxhash

from trio_direct.mock.kv_types import KvEvent
from trio_direct.mock.radix_cache import RadixCache, RadixNode
from trio_direct.mock.timing import TimingModel

__all__ = [
    "Finish",
    "MockRequest",
    "RequestOutput",
    "Scheduler",
    "SchedulerConfig",
    "StepResult",
]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MAX_RESAMPLES = 10_000

# Request states.
_WAITING, _RUNNING, _HELD, _AWAIT_KV, _KV_READY = range(5)


@dataclass(slots=True, kw_only=True)
class SchedulerConfig:
    """Engine limits and vocabulary of one DP rank (SGLang's server args, mock-sized)."""

    vocab_size: int
    page_size: int = 1
    num_blocks: int = 65536
    max_running_requests: int = 256
    #: Per-step budget of uncached prompt tokens; a larger prompt is admitted alone.
    max_prefill_tokens: int = 16384
    context_length: int = 32768
    eos_token_ids: frozenset[int] = frozenset()
    #: Never sampled, except EOS ids, which stay possible.
    special_token_ids: frozenset[int] = frozenset()
    speedup: float = 1.0
    dp_rank: int = 0
    #: Off skips SHA-256 page hashing and event recording (benchmarks without a subscriber).
    kv_events: bool = True


@dataclass(slots=True)
class MockRequest:
    """One generation request, already tokenized (one choice; n>1 is several requests)."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int | None
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    #: Without a `seed`: this sample's own draw, varying its tokens but not where it stops.
    variation: int | None = None
    temperature: float = 1.0
    pd: Literal["none", "prefill", "decode"] = "none"
    #: Scripted output (`--scripted-outputs`): these tokens, then EOS, instead of sampled ones.
    script: tuple[int, ...] | None = None


@dataclass(slots=True, frozen=True)
class Finish:
    """Why a request ended, in the shape of SGLang's ``finish_reason``.

    SGLang reports ``{"type": "stop", "matched": ...}``, ``{"type": "length", "length": n}``
    or ``{"type": "abort", "message": ...}``; ``abort`` (with ``message``/``status_code``) is for
    engine-side aborts a shell decides on; the scheduler itself only ends with stop or length.
    """

    kind: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request; ``finish`` is set on its last output."""

    rid: str
    new_token_ids: list[int]
    finish: Finish | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class StepResult:
    """One forward pass: how long it takes, what it produced, the KV events to publish.

    ``prefill_done`` lists PD prefill-leg rids whose KV is now ready to transfer.
    """

    seconds: float
    outputs: list[RequestOutput]
    kv_events: list[KvEvent]
    prefill_done: list[str] = field(default_factory=list)


class _Req:
    """Scheduler-side state of one request."""

    __slots__ = (
        "cached_tokens",
        "input_ids",
        "key",
        "kv_len",
        "mask",
        "match",
        "match_epoch",
        "max_new",
        "min_new",
        "node",
        "output",
        "pd",
        "private",
        "prompt_len",
        "rid",
        "sample_key",
        "script",
        "state",
        "stop_ids",
        "stop_strs",
        "stop_window",
    )

    def __init__(self, req: MockRequest, max_new: int, key: int, sample_key: int, stop_ids: frozenset[int]):
        self.rid = req.rid
        self.script = req.script
        self.input_ids = req.input_ids
        self.prompt_len = len(req.input_ids)
        self.output: list[int] = []
        self.pd = req.pd
        self.max_new = max_new
        self.min_new = req.min_new_tokens
        self.key = key  # decides where the answer stops (and its tokens, unless sample_key differs)
        self.sample_key = sample_key  # decides the other tokens
        self.stop_ids = stop_ids
        # Below min_new_tokens, stop tokens are masked out of sampling (SGLang's penalizer).
        self.mask = stop_ids if req.min_new_tokens > 0 else frozenset()
        self.stop_strs = req.stop_strings
        self.stop_window = max((len(s) for s in req.stop_strings), default=0) + 1
        self.state = _WAITING
        self.kv_len = 0  # tokens whose KV is computed (the last sampled token has none yet)
        self.node: RadixNode | None = None  # locked cached prefix
        self.private = 0  # pages allocated beyond the locked prefix
        self.cached_tokens = -1  # prefix hit at first admission; -1 = not admitted yet
        self.match: RadixNode | None = None  # memoised prefix match while waiting
        self.match_epoch = -1

    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output if self.output else self.input_ids


class Scheduler:
    """Continuous batching over one radix cache; see the module docstring for the policy."""

    def __init__(self, config: SchedulerConfig, decode_text: Callable[[list[int]], str] | None = None) -> None:
        if config.vocab_size < 1 or config.page_size < 1 or config.num_blocks < 1:
            raise ValueError("vocab_size, page_size and num_blocks must be >= 1")
        if config.max_running_requests < 1 or config.max_prefill_tokens < 1:
            raise ValueError("max_running_requests and max_prefill_tokens must be >= 1")
        self._config = config
        self._decode_text = decode_text
        self._cache = RadixCache(config.num_blocks, config.page_size, emit_events=config.kv_events)
        self._timing = TimingModel(config.speedup)
        self._page = config.page_size
        self._vocab = config.vocab_size
        self._max_total_tokens = config.num_blocks * config.page_size
        self._eos = frozenset(config.eos_token_ids)
        self._excluded = frozenset(t for t in config.special_token_ids if t not in self._eos and 0 <= t < self._vocab)
        if len(self._excluded) >= self._vocab:
            raise ValueError("special_token_ids leave no token to sample")
        self._reqs: dict[str, _Req] = {}
        self._waiting: deque[_Req] = deque()
        self._kv_ready: deque[_Req] = deque()
        self._running: dict[str, _Req] = {}
        self._held: dict[str, _Req] = {}
        self._awaiting_kv = 0
        self._prompt_tokens_admitted = 0
        self._cached_tokens_admitted = 0

    # -- introspection -------------------------------------------------------------------

    @property
    def config(self) -> SchedulerConfig:
        return self._config

    @property
    def cache(self) -> RadixCache:
        return self._cache

    @property
    def timing(self) -> TimingModel:
        return self._timing

    @property
    def has_work(self) -> bool:
        """Whether a request could be computed; ``step`` may still return None when all of
        them wait for memory held by PD requests that await ``transfer_done``."""
        return bool(self._running or self._waiting or self._kv_ready)

    @property
    def num_running(self) -> int:
        """Requests in the decode batch."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests not yet running, including PD decode legs waiting for their KV."""
        return len(self._waiting) + len(self._kv_ready) + self._awaiting_kv

    # -- requests in ---------------------------------------------------------------------

    def add(self, req: MockRequest) -> None:
        """Queue a request; ValueError, with SGLang's message, when it can never run."""
        cfg = self._config
        n = len(req.input_ids)
        ctx = cfg.context_length
        if req.rid in self._reqs:
            raise ValueError(f"Duplicate request id: {req.rid!r}")
        if n == 0:
            raise ValueError("The input_ids should not be empty.")
        if n >= ctx:
            raise ValueError(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).")
        max_new = req.max_new_tokens
        if max_new is not None:
            if max_new < 0:
                raise ValueError(f"max_new_tokens must be at least 0, got {max_new}.")
            if max_new + n > ctx:
                raise ValueError(
                    f"Requested token count exceeds the model's maximum context length of {ctx} "
                    f"tokens. You requested a total of {max_new + n} tokens: {n} tokens from the "
                    f"input messages and {max_new} tokens for the completion. Please reduce the "
                    f"number of tokens in the input messages or the completion to fit within the "
                    f"limit."
                )
        if req.min_new_tokens < 0 or (max_new is not None and req.min_new_tokens > max_new):
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {req.min_new_tokens}.")
        if n >= self._max_total_tokens:
            raise ValueError(
                f"Input length ({n} tokens) exceeds the maximum allowed length "
                f"({self._max_total_tokens - 1} tokens). Use a shorter input or enable "
                f"--allow-auto-truncate."
            )
        if req.pd not in ("none", "prefill", "decode"):
            raise ValueError(f"unknown pd role {req.pd!r}")
        try:
            prompt_bytes = array("q", req.input_ids).tobytes()
        except (OverflowError, TypeError):
            raise ValueError("input_ids must be integers in [0, 2**32)") from None
        if min(req.input_ids) < 0 or max(req.input_ids) >= 1 << 32:
            raise ValueError("input_ids must be integers in [0, 2**32)")
        # Greedy decoding ignores the seed; no seed stops like seed 0 (deterministic).
        seed = 0 if req.seed is None or req.temperature <= 0 else req.seed & _MASK64
        key = xxhash.xxh3_64_intdigest(prompt_bytes, seed=seed)
        sample_key = key
        if req.seed is None and req.variation is not None and req.temperature > 0:
            sample_key = xxhash.xxh3_64_intdigest(prompt_bytes, seed=req.variation & _MASK64)
        stop_ids = frozenset() if req.ignore_eos else self._eos | req.stop_token_ids
        if req.min_new_tokens > 0 and stop_ids:
            blocked = self._excluded | {t for t in stop_ids if 0 <= t < self._vocab}
            if len(blocked) >= self._vocab:
                raise ValueError("min_new_tokens cannot be met: every token is a stop token")
        # Also keep the sequence within the KV pool, as SGLang clips to max_total_num_tokens.
        limit = (ctx if max_new is None else n + max_new, self._max_total_tokens)
        r = _Req(req, min(limit) - n, key, sample_key, stop_ids)
        self._reqs[req.rid] = r
        if req.pd == "decode":
            r.state = _AWAIT_KV
            self._awaiting_kv += 1
        else:
            self._waiting.append(r)

    def abort(self, rid: str, *, prefix: bool = True) -> list[str]:
        """Remove requests now, freeing their pages; returns the rids aborted.

        As SGLang's scheduler: every rid starting with ``rid`` (``prefix=False``: only an exact
        match); ``""`` aborts everything. Aborted requests produce no further output.
        """
        if rid == "":
            targets = list(self._reqs)
        elif prefix:
            targets = [r for r in self._reqs if r.startswith(rid)]
        else:
            targets = [rid] if rid in self._reqs else []
        if not targets:
            return []
        dropped_waiting = False
        dropped_ready = False
        for target in targets:
            r = self._reqs.pop(target)
            if r.state == _RUNNING:
                del self._running[target]
                self._release(r)
            elif r.state == _HELD:
                del self._held[target]
                self._release(r)
            elif r.state == _WAITING:
                dropped_waiting = True
            elif r.state == _KV_READY:
                dropped_ready = True
            else:
                self._awaiting_kv -= 1
            r.state = -1
        if dropped_waiting:
            self._waiting = deque(r for r in self._waiting if r.state == _WAITING)
        if dropped_ready:
            self._kv_ready = deque(r for r in self._kv_ready if r.state == _KV_READY)
        return targets

    def transfer_done(self, rid: str) -> RequestOutput | None:
        """PD prefill leg: its KV was sent; it ends with ``length`` 0 and no tokens.

        Returns that final output (None if the rid is unknown, e.g. already aborted).
        """
        r = self._reqs.get(rid)
        if r is None:
            return None
        if r.state != _HELD:
            raise ValueError(f"request {rid!r} is not a prefilled PD request awaiting transfer")
        del self._reqs[rid]
        del self._held[rid]
        self._release(r)
        return RequestOutput(rid, [], Finish("length", length=0), r.prompt_len, 0, max(r.cached_tokens, 0))

    def kv_received(self, rid: str) -> None:
        """PD decode leg: its prompt's KV arrived; it decodes once pages and a slot allow.

        Unknown rids (already aborted) are ignored.
        """
        r = self._reqs.get(rid)
        if r is None:
            return
        if r.state != _AWAIT_KV:
            raise ValueError(f"request {rid!r} is not a PD decode request awaiting its KV")
        self._awaiting_kv -= 1
        r.state = _KV_READY
        self._kv_ready.append(r)

    def flush_cache(self) -> list[KvEvent] | None:
        """Drop the whole prefix cache; returns the events to publish now.

        None, and nothing flushed, while any request is in flight (as SGLang refuses).
        """
        if self._reqs:
            return None
        self._cache.clear()
        return self._cache.drain_events()

    # -- stepping ------------------------------------------------------------------------

    def step(self) -> StepResult | None:
        """Run one forward pass; None when nothing can be computed now."""
        self._admit_transferred()
        batch = self._admit_waiting()
        if batch:
            seconds, outputs, prefill_done = self._prefill(batch)
            return StepResult(seconds, outputs, self._cache.drain_events(), prefill_done)
        if self._running:
            seconds, outputs = self._decode()
            return StepResult(seconds, outputs, self._cache.drain_events())
        return None

    def load(self) -> dict[str, int | float]:
        """SGLang ``GetLoad`` core keys for this rank.

        ``num_used_tokens`` counts pages referenced by requests; ``num_total_tokens`` adds the
        unreferenced cache. ``num_waiting_uncached_tokens`` is an upper bound: prefix hits are
        only looked up at admission.
        """
        cache = self._cache
        page = self._page
        max_total = self._max_total_tokens
        used = cache.active_pages * page
        cfg = self._config
        admitted = self._prompt_tokens_admitted
        return {
            "dp_rank": cfg.dp_rank,
            "num_running_reqs": len(self._running),
            "num_waiting_reqs": self.num_waiting,
            "num_waiting_uncached_tokens": sum(r.prompt_len + len(r.output) for r in self._waiting),
            "num_used_tokens": used,
            "num_total_tokens": cache.used_pages * page,
            "max_total_num_tokens": max_total,
            "max_running_requests": cfg.max_running_requests,
            "token_usage": round(used / max_total, 4),
            "cache_hit_rate": (round(self._cached_tokens_admitted / admitted, 4) if admitted else 0.0),
            "gen_throughput": 0.0,
            "utilization": round(len(self._running) / cfg.max_running_requests, 4),
        }

    # -- admission -----------------------------------------------------------------------

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self._page)

    def _fits(self, node: RadixNode, pages: int) -> bool:
        """Whether ``pages`` can be allocated after locking ``node``'s prefix."""
        cache = self._cache
        avail = cache.free_pages + cache.evictable_pages
        if pages > avail:
            return False
        if pages <= avail - node.depth:  # even if the whole prefix stops being evictable
            return True
        return pages <= avail - cache.unlocked_depth(node)

    def _reserve(self, admitting: int) -> int:
        """Pages kept free so the next decode step fits: one per request decoding then.

        ``admitting`` counts the requests joining the batch, this one included. Without the
        reserve, admission and retraction could chase each other; a request alone needs none
        (its whole sequence fits the pool by construction).
        """
        n = len(self._running) + admitting
        return n if n > 1 else 0

    def _admit_transferred(self) -> None:
        """Move PD decode legs whose KV arrived into the running batch (no compute)."""
        ready = self._kv_ready
        cache = self._cache
        cap = self._config.max_running_requests
        while ready and len(self._running) < cap:
            r = ready[0]
            # The prompt's KV came over the wire, less the last token, which the first decode
            # step feeds to sample output token 0.
            kv_len = r.prompt_len - 1
            _, node = cache.match_prefix(r.input_ids, kv_len)
            need = self._pages(kv_len) - node.depth
            if not self._fits(node, need + self._reserve(1)):
                break
            ready.popleft()
            cache.lock(node)
            if not cache.allocate(need):
                raise RuntimeError("radix cache refused pages it reported free")
            r.node = node
            r.private = need
            r.kv_len = kv_len
            r.cached_tokens = r.prompt_len
            r.state = _RUNNING
            self._running[r.rid] = r

    def _admit_waiting(self) -> list[_Req]:
        """FCFS admission while the running cap, the token budget and memory allow."""
        waiting = self._waiting
        if not waiting:
            return []
        cache = self._cache
        cap = self._config.max_running_requests
        budget = self._config.max_prefill_tokens
        epoch = cache.insert_count
        batch: list[_Req] = []
        while waiting and len(self._running) + len(batch) < cap:
            r = waiting[0]
            fill_len = r.prompt_len + len(r.output)
            node = r.match
            if node is None or node.evicted or r.match_epoch != epoch:
                # At least one token is computed, so the logits of the last one exist.
                _, node = cache.match_prefix(r.fill_ids(), fill_len - 1)
                r.match = node
                r.match_epoch = epoch
            cached = node.depth * self._page
            uncached = fill_len - cached
            if batch and uncached > budget:
                break
            need = self._pages(fill_len) - node.depth
            if not self._fits(node, need + self._reserve(len(batch) + 1)):
                break
            waiting.popleft()
            cache.lock(node)
            if not cache.allocate(need):
                raise RuntimeError("radix cache refused pages it reported free")
            r.match = None
            r.node = node
            r.private = need
            if r.cached_tokens < 0:
                r.cached_tokens = cached
                self._prompt_tokens_admitted += r.prompt_len
                self._cached_tokens_admitted += cached
            budget -= uncached
            batch.append(r)
        return batch

    # -- forward passes ------------------------------------------------------------------

    def _prefill(self, batch: list[_Req]) -> tuple[float, list[RequestOutput], list[str]]:
        uncached = 0
        for r in batch:
            assert r.node is not None
            uncached += r.prompt_len + len(r.output) - r.node.depth * self._page
        seconds = self._timing.prefill_seconds(uncached)
        outputs: list[RequestOutput] = []
        prefill_done: list[str] = []
        for r in batch:
            fill = r.fill_ids()
            r.kv_len = len(fill)
            self._cache_prefix(r, fill)
            if r.pd == "prefill":
                r.state = _HELD
                self._held[r.rid] = r
                prefill_done.append(r.rid)
                continue
            r.state = _RUNNING
            self._running[r.rid] = r
            out = self._next_token(r)
            outputs.append(out)
            if out.finish is not None:
                self._finish(r)
        return seconds, outputs, prefill_done

    def _decode(self) -> tuple[float, list[RequestOutput]]:
        page = self._page
        running = self._running
        cache = self._cache
        if page == 1:
            need = len(running)
        else:
            need = sum(1 for r in running.values() if r.kv_len % page == 0)
        if need and not cache.allocate(need):
            self._retract(need)
            if not running:
                return 0.0, []
        seconds = self._timing.decode_seconds(cache.active_pages / cache.capacity)
        outputs: list[RequestOutput] = []
        finished: list[_Req] = []
        next_token = self._next_token
        for r in running.values():
            if r.kv_len % page == 0:
                r.private += 1
            r.kv_len += 1
            out = next_token(r)
            outputs.append(out)
            if out.finish is not None:
                finished.append(r)
        for r in finished:
            self._finish(r)
        return seconds, outputs

    def _retract(self, need: int) -> None:
        """Send the newest running requests back to the queue until the rest can decode."""
        page = self._page
        cache = self._cache
        order = list(self._running.values())
        while order and not cache.can_allocate(need):
            r = order.pop()
            if r.kv_len % page == 0:
                need -= 1
            del self._running[r.rid]
            self._release(r)
            r.state = _WAITING
            r.kv_len = 0
            r.match = None
            self._waiting.appendleft(r)
        if order and not cache.allocate(need):
            raise RuntimeError("radix cache refused pages it reported free")

    def _next_token(self, r: _Req) -> RequestOutput:
        """Sample, append and check the stop conditions of ``r``'s next token."""
        output = r.output
        pos = len(output)
        if pos >= r.max_new:  # only a PD decode leg asking for 0 tokens gets here
            return RequestOutput(r.rid, [], Finish("length", length=pos), r.prompt_len, pos, r.cached_tokens)
        if r.script is not None:
            return self._scripted_token(r, r.script, pos)
        vocab = self._vocab
        excluded = self._excluded
        mask = r.mask if pos < r.min_new else ()
        step = (pos << 20) * _GOLDEN
        if r.sample_key == r.key:
            tok = _draw(r.key + step, vocab, excluded, mask)
        else:  # the key's token decides whether this step stops; the sample's, what it says otherwise
            stop = _draw(r.key + step, vocab, excluded, mask) if r.stop_ids else None
            tok = stop if stop in r.stop_ids else _draw(r.sample_key + step, vocab, excluded, r.stop_ids)
        output.append(tok)
        n = pos + 1
        finish: Finish | None = None
        if tok in r.stop_ids:
            finish = Finish("stop", matched=tok)
        elif r.stop_strs and self._decode_text is not None:
            text = self._decode_text(output[-r.stop_window :])
            for s in r.stop_strs:
                if s in text:
                    finish = Finish("stop", matched=s)
                    break
        if finish is None and n >= r.max_new:
            finish = Finish("length", length=n)
        return RequestOutput(r.rid, [tok], finish, r.prompt_len, n, r.cached_tokens)

    def _scripted_token(self, r: _Req, script: tuple[int, ...], pos: int) -> RequestOutput:
        """The script's next token (``script`` is ``r.script``); after the script, EOS (stop), or the length limit."""
        n = pos + 1
        if pos < len(script):
            tok = script[pos]
            finish = Finish("length", length=n) if n >= r.max_new else None
        elif self._eos and r.stop_ids:
            tok = min(self._eos)
            finish = Finish("stop", matched=tok)
        else:
            return RequestOutput(r.rid, [], Finish("length", length=pos), r.prompt_len, pos, r.cached_tokens)
        r.output.append(tok)
        return RequestOutput(r.rid, [tok], finish, r.prompt_len, n, r.cached_tokens)

    # -- memory --------------------------------------------------------------------------

    def _cache_prefix(self, r: _Req, fill: list[int]) -> None:
        """After a prefill: move the computed full pages into the cache and lock them."""
        cache = self._cache
        cache.free(r.private)
        node = cache.insert(fill)
        cache.lock(node)
        cache.unlock(r.node)  # type: ignore[arg-type]
        r.node = node
        r.private = self._pages(r.kv_len) - node.depth
        if not cache.allocate(r.private):
            raise RuntimeError("radix cache refused pages it reported free")

    def _finish(self, r: _Req) -> None:
        """A finished request frees its pages; its computed sequence stays cached."""
        del self._running[r.rid]
        del self._reqs[r.rid]
        cache = self._cache
        cache.free(r.private)
        r.private = 0
        cache.insert((r.input_ids + r.output)[: r.kv_len])
        cache.unlock(r.node)  # type: ignore[arg-type]
        r.node = None
        r.state = -1

    def _release(self, r: _Req) -> None:
        self._cache.free(r.private)
        r.private = 0
        if r.node is not None:
            self._cache.unlock(r.node)
            r.node = None


def _draw(base: int, vocab: int, excluded: frozenset[int], avoid: Collection[int]) -> int:
    """The token at `base` (a splitmix64 stream over the vocabulary), resampled past `excluded`
    and `avoid` ids."""
    attempt = 0
    while True:
        z = (base + attempt * _GOLDEN) & _MASK64
        z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
        z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
        tok = (z ^ (z >> 31)) % vocab
        if tok not in excluded and tok not in avoid:
            return tok
        attempt += 1
        if attempt > _MAX_RESAMPLES:
            raise RuntimeError("no sampleable token found")
