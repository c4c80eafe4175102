"""Every benchmark under benchmarks/ still runs: its `--help`, and a tiny run of the real thing.

Benchmarks are not timed tests and their figures are not checked here. What is checked is that each
script still starts, talks to the code it measures and prints a result: two of them once broke
silently when a default they relied on changed, and nobody noticed until the next measurement.
A new script under benchmarks/ must be added to `TINY_RUNS` (or `NOT_A_SCRIPT`); the last test
says so when it is not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import TRACE_SAMPLE

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
#: Modules the scripts import, not scripts of their own.
NOT_A_SCRIPT = {"loadgen.py"}

#: The smallest run of each script that still goes through all of its code: a handful of requests,
#: one round. `{trace}` is the committed trace sample, `{tmp}` the test's own folder, `{smg}` the smg
#: executable (installed on first use, as for the interop tests).
TINY_RUNS: dict[str, str] = {
    "frontend_bench.py": "--requests-per-slot 1 --latency-requests 2 --rounds 1",
    "http_floor.py": "--requests 2 --rounds 1",
    "http_layers.py": "--requests 20 --rounds 1",
    "idle_penalty.py": "--samples 3",
    "kv_index_bench.py": "--blocks 200 --workers 2 --lookups 10 --page1-blocks 200",
    "kv_routing_bench.py": "--trace {trace} --limit 8 --configs trio-direct-kv --rounds 1 "
    "--max-input-tokens 2000 --max-output-tokens 8 --out {tmp}",
    "kv_routing_sim.py": "--trace {trace} --slices 0:0:20 --policies kv:1:1 round-robin --engines 2",
    "mock_engine_bench.py": "--concurrency 1 --tokens 4 --requests 2",
    "mock_scheduler_bench.py": "--running 2 --steps 5",
    "pd_bench.py": "--concurrency 1 --requests 2 --rounds 1",
    "prompt_cache_bench.py": "--trace {trace} --conversations 2 --rounds 1",
    "stalled_clients_bench.py": "--clients 2 --seconds 1",
    "state_store_bench.py": "--rounds 2",
    "tenant_fairness_bench.py": "--seconds 1 --out {tmp}",
    "soak_bench.py": "--concurrency 2 --duration 1 --warmup 1 --ramp 0.5 --engines 1 --out {tmp}/soak.json",
    "text_pipeline_bench.py": "--tokens 20 --runs 1",
    "token_path_bench.py": "--tokens 50 --runs 1",
    "transport_bench.py": "--messages 50 --runs 1",
    "ttft_breakdown.py": "--requests 2",
    "vs_smg.py": "--smg {smg} --parts latency,longprompt,unary --rounds 1 --seconds 1 --latency-requests 2 --long-requests 2 --long-mocks 1",
    "call_counts.py": "--requests 2 --concurrency 1 --tokens 4",
}


def scripts() -> list[str]:
    return sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in NOT_A_SCRIPT)


def run_script(name: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / name), *args],
        cwd=BENCHMARKS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("name", scripts())
def test_each_benchmark_prints_its_help(name):
    done = run_script(name, "--help", timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage:" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TINY_RUNS))
def test_each_benchmark_finishes_a_tiny_run(name, tmp_path, request):
    smg = request.getfixturevalue("smg_executable") if name == "vs_smg.py" else ""
    words = TINY_RUNS[name].format(trace=TRACE_SAMPLE, tmp=tmp_path, smg=smg).split()
    args = [word.replace("trio-direct-kv", "trio-direct kv") for word in words]  # a choice with a space
    done = run_script(name, *args, timeout=240)
    assert done.returncode == 0, f"{name} {' '.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), "a benchmark prints its figures"


def test_every_benchmark_has_a_tiny_run():
    assert set(scripts()) == set(TINY_RUNS), "add the new script's smallest run to TINY_RUNS"
