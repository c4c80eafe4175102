"""A fair share of a full fleet: two tenants, one sending ten times the other's requests.

A `trio-direct serve` process with ``--max-concurrent-requests 16`` and a queue behind them, in
front of two `trio-direct mock-engine` processes at real speed; the load comes from this process
(the lean HTTP/1.1 client of `loadgen.py`, one keep-alive connection per request in flight). Tenant ``steady`` keeps 9 streamed requests in flight, tenant ``flood`` 90 (each
of weight 1). Three phases, in one run:

- **unloaded**: ``steady`` alone, its TTFT the reference;
- **fair**: both tenants, each with its own key: the admission line serves them by weight;
- **fifo**: both, with the same key (one tenant): the line is first come, first served, the baseline.

For each loaded phase it reports each tenant's share of the completed requests, its TTFT p50 and
p90 (TTFT includes the wait for a slot), and the slots each held over time; the check is the
issue's: under the fair line, ``steady``'s share is >= 0.4 and its TTFT p50 under 3x unloaded.
Writes ``tenant_fairness.json`` and ``tenant_fairness.png`` (slots and TTFT per tenant) to --out.

    python benchmarks/tenant_fairness_bench.py [--seconds 15] [--out benchmarks/results/tenant_fairness]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio
from loadgen import Children, SseConnection, free_port, wait_http

SLOTS = 16
STEADY, FLOOD = 9, 90
MAX_TOKENS = 24
MODEL = "tiny"
#: The start of each phase left out of the counts: both tenants' first requests arrive at once.
RAMP_UP_S = 2.0


def ramp_up(seconds: float) -> float:
    """The ramp-up of a phase of `seconds`: at most half of it, so that a short (smoke) run still
    counts requests and samples slots."""
    return min(RAMP_UP_S, seconds / 2)


@dataclass
class Tenant:
    name: str
    key: str
    in_flight: int
    ttft: list[float] = field(default_factory=list)
    #: Headers (admitted, dispatched) to the end of the stream.
    service: list[float] = field(default_factory=list)
    completed: int = 0
    failed: int = 0
    #: Requests being served now (headers received: past admission), sampled over time.
    serving: int = 0
    slots: list[tuple[float, int]] = field(default_factory=list)


async def one_client(port: int, tenant: Tenant, counted: tuple[float, float]) -> None:
    """One request in flight at a time, back to back, on one keep-alive connection, until the end of
    the `counted` window; only requests that end within it count (the ramp-up, and the requests
    still queued at the end, which finish after it, say nothing of the steady state)."""
    since, until = counted
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about fairness."}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
    }
    payload = json.dumps(body).encode()
    connection = SseConnection("127.0.0.1", port, [("Authorization", f"Bearer {tenant.key}")])
    try:
        while time.monotonic() < until:
            started = time.monotonic()
            state = {"first": None, "status": 0}

            def on_status(status: int, state: dict = state) -> None:
                state["status"] = status
                state["headers"] = time.monotonic()
                if status == 200:  # the headers come once the request is admitted and dispatched
                    tenant.serving += 1

            def on_records(records: list[bytes], state: dict = state, started: float = started) -> None:
                if state["first"] is None and any(record.startswith(b"data: {") for record in records):
                    state["first"] = time.monotonic() - started

            try:
                await connection.exchange("/v1/chat/completions", payload, on_status, on_records)
            finally:
                if state["status"] == 200:
                    tenant.serving -= 1
            ended = time.monotonic()
            if state["status"] == 200 and state["first"] is not None:
                if since <= ended <= until:
                    tenant.ttft.append(state["first"])
                    tenant.service.append(ended - state["headers"])
                    tenant.completed += 1
            else:
                tenant.failed += 1
                await trio.sleep(0.05)
    finally:
        await connection.aclose()


async def run_phase(port: int, tenants: list[Tenant], seconds: float) -> float:
    start = time.monotonic()
    until = start + seconds

    async def sample() -> None:
        while time.monotonic() < until:
            now = time.monotonic() - start
            for tenant in tenants:
                tenant.slots.append((now, tenant.serving))
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        for tenant in tenants:
            for _ in range(tenant.in_flight):
                nursery.start_soon(one_client, port, tenant, (start + ramp_up(seconds), until))
    return time.monotonic() - start


def queue_waits(port: int) -> dict[str, tuple[float, float]]:
    """Per tenant: (seconds waited in the admission queue, requests that waited), from /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for suffix, index in (("_sum", 0), ("_count", 1)):
            prefix = f'trio_direct_tenant_queue_wait_seconds{suffix}{{tenant="'
            if line.startswith(prefix):
                name = line[len(prefix) :].split('"', 1)[0]
                out.setdefault(name, [0.0, 0.0])[index] = float(line.rsplit(" ", 1)[1])
    return {name: (total, count) for name, (total, count) in out.items()}


def summary(tenants: list[Tenant], seconds: float) -> dict:
    total = sum(t.completed for t in tenants) or 1
    out = {}
    for tenant in tenants:
        ttft = sorted(tenant.ttft)
        out[tenant.name] = {
            "completed": tenant.completed,
            "failed": tenant.failed,
            "share": tenant.completed / total,
            "ttft_p50_ms": 1000 * statistics.median(ttft) if ttft else None,
            "ttft_p90_ms": 1000 * ttft[int(0.9 * (len(ttft) - 1))] if ttft else None,
            "service_p50_ms": 1000 * statistics.median(tenant.service) if tenant.service else None,
            "mean_slots": statistics.fmean(n for t, n in tenant.slots if t >= ramp_up(seconds))
            if tenant.slots
            else None,
        }
    return out


KEYS = {"steady": "key-steady", "flood": "key-flood"}


def write_tenants_file(out: Path) -> Path:
    """Two tenants of weight 1, no limits: only the fair line tells them apart."""
    out.mkdir(parents=True, exist_ok=True)
    tenants_file = out / "tenants.yaml"
    tenants = [
        {"name": name, "api_keys_sha256": [hashlib.sha256(key.encode()).hexdigest()], "weight": 1}
        for name, key in KEYS.items()
    ]
    tenants_file.write_text(json.dumps({"tenants": tenants}))
    return tenants_file


async def main_async(args: argparse.Namespace, out: Path, tenants_file: Path) -> int:
    keys = KEYS
    results: dict = {
        "queue": args.queue,
        "slots": SLOTS,
        "steady_in_flight": STEADY,
        "flood_in_flight": FLOOD,
        "seconds": args.seconds,
    }
    phases: dict[str, list[Tenant]] = {}
    with Children() as children:
        engines = [
            children.mock_engine("--speedup", str(args.speedup), "--seed", str(n), "--incremental-streaming-output")
            for n in range(2)
        ]
        port = free_port()
        children.start(
            [
                sys.executable, "-m", "trio_direct", "serve", "--port", str(port), "--log-level", "warning",
                *(arg for engine in engines for arg in ("--engine-url", f"grpc://127.0.0.1:{engine}")),
                "--served-model-name", MODEL, "--max-concurrent-requests", str(SLOTS),
                "--max-queued-requests", str(args.queue), "--queue-timeout", "120", "--tenants-file", str(tenants_file),
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        await trio.to_thread.run_sync(wait_http, port)
        await run_phase(
            port, [Tenant("steady", keys["steady"], STEADY)], min(2.0, args.seconds)
        )  # warm: connections, caches
        phases["unloaded"] = [Tenant("steady", keys["steady"], STEADY)]
        await run_phase(port, phases["unloaded"], args.seconds)
        phases["fair"] = [Tenant("steady", keys["steady"], STEADY), Tenant("flood", keys["flood"], FLOOD)]
        before = await trio.to_thread.run_sync(queue_waits, port)
        await run_phase(port, phases["fair"], args.seconds)
        after = await trio.to_thread.run_sync(queue_waits, port)
        results["fair_queue_wait_mean_ms"] = {
            name: 1000
            * (after[name][0] - before.get(name, (0, 0))[0])
            / max(1, after[name][1] - before.get(name, (0, 0))[1])
            for name in after
        }
        phases["fifo"] = [Tenant("steady", keys["steady"], STEADY), Tenant("flood", keys["steady"], FLOOD)]
        await run_phase(port, phases["fifo"], args.seconds)
    for name, tenants in phases.items():
        results[name] = summary(tenants, args.seconds)
    unloaded = results["unloaded"]["steady"]["ttft_p50_ms"]
    fair = results["fair"]["steady"]

    def vs_unloaded(ttft: float | None) -> float | None:
        """A phase's TTFT over the unloaded one; None where a phase completed no request of the
        steady tenant (a phase too short for the load, as a smoke run's is)."""
        return ttft / unloaded if ttft is not None and unloaded else None

    results["check"] = {
        "steady_share_fair": fair["share"],
        "steady_share_fifo": results["fifo"]["steady"]["share"],
        "steady_ttft_p50_vs_unloaded_fair": vs_unloaded(fair["ttft_p50_ms"]),
        "steady_ttft_p50_vs_unloaded_fifo": vs_unloaded(results["fifo"]["steady"]["ttft_p50_ms"]),
    }
    fair_ratio = results["check"]["steady_ttft_p50_vs_unloaded_fair"]
    passed = fair["share"] >= 0.4 and fair_ratio is not None and fair_ratio < 3
    results["check"]["passed"] = passed
    await trio.to_thread.run_sync(write_results, out, phases, results)
    print(
        f"{'phase':9s} {'tenant':7s} {'done':>6s} {'share':>6s} {'slots':>6s} {'TTFT p50':>9s} {'p90':>8s} {'service':>10s} {'failed':>6s}"
    )
    for name in ("unloaded", "fair", "fifo"):
        for tenant, row in results[name].items():
            print(
                f"{name:9s} {tenant:7s} {row['completed']:6d} {row['share']:6.2f} {row['mean_slots'] or 0:6.1f} "
                f"{_num(row['ttft_p50_ms'], 7, 0)}ms {_num(row['ttft_p90_ms'], 6, 0)}ms "
                f"{_num(row['service_p50_ms'], 8, 0)}ms {row['failed']:6d}"
            )
    check = results["check"]
    waits = results.get("fair_queue_wait_mean_ms", {})
    print("fair: mean wait in the admission queue " + ", ".join(f"{k} {v:.0f} ms" for k, v in waits.items()))
    print(
        f"steady: share {check['steady_share_fair']:.2f} fair vs {check['steady_share_fifo']:.2f} fifo; TTFT p50 "
        f"{_num(check['steady_ttft_p50_vs_unloaded_fair'], 0, 2)}x unloaded fair vs "
        f"{_num(check['steady_ttft_p50_vs_unloaded_fifo'], 0, 2)}x fifo -> {'PASS' if passed else 'FAIL'}"
    )
    return 0  # a figure, not a test: the line above says whether the check held


def _num(value: float | None, width: int, digits: int) -> str:
    """A figure for the table; "-" where a phase had no request to measure."""
    return f"{value:{width}.{digits}f}" if value is not None else "-".rjust(width)


def write_results(out: Path, phases: dict[str, list[Tenant]], results: dict) -> None:
    (out / "tenant_fairness.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(phases, results, out / "tenant_fairness.png")


def plot(phases: dict[str, list[Tenant]], results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, name in zip(axes[:2], ("fair", "fifo"), strict=True):
        for tenant in phases[name]:
            ax.plot([t for t, _ in tenant.slots], [n for _, n in tenant.slots], label=tenant.name)
        ax.axhline(SLOTS / 2, color="grey", linestyle=":", linewidth=1)
        ax.set(title=f"slots held ({name} line)", xlabel="seconds", ylabel="requests being served", ylim=(0, SLOTS + 1))
        ax.legend()
    labels, data = [], []
    for name in ("unloaded", "fair", "fifo"):
        for tenant in phases[name]:
            labels.append(f"{tenant.name}\n{name}")
            data.append([1000 * x for x in tenant.ttft] or [0])
    axes[2].boxplot(data, showfliers=False)
    axes[2].set_xticks(range(1, len(labels) + 1), labels)
    axes[2].set(title="TTFT per tenant (incl. queue wait)", ylabel="ms", yscale="log")
    figure.suptitle(
        f"{SLOTS} slots; steady keeps {STEADY} in flight, flood {FLOOD}: steady's share "
        f"{results['check']['steady_share_fair']:.2f} fair, {results['check']['steady_share_fifo']:.2f} fifo"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument("--speedup", type=float, default=1.0, help="the mock engines' --mock-speedup")
    parser.add_argument("--queue", type=int, default=512, help="--max-queued-requests (below 83 the flood fills it)")
    parser.add_argument("--out", default="benchmarks/results/tenant_fairness")
    args = parser.parse_args()
    out = Path(args.out)
    sys.exit(trio.run(main_async, args, out, write_tenants_file(out)))


if __name__ == "__main__":
    main()
