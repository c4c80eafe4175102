"""A bench run's results: a JSON document (settings, summary, every request) and PNG plots.

The summary and the series behind the plots are plain functions of a `BenchResult`. matplotlib is
optional (the `bench` extra): it is imported only to draw, and without it the JSON is still written
and `write_report` says why the plots are missing.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trio_direct.bench.runner import CAPPED_ERROR, BenchResult, LoadSample, RequestRecord

__all__ = [
    "PlottingUnavailable",
    "ReportFiles",
    "cache_hit_series",
    "cdf",
    "format_summary",
    "percentile",
    "results_document",
    "summarize",
    "write_plots",
    "write_report",
]


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(slots=True)
class ReportFiles:
    results: Path
    plots: list[Path] = field(default_factory=list)
    #: Why no plots were drawn (None when they were).
    plots_skipped: str | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0-100) by linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(values: Sequence[float], qs: Sequence[int]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for q in qs:
        value = percentile(values, q)
        out[f"p{q}"] = None if value is None else round(value * 1000.0, 3)
    out["mean"] = round(sum(values) / len(values) * 1000.0, 3) if values else None
    return out


def summarize(result: BenchResult) -> dict[str, Any]:
    """Counts, throughput, latency percentiles (ms) and the cached-token ratio of the successful requests.

    Requests the duration cap cancelled are counted apart from failures.
    """
    ok = [r for r in result.records if r.ok]
    capped = [r for r in result.records if r.error == CAPPED_ERROR]
    failed = [r for r in result.records if not r.ok and r.error != CAPPED_ERROR]
    elapsed = result.elapsed_s if result.elapsed_s > 0 else math.nan
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    cached_tokens = sum(r.cached_tokens or 0 for r in ok)
    kinds = Counter((r.error or f"HTTP {r.status}")[:120] for r in failed)

    def rate(amount: float) -> float | None:
        return None if math.isnan(elapsed) else round(amount / elapsed, 3)

    return {
        "planned": result.planned,
        "count": len(result.records),
        "completed": len(ok),
        "errors": len(failed),
        "cancelled_at_cap": len(capped),
        "error_kinds": dict(kinds.most_common(5)),
        "elapsed_s": round(result.elapsed_s, 3),
        "capped": result.capped,
        "requests_per_s": rate(len(ok)),
        "output_tokens_per_s": rate(output_tokens),
        "prompt_tokens_per_s": rate(prompt_tokens),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": cached_tokens,
        "cached_token_ratio": round(cached_tokens / prompt_tokens, 4) if prompt_tokens else None,
        "ttft_ms": _ms([r.ttft_s for r in ok if r.ttft_s is not None], (50, 90, 99)),
        "itl_ms": _ms([gap for r in ok for gap in r.itl_s], (50, 99)),
        "tpot_ms": _ms([t for r in ok if (t := r.tpot_s) is not None], (50, 99)),
        "e2e_ms": _ms([r.e2e_s for r in ok if r.e2e_s is not None], (50, 90, 99)),
    }


def _record_json(record: RequestRecord) -> dict[str, Any]:
    data = asdict(record)
    data["ok"] = record.ok
    data["tpot_s"] = record.tpot_s
    for key, value in data.items():  # microseconds are plenty, and keep a full trace's file small
        if isinstance(value, float):
            data[key] = round(value, 6)
    data["itl_s"] = [round(gap, 6) for gap in record.itl_s]
    return data


def _dumps(document: dict[str, Any]) -> str:
    """Indented JSON, except one line per request and per load sample (a full trace has thousands)."""
    parts = []
    for key, value in document.items():
        if isinstance(value, list):
            items = ",\n".join("  " + json.dumps(item, allow_nan=False) for item in value)
            text = f"[\n{items}\n ]" if value else "[]"
        else:
            text = json.dumps(value, indent=1, allow_nan=False).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def results_document(result: BenchResult, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything `results.json` holds."""
    return {
        "config": {"base_url": result.base_url, "model": result.model, **(config or {})},
        "summary": summarize(result),
        "requests": [_record_json(r) for r in result.records],
        "engine_load": [asdict(s) for s in result.engine_load],
    }


def cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and the fraction of values at or below each."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(i + 1) / n for i in range(n)]


def cache_hit_series(records: Sequence[RequestRecord], *, bins: int = 60) -> list[tuple[float, float]]:
    """(bin start in seconds, cached/prompt tokens) of the successful requests, binned by send time.

    Bins are at least a second wide; bins with no prompt tokens are left out.
    """
    sent = [(r.sent_at_s, r) for r in records if r.ok and r.sent_at_s is not None and r.prompt_tokens]
    if not sent:
        return []
    end = max(sent_at for sent_at, _ in sent)
    width = max(1.0, end / bins)
    cached: dict[int, int] = {}
    prompt: dict[int, int] = {}
    for sent_at, r in sent:
        slot = int(sent_at // width)
        cached[slot] = cached.get(slot, 0) + (r.cached_tokens or 0)
        prompt[slot] = prompt.get(slot, 0) + (r.prompt_tokens or 0)
    return [(slot * width, cached[slot] / prompt[slot]) for slot in sorted(prompt)]


def _load_by_engine(samples: Sequence[LoadSample]) -> dict[str, list[LoadSample]]:
    engines: dict[str, list[LoadSample]] = {}
    for sample in samples:
        engines.setdefault(sample.engine, []).append(sample)
    return engines


def plot_title(result: BenchResult, target: str | None = None) -> str:
    """What every plot is titled with: the model and the setup. `target` names an embedded fleet
    (engines, speed-up, router mode): its throwaway URL would make a kv run and a round-robin run
    look alike."""
    return f"{result.model} @ {target or result.base_url}"


def write_plots(result: BenchResult, out_dir: Path, target: str | None = None) -> list[Path]:
    """Draw the PNGs into `out_dir`; raises `PlottingUnavailable` without matplotlib.

    The engine-load plot is drawn only when load was sampled (embedded mode).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlottingUnavailable(
            "matplotlib is not installed, so no plots were drawn (pip install 'trio-direct[bench]')"
        ) from exc

    out_dir.mkdir(parents=True, exist_ok=True)
    ok = [r for r in result.records if r.ok]
    written: list[Path] = []

    def save(figure: Figure, name: str) -> None:
        FigureCanvasAgg(figure)
        figure.tight_layout()
        path = out_dir / name
        figure.savefig(path, dpi=110)
        written.append(path)

    title = plot_title(result, target)
    for name, label, values in (
        ("ttft_cdf.png", "time to first token (ms)", [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]),
        ("e2e_cdf.png", "end-to-end latency (ms)", [r.e2e_s * 1000 for r in ok if r.e2e_s is not None]),
    ):
        figure = Figure(figsize=(7, 4.5))
        axes = figure.add_subplot()
        xs, ys = cdf(values)
        axes.step(xs, ys, where="post")
        if xs and xs[0] > 0 and xs[-1] / xs[0] >= 100:
            axes.set_xscale("log")  # latencies that span orders of magnitude
        axes.set_xlabel(label)
        axes.set_ylabel("fraction of requests")
        axes.set_ylim(0, 1.02)
        axes.grid(True, alpha=0.3)
        axes.set_title(f"{label.split(' (')[0]} CDF, {len(values)} requests\n{title}", fontsize=9)
        save(figure, name)

    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    series = cache_hit_series(ok)
    axes.plot([t for t, _ in series], [ratio for _, ratio in series], marker=".")
    axes.set_xlabel("time since start (s), by request send time")
    axes.set_ylabel("cached / prompt tokens")
    axes.set_ylim(0, 1.02)
    axes.grid(True, alpha=0.3)
    axes.set_title(f"prefix-cache hit ratio over time\n{title}", fontsize=9)
    save(figure, "cache_hit_ratio.png")

    if result.engine_load:
        figure = Figure(figsize=(7, 4.5))
        axes = figure.add_subplot()
        for engine, samples in sorted(_load_by_engine(result.engine_load).items()):
            line = axes.plot([s.at_s for s in samples], [s.running for s in samples], label=f"{engine} running")[0]
            axes.plot(
                [s.at_s for s in samples],
                [s.waiting for s in samples],
                linestyle=":",
                color=line.get_color(),
                label=f"{engine} waiting",
            )
        axes.set_xlabel("time since start (s)")
        axes.set_ylabel("requests")
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        axes.set_title(f"per-engine load (GetLoad every 250 ms)\n{title}", fontsize=9)
        save(figure, "engine_load.png")
    return written


def write_report(result: BenchResult, out_dir: str | Path, config: dict[str, Any] | None = None) -> ReportFiles:
    """Write `results.json` and, when matplotlib is available, the plots."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(_dumps(results_document(result, config)))
    files = ReportFiles(results=path)
    try:
        target = (config or {}).get("target")
        files.plots = write_plots(result, out, target if isinstance(target, str) else None)
    except PlottingUnavailable as exc:
        files.plots_skipped = str(exc)
    return files


def format_summary(summary: dict[str, Any]) -> str:
    """A few human-readable lines of the summary."""

    def q(block: dict[str, float | None], *keys: str) -> str:
        return " ".join(f"{k}={_num(block.get(k))}" for k in keys)

    lines = [
        f"requests: {summary['completed']} completed, {summary['errors']} failed, "
        f"{summary['cancelled_at_cap']} cancelled at the cap, of {summary['planned']} planned "
        f"in {summary['elapsed_s']:.1f} s" + (" (duration cap reached)" if summary["capped"] else ""),
        f"throughput: {_num(summary['requests_per_s'])} req/s, {_num(summary['output_tokens_per_s'])} output tok/s, "
        f"{_num(summary['prompt_tokens_per_s'])} prompt tok/s",
        f"TTFT ms: {q(summary['ttft_ms'], 'p50', 'p90', 'p99')}",
        f"ITL ms: {q(summary['itl_ms'], 'p50', 'p99')}   TPOT ms: {q(summary['tpot_ms'], 'p50', 'p99')}",
        f"E2E ms: {q(summary['e2e_ms'], 'p50', 'p90', 'p99')}",
        f"cached-token ratio: {_num(summary['cached_token_ratio'])}",
    ]
    for kind, count in summary["error_kinds"].items():
        lines.append(f"  error x{count}: {kind}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
