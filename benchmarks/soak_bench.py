"""Soak: many concurrent streams held for a minute; does the frontend's memory grow, does its loop stall?

Issue #7 §5: 1,000 concurrent streaming chat requests for 60 s through `trio-direct serve` against
`--speedup` mock engines (separate processes), after a warm-up; targets: resident memory growth
under 5 % after warm-up, worst event-loop stall under 100 ms.

Each of `--concurrency` client slots holds one keep-alive HTTP/1.1 connection and re-issues a
streaming request as soon as the last one ends; `max_tokens` is drawn per request, so streams end at
different times. The client is one trio process on raw sockets (h11), parsing only what it must
(the end of the stream, error events, the usage chunk): httpx would be the bottleneck at 1,000.

Measured over the window after the warm-up: the frontend's RSS every second (/proc VmRSS), CPU of
every process, and from the frontend's /metrics (scraped at the window's start and end) the
event-loop lag histogram (`frontend/loop_lag.py`), the worst-lag gauge and the request counters.

    python benchmarks/soak_bench.py [--concurrency 1000] [--duration 60] [--warmup 15] [--speedup 0.3]

The mock engines accept 100 concurrent HTTP/2 streams per connection (h2's default), so with the
default 2 engines only ~200 of the 1,000 streams generate at a time; `--engines 12` lets all of
them (benchmarks/README.md, "Soak").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from loadgen import REPO, Children, SseConnection, cpu_seconds, free_port, wait_http

#: `--diagnose`: the frontend runs under this wrapper, which logs (to its stderr) every garbage
#: collection over 20 ms and every time a watchdog thread could not run for 100 ms, with the process
#: CPU time used meanwhile (about the gap: the main thread held the GIL; near 0: the OS descheduled
#: the process) and where the main thread was then. On SIGUSR1 it logs how many objects the collector
#: tracks per generation; with SOAK_GC_FREEZE=1 it first calls `gc.freeze()` (`--gc-freeze`: what
#: freezing the start-up heap would gain).
DIAGNOSE_WRAPPER = r"""
import gc, runpy, sys, threading, time, traceback
def stamp():
    return time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"
started = {}
def on_gc(phase, info):
    if phase == "start":
        started["t"] = time.perf_counter()
    elif "t" in started:
        took = time.perf_counter() - started.pop("t")
        if took > 0.02:
            print(f"{stamp()} SOAK-DIAG gc gen{info['generation']} {took * 1e3:.0f} ms, {info['collected']} collected",
                  file=sys.stderr, flush=True)
gc.callbacks.append(on_gc)
main = threading.main_thread().ident
def watch():
    last, last_cpu = time.perf_counter(), time.process_time()
    while True:
        time.sleep(0.01)
        now, cpu = time.perf_counter(), time.process_time()
        if now - last > 0.1:
            frame = sys._current_frames().get(main)
            stack = "".join(traceback.format_stack(frame, limit=8)) if frame is not None else ""
            print(f"{stamp()} SOAK-DIAG watchdog stalled {(now - last) * 1e3:.0f} ms, process CPU meanwhile "
                  f"{(cpu - last_cpu) * 1e3:.0f} ms; main thread at:\n{stack}", file=sys.stderr, flush=True)
        last, last_cpu = now, cpu
threading.Thread(target=watch, daemon=True).start()
import os, signal
def on_usr1(signum, frame):
    if os.environ.get("SOAK_GC_FREEZE") and not gc.get_freeze_count():
        gc.collect()
        gc.freeze()
    tracked = [len(gc.get_objects(generation)) for generation in range(3)]
    print(f"{stamp()} SOAK-DIAG gc objects by generation {tracked}, frozen {gc.get_freeze_count()}, "
          f"thresholds {gc.get_threshold()}, allocated blocks {sys.getallocatedblocks()}", file=sys.stderr, flush=True)
    from collections import Counter
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    for kind, count in kinds.most_common(40):
        print(f"{stamp()} SOAK-DIAG   {count:8d} {kind}", file=sys.stderr, flush=True)
signal.signal(signal.SIGUSR1, on_usr1)
if os.environ.get("SOAK_GC_THRESHOLD"):
    gc.set_threshold(*map(int, os.environ["SOAK_GC_THRESHOLD"].split(",")))
sys.argv = ["trio_direct", *sys.argv[1:]]
runpy.run_module("trio_direct", run_name="__main__", alter_sys=True)
"""

RSS_GROWTH_TARGET = 5.0  # percent, after warm-up
STALL_TARGET = 0.1  # seconds; a bucket edge of trio_direct_event_loop_lag_seconds


# ---- the load ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Load:
    """What the client saw, counted from the moment `measuring` is set."""

    measuring: bool = False
    stopping: bool = False
    in_flight: int = 0
    completed: int = 0
    tokens: int = 0
    errors: Counter = field(default_factory=Counter)
    completed_total: int = 0


class StreamSlot(SseConnection):
    """One keep-alive connection that streams one chat request after another, reading only what the
    soak counts ([DONE], error events, the usage chunk), so that 1,000 of them fit in one client."""

    async def stream(self, payload: bytes) -> tuple[str | None, int]:
        """POST one streaming request and read it to its end: (error kind or None, completion tokens)."""
        error: str | None = None
        done, tokens = False, 0

        def on_status(status: int) -> None:
            nonlocal error
            if status != 200:
                error = f"http {status}"

        def on_records(records: list[bytes]) -> None:
            nonlocal error, done, tokens
            for record in records:
                if record == b"data: [DONE]":
                    done = True
                elif b'"completion_tokens"' in record:
                    usage = json.loads(record.removeprefix(b"data: ")).get("usage") or {}
                    tokens = usage.get("completion_tokens", tokens)
                elif record.startswith(b'data: {"error"'):
                    error = error or "error event"

        if not await self.exchange("/v1/chat/completions", payload, on_status, on_records):
            return error or "connection closed", tokens
        return (error or (None if done else "no [DONE]")), tokens


def request_payload(model: str, rng: random.Random, min_tokens: int, max_tokens: int) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Story {rng.randrange(1 << 30)}: tell me about routers."}],
            "max_tokens": rng.randint(min_tokens, max_tokens),
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def slot_loop(index: int, load: Load, args: argparse.Namespace, port: int, model: str) -> None:
    rng = random.Random(index)
    await trio.sleep(args.ramp * index / args.concurrency)  # do not open 1,000 connections in one tick
    slot = StreamSlot("127.0.0.1", port)
    try:
        while not load.stopping:
            load.in_flight += 1
            try:
                error, tokens = await slot.stream(request_payload(model, rng, args.min_tokens, args.max_tokens))
            except (OSError, trio.BrokenResourceError, h11.ProtocolError) as failure:
                error, tokens = type(failure).__name__, 0
                await slot.aclose()
            finally:
                load.in_flight -= 1
            if load.stopping:
                return
            load.completed_total += 1
            if load.measuring:
                if error is None:
                    load.completed += 1
                    load.tokens += tokens
                else:
                    load.errors[error] += 1
            if error is not None:
                await trio.sleep(0.1)  # no hot retry loop against a failing server
    finally:
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 2):
            await slot.aclose()


# ---- what the frontend reports ----------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def scrape(port: int) -> dict:
    """The frontend's loop-lag histogram, worst-lag gauge and request counters."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    buckets: dict[float, float] = {}
    figures: dict = {"requests": Counter(), "buckets": buckets, "lag_max": 0.0, "lag_count": 0.0, "lag_sum": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "trio_direct_event_loop_lag_seconds_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name == "trio_direct_event_loop_lag_seconds_count":
                figures["lag_count"] = sample.value
            elif sample.name == "trio_direct_event_loop_lag_seconds_sum":
                figures["lag_sum"] = sample.value
            elif sample.name == "trio_direct_event_loop_lag_max_seconds":
                figures["lag_max"] = sample.value
            elif sample.name == "trio_direct_requests_total":
                figures["requests"][sample.labels["status"]] += sample.value
    return figures


def lag_in_window(start: dict, end: dict) -> dict:
    """Loop-lag figures of the window from two scrapes: the histogram's difference, and the gauge
    (the worst since start: if it rose during the window, its new value is the window's worst)."""
    edges = sorted(end["buckets"])
    delta = [end["buckets"][le] - start["buckets"].get(le, 0.0) for le in edges]
    count = end["lag_count"] - start["lag_count"]
    over_target = count - delta[edges.index(STALL_TARGET)]
    p99_bound = next((le for le, below in zip(edges, delta) if below >= 0.99 * count), float("inf"))
    worst_bound = next((le for le, below in zip(edges, delta) if below >= count), float("inf"))
    worst = end["lag_max"] if end["lag_max"] > start["lag_max"] else min(worst_bound, start["lag_max"])
    return {
        "samples": int(count),
        "mean_ms": round((end["lag_sum"] - start["lag_sum"]) / count * 1e3, 3) if count else None,
        "p99_at_most_ms": p99_bound * 1e3,
        "worst_ms": round(worst * 1e3, 1),
        "worst_is_exact": end["lag_max"] > start["lag_max"],
        "samples_over_target": int(over_target),
        "worst_since_start_ms": round(end["lag_max"] * 1e3, 1),
        "histogram_delta": {str(le): int(d) for le, d in zip(edges, delta)},
    }


# ---- the run ----------------------------------------------------------------------------------------


async def soak(args: argparse.Namespace, port: int, model: str, pids: dict[str, list[int]]) -> dict:
    load = Load()
    frontend = pids["frontend"][0]
    rss: list[tuple[float, int]] = []
    in_flight: list[int] = []
    #: per second: [t, streams in flight, CPU seconds used by the frontend, the engines, the client]
    timeline: list[list] = []
    marks: dict = {}

    def cpu() -> dict[str, float]:
        return {role: sum(cpu_seconds(pid) for pid in ids) for role, ids in pids.items()} | {"client": cpu_seconds(os.getpid())}

    async with trio.open_nursery() as nursery:
        for index in range(args.concurrency):
            nursery.start_soon(slot_loop, index, load, args, port, model)
        start = trio.current_time()
        next_tick = start
        last_cpu = cpu()
        while True:
            next_tick += 1.0
            await trio.sleep_until(next_tick)
            elapsed = trio.current_time() - start
            rss.append((round(elapsed, 1), rss_kib(frontend)))
            now_cpu = cpu()
            timeline.append([round(elapsed), load.in_flight, *(round(now_cpu[r] - last_cpu[r], 2) for r in now_cpu)])
            last_cpu = now_cpu
            if load.measuring:
                in_flight.append(load.in_flight)
            if not load.measuring and elapsed >= args.warmup:
                if args.diagnose:
                    # The heap by type, to compare with the end's. Listing it holds the frontend's loop
                    # for ~0.3 s at 1,000 streams, so it is taken before the window opens.
                    os.kill(frontend, signal.SIGUSR1)
                    await trio.sleep(3)
                    next_tick = trio.current_time()
                    rss.append((round(trio.current_time() - start, 1), rss_kib(frontend)))
                marks["warm"] = (await trio.to_thread.run_sync(scrape, port), cpu(), time.perf_counter(), len(rss) - 1)
                load.measuring = True
                print(f"warm-up done: {load.in_flight} streams in flight, RSS {rss[-1][1] / 1024:.1f} MiB", flush=True)
            elif load.measuring and elapsed >= args.warmup + args.duration:
                marks["end"] = (await trio.to_thread.run_sync(scrape, port), cpu(), time.perf_counter(), len(rss) - 1)
                if args.diagnose:
                    os.kill(frontend, signal.SIGUSR1)
                    await trio.sleep(5)  # it lists the heap while the streams are still open
                break
            elif int(elapsed) % 5 == 0:
                print(
                    f"  t={elapsed:5.0f}s  in flight {load.in_flight:5d}  RSS {rss[-1][1] / 1024:7.1f} MiB  "
                    f"CPU frontend {timeline[-1][2]:.2f} engines {timeline[-1][3]:.2f} client {timeline[-1][4]:.2f}",
                    flush=True,
                )
        load.stopping = True
        nursery.cancel_scope.cancel()

    (warm_metrics, warm_cpu, warm_at, warm_index), (end_metrics, end_cpu, end_at, end_index) = marks["warm"], marks["end"]
    window = end_at - warm_at
    rss_warm, rss_end = rss[warm_index][1], rss[end_index][1]
    window_rss = [kib for _, kib in rss[warm_index : end_index + 1]]
    growth = (rss_end - rss_warm) / rss_warm * 100
    lag = lag_in_window(warm_metrics, end_metrics)
    cores = {role: round((end_cpu[role] - warm_cpu[role]) / window, 2) for role in end_cpu}
    requests = {status: int(end_metrics["requests"][status] - warm_metrics["requests"].get(status, 0)) for status in end_metrics["requests"]}
    return {
        "window_s": round(window, 1),
        "streams_in_flight": {"min": min(in_flight), "mean": round(sum(in_flight) / len(in_flight), 1)},
        "requests_completed": load.completed,
        "errors": sum(load.errors.values()),
        "error_kinds": dict(load.errors),
        "frontend_requests_by_status": requests,
        "tokens_per_s": round(load.tokens / window, 1),
        "rss_warm_mib": round(rss_warm / 1024, 1),
        "rss_end_mib": round(rss_end / 1024, 1),
        "rss_max_in_window_mib": round(max(window_rss) / 1024, 1),
        "rss_growth_pct": round(growth, 2),
        "loop_lag": lag,
        "cpu_cores": cores,
        "client_saturated": cores["client"] >= 0.9,
        "rss_series_kib": rss,
        "timeline": {"columns": ["t_s", "in_flight", "cpu_frontend", "cpu_engines", "cpu_client"], "rows": timeline},
        "pass": {
            "rss_growth": growth < RSS_GROWTH_TARGET,
            "loop_stall": lag["samples_over_target"] == 0,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=1000, help="streams held open at once")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds after the warm-up")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (includes --ramp)")
    parser.add_argument("--ramp", type=float, default=5.0, help="seconds over which the slots open their first stream")
    parser.add_argument("--speedup", default="0.3", help="mock engines' --speedup (1 = real-time step model)")
    parser.add_argument("--engines", type=int, default=2, help="mock engine processes")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--num-blocks", type=int, default=1_000_000, help="mock KV pages: room for every stream")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/soak/soak.json")
    parser.add_argument("--diagnose", action="store_true", help="log GC pauses and GIL stalls of the frontend (see DIAGNOSE_WRAPPER)")
    parser.add_argument(
        "--gc-threshold",
        help="with --diagnose: gc.set_threshold(...) in the frontend, e.g. 20000,20,100 (its GC policy then "
        "sets its own; add --frontend-arg=--gc-full-collection-growth=0 to keep these)",
    )
    parser.add_argument("--gc-freeze", action="store_true", help="with --diagnose: gc.freeze() the frontend once it is up")
    parser.add_argument("--frontend-arg", action="append", default=[], help="extra `trio-direct serve` argument")
    args = parser.parse_args()

    load_before = os.getloadavg()
    with Children() as children, tempfile.NamedTemporaryFile("w+", suffix=".log") as frontend_log:
        engine_args = [
            "--speedup", args.speedup, "--incremental-streaming-output", "--log-level", "warning",
            "--max-running-requests", str(args.concurrency), "--num-blocks", str(args.num_blocks),
        ]  # fmt: skip
        ports = [children.mock_engine(*engine_args) for _ in range(args.engines)]
        port = free_port()
        launcher = ["-c", DIAGNOSE_WRAPPER] if args.diagnose else ["-m", "trio_direct"]
        command = [
            sys.executable, *launcher, "serve", "--port", str(port), "--log-level", "warning",
            "--max-concurrent-requests", "0", *(f"--engine-url=127.0.0.1:{p}" for p in ports), *args.frontend_arg,
        ]  # fmt: skip
        env = os.environ | ({"SOAK_GC_FREEZE": "1"} if args.gc_freeze else {})
        if args.gc_threshold:
            env["SOAK_GC_THRESHOLD"] = args.gc_threshold
        frontend = children.start(command, stdout=frontend_log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_http(port)
        except RuntimeError:
            frontend_log.seek(0)
            sys.stderr.write("".join(frontend_log.readlines()[-30:]))
            raise
        if args.diagnose:
            os.kill(frontend.pid, signal.SIGUSR1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            model = json.load(response)["data"][0]["id"]
        pids = {"frontend": [frontend.pid], "engines": [p.pid for p in children.processes[: args.engines]]}
        print(
            f"soak: {args.concurrency} streams, {args.warmup:g} s warm-up + {args.duration:g} s, "
            f"{args.engines} mock engines at --speedup {args.speedup}, max_tokens {args.min_tokens}-{args.max_tokens}",
            flush=True,
        )
        result = trio.run(soak, args, port, model, pids)
        frontend_log.seek(0)
        warnings = [line.rstrip() for line in frontend_log if "WARNING" in line or "ERROR" in line]
        if args.diagnose:
            frontend_log.seek(0)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".frontend.log").write_text(frontend_log.read())

    result = {
        "command": " ".join(["python", "benchmarks/soak_bench.py", *sys.argv[1:]]),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "frontend_log_warnings": warnings[:50],
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    lag = result["loop_lag"]
    verdict = {True: "PASS", False: "FAIL"}
    print(
        f"\nwindow {result['window_s']} s, streams in flight min {result['streams_in_flight']['min']} "
        f"mean {result['streams_in_flight']['mean']}\n"
        f"requests completed {result['requests_completed']}, errors {result['errors']} {result['error_kinds'] or ''}\n"
        f"tokens/s {result['tokens_per_s']}\n"
        f"RSS {result['rss_warm_mib']} MiB after warm-up -> {result['rss_end_mib']} MiB at end "
        f"(max {result['rss_max_in_window_mib']}): {result['rss_growth_pct']:+.2f} %  "
        f"[{verdict[result['pass']['rss_growth']]} < {RSS_GROWTH_TARGET:g} %]\n"
        f"loop lag: worst {'' if lag['worst_is_exact'] else '<= '}{lag['worst_ms']} ms, p99 <= {lag['p99_at_most_ms']:g} ms, "
        f"mean {lag['mean_ms']} ms, {lag['samples_over_target']} of {lag['samples']} wake-ups over "
        f"{STALL_TARGET * 1e3:g} ms  [{verdict[result['pass']['loop_stall']]}]\n"
        f"CPU cores used: {result['cpu_cores']}"
        + ("  (the client saturates a core: the load is client-bound)" if result["client_saturated"] else "")
        + f"\nload average before {load_before}, after {result['machine']['loadavg_after']}\n"
        f"frontend warnings: {len(warnings)}\nwritten: {args.out}"
    )


if __name__ == "__main__":
    main()
