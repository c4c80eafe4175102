"""How much a frontend grows while clients open streams and never read them.

One mock engine in real time (`--speedup 1`), one `trio-direct serve` in front of it, and
`--clients` raw HTTP/1.1 connections, each asking for a long streamed chat (`ignore_eos`: the
engine generates until `max_tokens`) and then reading nothing (a small receive buffer, so the kernel holds little for them). The frontend's RSS is
printed at 10, 30 and `--seconds` seconds. A frontend whose engine streams push back on a stalled
reader levels off; one that buffers whatever the engine sends grows as long as the engine
generates.

    python benchmarks/stalled_clients_bench.py [--clients 20] [--seconds 60] [--src OTHER/src]

`--src` runs the trio_direct package under another `src/` (a checkout before a change).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--src", help="run the trio_direct package under this src/ instead")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = args.src
    python = sys.executable
    engine = subprocess.Popen(
        [python, "-m", "trio_direct", "mock-engine", "--port", "0", "--speedup", "1", "--incremental-streaming-output"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    port = free_port()
    frontend = None
    try:
        engine_port = json.loads(engine.stdout.readline())["port"]
        frontend = subprocess.Popen(
            [python, "-m", "trio_direct", "serve", "--port", str(port), "--engine-url", f"127.0.0.1:{engine_port}",
             "--stream-idle-timeout", "0"],
            stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(base + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        model = json.loads(urllib.request.urlopen(base + "/v1/models").read())["data"][0]["id"]
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "Tell a long story " * 20}],
             "max_tokens": 100_000, "stream": True, "ignore_eos": True}
        ).encode()  # fmt: skip
        start = rss_mb(frontend.pid)
        began = time.monotonic()
        clients = []
        for _ in range(args.clients):
            client = socket.create_connection(("127.0.0.1", port))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
            )
            clients.append(client)
        print(f"{args.clients} clients that never read; frontend RSS at the start {start:.1f} MB", flush=True)
        for at in sorted({10.0, 30.0, args.seconds}):
            if at > args.seconds:
                continue
            time.sleep(max(0.0, began + at - time.monotonic()))
            print(
                f"after {at:4.0f} s: {rss_mb(frontend.pid):6.1f} MB (+{rss_mb(frontend.pid) - start:.1f})", flush=True
            )
        for client in clients:
            client.close()
    finally:
        for process in (frontend, engine):
            if process is not None:
                process.terminate()
                process.wait(timeout=20)


if __name__ == "__main__":
    main()
