"""Prometheus metrics (`GET /metrics`), all named ``trio_direct_*``.

Counters and histograms are updated where things happen; engine health and KV-event counters are
read from the running frontend at scrape time (`FrontendCollector`), so they can never drift.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)
# The standard process_* (CPU, memory, open files, start time) and python_info series dashboards
# and alerts expect of any Python service.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


class Children:
    """A labelled metric's series, each looked up once: prometheus's `labels` validates, joins and
    locks on every call (1-2 µs; a generation request touches five). Only for metrics whose series
    are never removed; bounded, since label values may come from requests (model names)."""

    __slots__ = ("_metric", "_children")

    #: Distinct label values kept; past it the table starts over (lookups stay right, only slower).
    LIMIT = 4096

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[object, ...], Any] = {}

    def __call__(self, *values: object) -> Any:
        """`metric.labels(*values)`, in the order of the metric's label names."""
        child = self._children.get(values)
        if child is None:
            if len(self._children) >= self.LIMIT:
                self._children.clear()
            child = self._children[values] = self._metric.labels(*values)
        return child


class HistogramTally:
    """Observations of one histogram series (a `labels` child), tallied here and added to the
    series together: every `FLUSH_EVERY` observations, and at `flush`.

    For a series observed once per write of a stream (the inter-token gaps): prometheus's
    `observe` scans the buckets and takes two locks, ~1.9 µs, where tallying is one `bisect` and
    two additions, ~0.44 µs (`timeit`, one process). A scrape sees a stream's gaps up to `FLUSH_EVERY` writes late, and
    all of them once it flushes at its end. Not thread-safe: one task owns a tally.
    """

    __slots__ = ("_series", "_bounds", "_counts", "_sum", "_pending")

    FLUSH_EVERY = 64

    def __init__(self, series: Any) -> None:
        self._series = series
        #: The series' bucket bounds, the last +Inf: an amount goes to the first bound >= it.
        self._bounds: list[float] = series._upper_bounds
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = 0

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount
        self._pending += 1
        if self._pending >= self.FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Add what was tallied to the series (as many `observe` calls would have)."""
        if not self._pending:
            return
        series, counts = self._series, self._counts
        series._sum.inc(self._sum)
        for index, count in enumerate(counts):
            if count:
                series._buckets[index].inc(count)
                counts[index] = 0
        self._sum = 0.0
        self._pending = 0


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

REQUESTS = Counter(
    "trio_direct_requests", "Completion requests answered", ["model", "endpoint", "stream", "status"], registry=REGISTRY
)
IN_FLIGHT = Gauge("trio_direct_requests_in_flight", "Completion requests being served", registry=REGISTRY)


def requests_in_flight() -> float:
    """`IN_FLIGHT`'s value now (~2 us), without a scrape of the whole registry."""
    return next(iter(IN_FLIGHT.collect())).samples[0].value


TTFT = Histogram(
    "trio_direct_time_to_first_token_seconds", "Request arrival to first output written", ["model"],
    buckets=_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
INTER_TOKEN = Histogram(
    "trio_direct_inter_token_latency_seconds", "Gap between output writes of one stream", ["model"],
    buckets=_GAP_BUCKETS, registry=REGISTRY,
)  # fmt: skip
DURATION = Histogram(
    "trio_direct_request_duration_seconds", "Request arrival to its end", ["model", "endpoint"],
    buckets=_LATENCY_BUCKETS, registry=REGISTRY,
)  # fmt: skip
TOKENS = Counter("trio_direct_tokens", "Tokens by kind: input, output, cached", ["model", "kind"], registry=REGISTRY)
ROUTED = Counter(
    "trio_direct_routing_decisions", "Requests routed, by engine and role", ["engine", "role"], registry=REGISTRY
)
ABORTS = Counter("trio_direct_engine_aborts", "Abort RPCs sent to engines", ["outcome"], registry=REGISTRY)
RETRIES = Counter(
    "trio_direct_retries", "Requests retried on another engine before their first token", registry=REGISTRY
)
MIGRATIONS = Counter(
    "trio_direct_migrations", "Streams moved to another engine after their engine failed mid-stream, by outcome "
    "(migrated; refused: guided decoding or no engine left; exhausted: --migration-limit reached)", ["outcome"],
    registry=REGISTRY,
)  # fmt: skip
QUEUE_DEPTH = Gauge(
    "trio_direct_queue_depth", "Requests waiting for admission (--max-queued-requests)", registry=REGISTRY
)
_QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
QUEUE_WAIT = Histogram(
    "trio_direct_queue_wait_seconds", "Time requests waited in the admission queue", buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)  # fmt: skip
ADMISSION_REJECTIONS = Counter(
    "trio_direct_admission_rejections", "Requests refused at admission, by reason (limit: past --max-concurrent-requests "
    "and --max-queued-requests, 429; busy: every engine busy and the queue full, 429; timeout: --queue-timeout, 503; "
    "displaced: its place in a full queue went to a tenant with fewer waiting, 429)",
    ["reason"], registry=REGISTRY,
)  # fmt: skip
STALLED_ENGINES = Counter(
    "trio_direct_engine_stalls", "Engine calls ended because their engine sent nothing for --stream-idle-timeout",
    ["engine"], registry=REGISTRY,
)  # fmt: skip
#: Event-loop lag (`frontend/loop_lag.py`): 0.1 s is a bucket edge, the soak benchmark's stall target.
_LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1)
LOOP_LAG = Histogram(
    "trio_direct_event_loop_lag_seconds",
    "How late the event loop woke a timer (20 ms with requests in flight, 0.5 s without)",
    buckets=_LOOP_LAG_BUCKETS, registry=REGISTRY,
)  # fmt: skip
LOOP_LAG_MAX = Gauge("trio_direct_event_loop_lag_max_seconds", "Worst event-loop lag since start", registry=REGISTRY)
HTTP_CONNECTIONS = Gauge("trio_direct_http_connections", "Client connections open", registry=REGISTRY)
HTTP_CONNECTIONS_REFUSED = Counter(
    "trio_direct_http_connections_refused", "Client connections refused at --max-connections", registry=REGISTRY
)
HTTP_ACCEPT_ERRORS = Counter(
    "trio_direct_http_accept_errors", "Failed accepts for lack of resources (EMFILE, ENFILE, ...)", ["errno"],
    registry=REGISTRY,
)  # fmt: skip
HTTP_TIMEOUTS = Counter(
    "trio_direct_http_read_timeouts", "Connections closed for a stalled request head or body", ["phase"],
    registry=REGISTRY,
)  # fmt: skip
GC_FULL_COLLECTIONS = Counter(
    "trio_direct_gc_full_collections", "Full garbage-collector passes run on heap growth (frontend/gc_policy.py)",
    registry=REGISTRY,
)  # fmt: skip
STATE_STORE_UNAVAILABLE = Counter(
    "trio_direct_state_store_unavailable", "Requests answered 503 because the state store (--state-store) did not "
    "answer within --state-store-timeout or failed", registry=REGISTRY,
)  # fmt: skip
# Per tenant (`tenants`): the label is a tenant of --tenants-file (at most 100 names), "anonymous", or
# "other" (tenants named only by JWTs, names past the bound), so its values stay bounded.
TENANT_REQUESTS = Counter(
    "trio_direct_tenant_requests", "Generation requests admitted past the tenant's limits, by tenant", ["tenant"],
    registry=REGISTRY,
)  # fmt: skip
TENANT_TOKENS = Counter(
    "trio_direct_tenant_tokens", "Tokens by tenant and kind (input, output)", ["tenant", "kind"], registry=REGISTRY
)
TENANT_REFUSALS = Counter(
    "trio_direct_tenant_refusals", "Requests refused by tenant and reason (concurrent_requests, requests_per_minute, "
    "tokens_per_minute: the tenant's limits, 429; unauthorized: no valid key or token, 401, tenant 'other')",
    ["tenant", "reason"], registry=REGISTRY,
)  # fmt: skip
TENANT_QUEUE_WAIT = Histogram(
    "trio_direct_tenant_queue_wait_seconds", "Time requests waited in the admission queue, by tenant", ["tenant"],
    buckets=_QUEUE_BUCKETS, registry=REGISTRY,
)  # fmt: skip
HTTP_WRITE_TIMEOUTS = Counter(
    "trio_direct_http_write_timeouts", "Connections closed because a response write made no progress "
    "(a client that stopped reading; --client-write-timeout)", registry=REGISTRY,
)  # fmt: skip


class FrontendCollector(Collector):
    """Engine health, the KV index and KV-event counters, read from the frontend when scraped."""

    def __init__(self) -> None:
        self.frontend: Callable[[], Any] = lambda: None

    def collect(self) -> Iterator[Any]:
        frontend = self.frontend()
        if frontend is None:
            return
        pools = frontend.pools()
        health = GaugeMetricFamily(
            "trio_direct_engine_healthy", "1 when the engine is routable", labels=["model", "engine", "url", "role"]
        )
        for pool in pools:
            for engine in pool.fleet.engines:
                health.add_metric(
                    [pool.name, engine.id, engine.card.url, engine.card.role], 1.0 if engine.healthy else 0.0
                )
            for engine in pool.fleet.draining:  # leaving: finishes its requests, never routed to
                health.add_metric([pool.name, engine.id, engine.card.url, engine.card.role], 0.0)
            for pending in pool.fleet.pending:  # not up since start-up: role unknown until it joins
                health.add_metric([pool.name, pending.id, pending.url, "unknown"], 0.0)
        # Engines not in a pool yet (not up, or refused): model as their source names it, else "".
        for model, engine_id, url in frontend.waiting_engines():
            health.add_metric([model, engine_id, url, "unknown"], 0.0)
        yield health
        feeds = [(pool.name, pool.kv_feeds.stats()) for pool in pools if pool.kv_feeds is not None]
        if not feeds:
            return
        blocks = GaugeMetricFamily("trio_direct_kv_index_blocks", "Routing blocks in the KV index", labels=["model"])
        events = CounterMetricFamily(
            "trio_direct_kv_events", "KV-event subscription counters", labels=["model", "engine", "kind"]
        )
        for model, stats in feeds:
            index = stats.get("index") or {}
            blocks.add_metric([model], float(index.get("blocks", 0)))
            for engine, counters in stats.get("subscribers", {}).items():
                for kind, value in counters.items():
                    events.add_metric([model, engine, kind], float(value))
        yield blocks
        yield events


_COLLECTOR = FrontendCollector()
REGISTRY.register(_COLLECTOR)


def forget_engine(engine_id: str) -> None:
    """An engine left the fleet: its series of the counters kept here go too (those read from the
    frontend at scrape time go by themselves)."""
    for role in ("aggregated", "prefill", "decode"):
        try:
            ROUTED.remove(engine_id, role)
        except KeyError:
            pass


def watch_frontend(frontend: Callable[[], Any]) -> None:
    """The frontend whose engines and KV state `/metrics` reports (one per process)."""
    _COLLECTOR.frontend = frontend


def exposition() -> bytes:
    return generate_latest(REGISTRY)
