"""`trio-direct bench` as a user runs it (through `bench_main`)."""

from __future__ import annotations

import json
import socket

from support import TRACE_SAMPLE

from trio_direct.bench import bench_main, build_parser, plan_requests


def test_a_synthetic_run_against_an_embedded_fleet_writes_results(tmp_path, capsys):
    out = tmp_path / "out"
    status = bench_main(
        [
            "--synthetic",
            "--conversations",
            "4",
            "--turns",
            "2",
            "--time-scale",
            "0.01",
            "--max-output-tokens",
            "8",
            "--mock-engines",
            "2",
            "--mock-speedup",
            "inf",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["completed"] == 8 and results["summary"]["errors"] == 0
    assert results["summary"]["cached_token_ratio"] > 0  # shared system prompts and growing turns
    assert results["config"]["mock_speedup"] == "inf"
    assert results["config"]["client_check"]["samples"] == 8
    assert {s["engine"] for s in results["engine_load"]} == {"engine0", "engine1"}
    printed = capsys.readouterr().out
    assert "requests: 8 completed, 0 failed" in printed and "results: " in printed


def test_a_frontend_that_is_not_there_fails_with_a_message(tmp_path, capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status = bench_main(["--synthetic", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path)])
    assert status == 1
    assert "cannot connect" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_planning_slices_caps_and_scales_the_trace():
    path = TRACE_SAMPLE
    args = build_parser().parse_args(
        ["--trace", str(path), "--start", "10", "--limit", "5", "--time-scale", "0.5"]
        + ["--max-input-tokens", "1000", "--max-output-tokens", "20"]
    )
    requests, source = plan_requests(args)
    assert source.endswith("mooncake_conversation_trace.jsonl")
    assert [r.index for r in requests] == [10, 11, 12, 13, 14]
    assert requests[0].arrival_s == 0.0
    assert max(r.input_length for r in requests) <= 1000 and max(r.output_length for r in requests) <= 20


def test_a_missing_trace_file_is_a_usage_error(tmp_path, capsys):
    assert bench_main(["--trace", str(tmp_path / "nope.jsonl"), "--url", "http://127.0.0.1:9"]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
