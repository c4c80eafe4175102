"""What storing a Responses API response costs, per state store backend, against `store: false`.

For each backend (memory, a SQLite file, and PostgreSQL and Redis servers started here from their
Debian packages, as the tests start them: Redis with `appendfsync always`, PostgreSQL with
`fsync=off`), starts `trio-direct serve --state-store URL` over its built-in mock engines
(`--mock-speedup inf`) and times, interleaved, a unary `POST /v1/responses` with `store: false`
(the baseline), the same with `store: true`, and `GET /v1/responses/{id}`. Prints medians and the
stored request's ratio to the baseline of the same run.

    python benchmarks/state_store_bench.py [--rounds 100]
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from state_servers import PostgresServer, RedisServer, postgres_binaries, redis_binary


def timed(call: Callable[[], httpx.Response]) -> tuple[float, httpx.Response]:
    """(milliseconds, the response)."""
    start = time.perf_counter()
    response = call()
    return (time.perf_counter() - start) * 1000, response


def measure(url: str, rounds: int) -> tuple[float, float, float]:
    command = [
        sys.executable,
        "-m",
        "trio_direct",
        "serve",
        "--port",
        "0",
        "--mock-speedup",
        "inf",
        "--state-store",
        url,
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        base = next(m[1] for line in process.stderr if (m := re.search(r"OpenAI API for .* on (http://\S+)", line)))
        with httpx.Client(base_url=base, timeout=30) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            body = {"model": model, "input": "Hello", "max_output_tokens": 4}
            for _ in range(20):  # warm-up
                client.post("/v1/responses", json=body)
            baseline, stored, retrieved = [], [], []
            for _ in range(rounds):
                baseline.append(timed(lambda: client.post("/v1/responses", json={**body, "store": False}))[0])
                elapsed, answer = timed(lambda: client.post("/v1/responses", json=body))
                stored.append(elapsed)
                path = f"/v1/responses/{answer.json()['id']}"
                retrieved.append(timed(lambda: client.get(path))[0])  # noqa: B023 (called at once)
        return statistics.median(baseline), statistics.median(stored), statistics.median(retrieved)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    servers: list[PostgresServer | RedisServer] = []
    stores = [("memory", "memory")]
    directory = tempfile.mkdtemp()
    stores.append(("sqlite", f"sqlite://{directory}/state.db"))
    binaries, binary = postgres_binaries(), redis_binary()
    if binaries is not None:
        servers.append(PostgresServer(binaries))
    if binary is not None:
        servers.append(RedisServer(binary))
    try:
        for server in servers:
            server.start()
            stores.append(("postgresql" if isinstance(server, PostgresServer) else "redis", server.url))
        print("store       store:false  store:true  (ratio)  GET")
        for name, url in stores:
            baseline, stored, retrieved = measure(url, args.rounds)
            print(f"{name:10s}  {baseline:8.2f} ms  {stored:7.2f} ms  ({stored / baseline:4.2f})  {retrieved:5.2f} ms")
    finally:
        for server in servers:
            server.close()


if __name__ == "__main__":
    main()
