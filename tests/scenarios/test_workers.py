"""`trio-direct serve --workers N`: several frontend processes serving one port."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from functools import partial

import httpx
import pytest
import trio
from support import wait_until

from trio_direct.config import ServeConfig, parse_serve_args
from trio_direct.frontend.supervisor import (
    DEFAULT_WORKER_LOAD_POLL_INTERVAL,
    next_backoff,
    worker_config,
    worker_environment,
)

# --- what each child is started with (no processes) ------------------------------------------------


def test_a_child_reads_back_exactly_the_supervisors_settings_from_its_environment():
    config = ServeConfig(
        port=0, workers=3, engine_url=["grpc://127.0.0.1:1", "127.0.0.1:2"], router_kv_events=False,
        mock_speedup=math.inf, api_key="s3cret", load_poll_interval=0.25, served_model_name=[],
    )  # fmt: skip
    stale = {"TRIO_DIRECT_SERVED_MODEL_NAME": "other", "TRIO_DIRECT_ROUTER_KV_EVENTS": "1", "PATH": "/bin"}
    env = worker_environment(config, stale)
    assert parse_serve_args([], environ=env) == config
    assert env["PATH"] == "/bin" and "TRIO_DIRECT_SERVED_MODEL_NAME" not in env


def test_children_run_one_process_each_and_poll_engine_load_in_kv_mode():
    child = worker_config(ServeConfig(workers=4, router_mode="kv", load_poll_interval=0), ["grpc://127.0.0.1:5"])
    assert (child.workers, child.engine_url) == (1, ["grpc://127.0.0.1:5"])
    assert child.load_poll_interval == DEFAULT_WORKER_LOAD_POLL_INTERVAL
    assert worker_config(ServeConfig(workers=4, router_mode="kv", load_poll_interval=0.3)).load_poll_interval == 0.3
    assert worker_config(ServeConfig(workers=4)).load_poll_interval == ServeConfig().load_poll_interval


def test_a_crashing_child_is_restarted_ever_more_slowly_until_it_stays_up():
    delays, backoff = [], 1.0
    for _ in range(7):
        delay, backoff = next_backoff(backoff, uptime=2.0)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert next_backoff(backoff, uptime=600.0)[0] == 1


# --- real processes ---------------------------------------------------------------------------------


@dataclass
class Supervisor:
    """A `trio-direct serve --workers N` process and everything it (and its children) logged."""

    process: trio.Process
    log: list[str] = field(default_factory=list)

    def pids(self, event: str) -> dict[int, int]:
        """worker index -> pid of its latest `worker I <event> (pid P)` line."""
        found = {}
        for line in self.log:
            if match := re.search(rf"worker (\d+) {event} \(pid (\d+)\)", line):
                found[int(match[1])] = int(match[2])
        return found

    def logged(self, pattern: str) -> re.Match | None:
        return next((m for line in self.log if (m := re.search(pattern, line))), None)


async def start_supervisor(nursery: trio.Nursery, *args: str) -> Supervisor:
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", "0", "--mock-speedup", "inf", *args]
    process = await nursery.start(partial(trio.run_process, command, stderr=subprocess.PIPE, check=False))
    supervisor = Supervisor(process)

    async def read_log() -> None:  # children write here too: keep the pipe drained
        pending = b""
        async for data in process.stderr:
            *lines, pending = (pending + data).split(b"\n")
            supervisor.log.extend(line.decode(errors="replace") for line in lines)

    nursery.start_soon(read_log)
    return supervisor


def alive(pid: int) -> bool:
    """Running (a zombie whose new parent has not reaped it yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def served_by_each_worker(base: str) -> dict[int, float]:
    """pid -> completion requests it answered, from `/metrics` scraped over fresh connections."""
    counts: dict[int, float] = {}
    with trio.fail_after(20):
        while len(counts) < 2:
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                text = (await client.get("/metrics")).text
            info = re.search(r'trio_direct_worker_info\{pid="(\d+)"', text)
            assert info is not None
            pid = int(info[1])
            counts[pid] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith("trio_direct_requests_total{"))  # fmt: skip
    return counts


@pytest.mark.slow
async def test_two_workers_share_one_port_survive_a_crash_and_stop_cleanly_on_sigterm(nursery):
    supervisor = await start_supervisor(nursery, "--workers", "2")
    await wait_until(lambda: supervisor.logged(r"all 2 workers ready on (http://\S+)") is not None, timeout=60)
    ready = supervisor.logged(r"all 2 workers ready on (http://\S+)")
    assert ready is not None
    base = ready[1]
    assert not base.endswith(":0")
    workers = supervisor.pids("started")
    assert len(set(workers.values())) == 2 and os.getpid() not in workers.values()

    body = {"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
    sent = 0
    for _ in range(5):  # which process accepts a connection is the kernel's call: send until both served
        for _ in range(20):
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:  # a fresh connection each
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            sent += 1
        served = await served_by_each_worker(base)
        if all(count > 0 for count in served.values()):
            break
    assert set(served) == set(workers.values())
    assert all(count > 0 for count in served.values()) and sum(served.values()) == sent

    os.kill(workers[0], signal.SIGKILL)  # a worker crashes: it is restarted, the port keeps serving
    await wait_until(lambda: supervisor.pids("ready").get(0, workers[0]) != workers[0], timeout=30)
    assert supervisor.logged(r"worker 0 was killed by SIGKILL; restarting it in 1s")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    children = [supervisor.pids("ready")[0], workers[1]]

    supervisor.process.send_signal(signal.SIGTERM)
    with trio.fail_after(20):
        assert await supervisor.process.wait() == 0
    assert not any(alive(pid) for pid in children)
    assert supervisor.logged(r"\[worker 1\] .*supervisor stopping: draining in-flight requests")


@pytest.mark.slow
async def test_a_worker_that_cannot_start_stops_the_others_and_fails_with_its_message(nursery):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    supervisor = await start_supervisor(
        nursery, "--workers", "2", "--engine-url", f"127.0.0.1:{dead}", "--engine-wait-timeout", "1"
    )
    with trio.fail_after(30):
        status = await supervisor.process.wait()
    await wait_until(lambda: supervisor.logged(r"during start-up; stopped the others") is not None)
    assert status == 1
    assert supervisor.logged(rf"127\.0\.0\.1:{dead}")  # the child's own error
    assert not any(alive(pid) for pid in supervisor.pids("started").values())


@pytest.mark.slow
async def test_workers_drain_and_exit_when_their_supervisor_is_killed(nursery):
    supervisor = await start_supervisor(nursery, "--workers", "2")
    await wait_until(lambda: supervisor.logged(r"all 2 workers ready") is not None, timeout=60)
    children = list(supervisor.pids("started").values())
    supervisor.process.kill()  # no chance to stop them: they notice their control socket closing
    await wait_until(lambda: not any(alive(pid) for pid in children), timeout=20)


@pytest.mark.slow
async def test_kv_workers_send_a_shared_prefix_to_the_same_warm_engine(nursery):
    """Each child builds its own index from the engines' events: whichever accepts a connection, a
    prefix goes where it is cached."""
    from support import start_mock_engine

    kv_events = '{"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": ""}'
    engines = [
        await start_mock_engine(
            nursery, "--speedup", "inf", "--incremental-streaming-output", "--kv-events-config", kv_events
        )
        for _ in range(3)
    ]
    urls = [arg for engine in engines for arg in ("--engine-url", engine.url)]
    supervisor = await start_supervisor(
        nursery, "--workers", "2", "--router-mode", "kv", "--served-model-name", "trio-direct-mock", *urls
    )
    await wait_until(lambda: supervisor.logged(r"all 2 workers ready on (http://\S+)") is not None, timeout=60)
    ready = supervisor.logged(r"all 2 workers ready on (http://\S+)")
    assert ready is not None
    base = ready[1]
    system = "You are the assistant of one team. " + " ".join(f"Rule {i}: answer with care." for i in range(150))

    async def ask(question: str) -> dict:
        body = {"model": "trio-direct-mock", "messages": [{"role": "system", "content": system},
                                                          {"role": "user", "content": question}], "max_tokens": 3}  # fmt: skip
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:  # a fresh connection: either child
            reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]

    await ask("first question")
    await trio.sleep(0.5)  # its KV events reach both children
    usages = [await ask(f"follow-up {turn}") for turn in range(16)]
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert cached / sum(u["prompt_tokens"] for u in usages) >= 0.9
    served = await served_by_each_worker(base)
    assert all(count > 0 for count in served.values()), "both children served"
