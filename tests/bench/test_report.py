"""The results document and the plots."""

from __future__ import annotations

import json
import sys

import pytest

from trio_direct.bench.report import (
    cache_hit_series,
    cdf,
    format_summary,
    percentile,
    plot_title,
    results_document,
    summarize,
    write_report,
)
from trio_direct.bench.runner import CAPPED_ERROR, BenchResult, LoadSample, RequestRecord


def record(index, *, sent, ttft=0.1, e2e=1.0, prompt=1000, cached=0, output=11, error=None, status=200):
    return RequestRecord(
        index=index,
        scheduled_at_s=sent,
        input_length=prompt,
        max_tokens=output,
        sent_at_s=sent,
        status=status,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=[0.05, 0.15] if error is None else [],
        prompt_tokens=prompt,
        output_tokens=output,
        cached_tokens=cached,
        finish_reason="length",
        error=error,
    )


@pytest.fixture
def result():
    records = [
        record(0, sent=0.0, ttft=0.1, e2e=1.1, cached=0),
        record(1, sent=0.5, ttft=0.2, e2e=1.2, cached=500),
        record(2, sent=2.0, ttft=0.3, e2e=1.3, cached=1000),
        record(3, sent=2.5, error="HTTP 503: overloaded", status=503),
        record(4, sent=3.0, error=CAPPED_ERROR),
    ]
    load = [
        LoadSample(at_s=t / 4, engine=f"engine{e}", running=e + t, waiting=0, used_tokens=10)
        for t in range(8)
        for e in range(2)
    ]
    return BenchResult(
        base_url="http://127.0.0.1:1",
        model="m",
        records=records,
        planned=6,
        elapsed_s=4.0,
        capped=True,
        engine_load=load,
    )


def test_percentiles_interpolate_between_ranks():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 0) == 1.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_the_summary_counts_failures_apart_from_the_duration_cap(result):
    summary = summarize(result)
    assert (summary["planned"], summary["count"], summary["completed"]) == (6, 5, 3)
    assert (summary["errors"], summary["cancelled_at_cap"], summary["capped"]) == (1, 1, True)
    assert summary["error_kinds"] == {"HTTP 503: overloaded": 1}
    assert summary["requests_per_s"] == 0.75
    assert summary["output_tokens_per_s"] == 33 / 4
    assert summary["cached_token_ratio"] == 0.5
    assert summary["ttft_ms"]["p50"] == 200.0
    assert summary["e2e_ms"]["p90"] == pytest.approx(1280.0)
    assert summary["itl_ms"]["p50"] == pytest.approx(100.0)
    assert summary["tpot_ms"]["p50"] == 100.0  # (1.2 - 0.2) / 10


def test_the_summary_of_an_empty_run_has_no_numbers():
    summary = summarize(BenchResult(base_url="u", model="m", records=[], planned=0, elapsed_s=0.0))
    assert summary["completed"] == 0 and summary["requests_per_s"] is None
    assert summary["ttft_ms"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert summary["cached_token_ratio"] is None
    assert "requests: 0 completed" in format_summary(summary)


def test_the_results_document_holds_config_summary_requests_and_load(result):
    document = results_document(result, {"router_mode": "kv"})
    assert set(document) == {"config", "summary", "requests", "engine_load"}
    assert document["config"] == {"base_url": "http://127.0.0.1:1", "model": "m", "router_mode": "kv"}
    assert [r["index"] for r in document["requests"]] == [0, 1, 2, 3, 4]
    assert document["requests"][1]["ok"] is True and document["requests"][3]["ok"] is False
    keys = {"ttft_s", "e2e_s", "itl_s", "cached_tokens", "prompt_tokens", "tpot_s", "error"}
    assert set(document["requests"][0]) >= keys
    assert len(document["engine_load"]) == 16
    json.dumps(document, allow_nan=False)


def test_cache_hits_are_binned_by_send_time(result):
    assert cache_hit_series(result.records, bins=60) == [(0.0, 0.25), (2.0, 1.0)]
    assert cdf([3.0, 1.0]) == ([1.0, 3.0], [0.5, 1.0])


def test_the_report_writes_json_and_all_four_plots(tmp_path, result):
    pytest.importorskip("matplotlib")
    files = write_report(result, tmp_path / "out", {"router_mode": "round-robin"})
    assert files.plots_skipped is None
    assert json.loads(files.results.read_text())["summary"]["completed"] == 3
    names = sorted(p.name for p in files.plots)
    assert names == ["cache_hit_ratio.png", "e2e_cdf.png", "engine_load.png", "ttft_cdf.png"]
    for plot in files.plots:
        assert plot.read_bytes().startswith(b"\x89PNG")


def test_without_engine_load_there_is_no_load_plot(tmp_path, result):
    pytest.importorskip("matplotlib")
    result.engine_load = []
    files = write_report(result, tmp_path)
    assert "engine_load.png" not in {p.name for p in files.plots} and len(files.plots) == 3


def test_without_matplotlib_the_json_is_written_and_the_reason_given(tmp_path, result, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    files = write_report(result, tmp_path)
    assert files.results.is_file() and files.plots == []
    assert files.plots_skipped is not None and "matplotlib is not installed" in files.plots_skipped


def test_a_run_where_everything_failed_still_gets_its_report(tmp_path):
    pytest.importorskip("matplotlib")
    failed = [record(i, sent=float(i), error="HTTP 500: boom", status=500) for i in range(3)]
    result = BenchResult(base_url="u", model="m", records=failed, planned=3, elapsed_s=3.0)
    files = write_report(result, tmp_path)
    assert json.loads(files.results.read_text())["summary"]["errors"] == 3
    assert len(files.plots) == 3


def test_plot_titles_name_the_embedded_setup_not_its_throwaway_url():
    result = BenchResult(base_url="http://127.0.0.1:41234", model="m", records=[], planned=0, elapsed_s=0.0)
    kv = plot_title(result, "embedded: 2 mock engine(s), speedup 1, kv")
    round_robin = plot_title(result, "embedded: 2 mock engine(s), speedup 1, round-robin")
    assert kv != round_robin and "kv" in kv and "41234" not in kv
    assert plot_title(result) == "m @ http://127.0.0.1:41234"  # a URL the user gave names the target
