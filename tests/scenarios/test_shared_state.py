"""Two `trio-direct serve --workers 2` processes on one state store, for each backend: a response
stored through one is continued, retrieved and deleted through the other; an engine added through
one's admin API is routed to by the other, and drained by both when the other removes it; the database stopped and started mid-run (errors while
it is down, full service after, nothing acknowledged lost).

Every request goes over a new connection, so that each lands on any worker of its process."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import trio
from state_servers import PostgresServer, RedisServer, missing_server, postgres_binaries, redis_binary
from support import engine_accounting, start_mock_engine, wait_until
from surface_scenarios import SCRIPTS

from trio_direct.engine.transport import open_asyncio_loop

pytestmark = pytest.mark.slow

ADMIN_KEY = "admin-secret"
ROUNDS = 20


@dataclass
class Serve:
    """A `trio-direct serve --workers 2` process and what it logged."""

    process: trio.Process
    log: list[str] = field(default_factory=list)

    @property
    def base(self) -> str | None:
        found = next((m for line in self.log if (m := re.search(r"all 2 workers ready on (http://\S+)", line))), None)
        return found[1] if found else None


async def start_serve(nursery: trio.Nursery, *args: str) -> Serve:
    command = [
        sys.executable, "-m", "trio_direct", "serve", "--port", "0", "--workers", "2",
        "--admin-api-key", ADMIN_KEY, "--fleet-sync-interval", "0.3", "--state-store-timeout", "2",
        "--health-interval", "1", *args,
    ]  # fmt: skip
    process = await nursery.start(partial(trio.run_process, command, stderr=subprocess.PIPE, check=False))
    serve = Serve(process)

    async def read_log() -> None:
        pending = b""
        async for data in process.stderr:
            *lines, pending = (pending + data).split(b"\n")
            serve.log.extend(line.decode(errors="replace") for line in lines)

    nursery.start_soon(read_log)
    await wait_until(lambda: serve.base is not None, timeout=90, interval=0.1)
    return serve


def client(base: str | None, **headers: str) -> openai.OpenAI:
    """An SDK client that opens a new connection for every request (any worker may answer)."""
    assert base is not None, "serve has not logged its address"
    http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30)
    return openai.OpenAI(
        base_url=base + "/v1",
        api_key="unused",
        max_retries=0,
        http_client=http,  # type: ignore[arg-type]  # the SDK takes a legacy httpx.Client too (checked at run time); its types name only httpx2
        default_headers=headers,
    )


@pytest.fixture(params=["sqlite", "postgresql", "redis"])
def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, PostgresServer | RedisServer | None]]:
    if request.param == "sqlite":
        yield f"sqlite://{tmp_path}/state.db", None
        return
    server: PostgresServer | RedisServer
    if request.param == "redis":
        binary = redis_binary()
        if binary is None:
            missing_server("redis-server")
        server = RedisServer(binary)
    else:
        binaries = postgres_binaries()
        if binaries is None:
            missing_server("PostgreSQL")
        server = PostgresServer(binaries)
    server.start()
    try:
        yield server.url, server
    finally:
        server.close()


async def test_two_frontends_share_responses_and_the_fleet_and_survive_a_database_restart(nursery, tmp_path, database):
    url, server = database
    script = tmp_path / "scripts.json"
    script.write_text(json.dumps(SCRIPTS))
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--scripted-outputs", str(script))
    first = await start_serve(nursery, "--engine-url", engine.url, "--state-store", url)
    second = await start_serve(nursery, "--engine-url", engine.url, "--state-store", url)
    assert first.base and second.base
    async with httpx.AsyncClient(timeout=30) as http:
        model = (await http.get(first.base + "/v1/models")).json()["data"][0]["id"]
    stored: list[str] = []

    def across() -> None:
        one, other = client(first.base), client(second.base)
        for _ in range(ROUNDS):
            told = one.responses.create(model=model, input="My name is Ada. Please remember it.")
            stored.append(told.id)
            again = other.responses.create(model=model, previous_response_id=told.id, input="What is my name?")
            assert again.output_text == "Your name is Ada."
            stored.append(again.id)
            assert other.responses.retrieve(told.id).output_text == "I will remember, Ada."
            doomed = one.responses.create(model=model, input="Tell me the riddle answer")
            other.responses.delete(doomed.id)
            with pytest.raises(openai.NotFoundError):
                one.responses.retrieve(doomed.id)

    await trio.to_thread.run_sync(across)

    # an engine added through the first frontend's admin API serves requests sent to the second
    added = await start_mock_engine(nursery, "--speedup", "inf", "--scripted-outputs", str(script))
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(timeout=30, headers=admin) as http:
        answer = await http.post(first.base + "/admin/engines", json={"url": added.url})
        assert answer.status_code == 201, answer.text

        async def listed_as_serving() -> bool:
            assert second.base is not None
            async with httpx.AsyncClient(timeout=30, headers=admin) as fresh:
                engines = (await fresh.get(second.base + "/admin/engines")).json()["data"]
            return any(e["url"] == added.url and e["state"] == "serving" and e["healthy"] for e in engines)

        with trio.fail_after(60):
            while not all([await listed_as_serving() for _ in range(6)]):
                await trio.sleep(0.2)

    def chat_through_second() -> None:
        with client(second.base) as chat:
            for _ in range(12):
                chat.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}])

    await trio.to_thread.run_sync(chat_through_second)
    async with open_asyncio_loop():  # the engine client's transport runs on asyncio
        assert (await engine_accounting(added.url))["started"] > 0

    # removed through the second frontend (by its own id for the engine): drained by the first too
    async with httpx.AsyncClient(timeout=30, headers=admin) as http:
        listing = (await http.get(second.base + "/admin/engines")).json()["data"]
        [engine_id] = [e["id"] for e in listing if e["url"] == added.url]
        assert (await http.delete(f"{second.base}/admin/engines/{engine_id}")).status_code == 200

        async def excluded_by_first() -> bool:
            assert first.base is not None
            async with httpx.AsyncClient(timeout=30, headers=admin) as fresh:
                body = (await fresh.get(first.base + "/admin/engines")).json()
            serving = [e for e in body["data"] if e["url"] == added.url and e["state"] == "serving"]
            return added.url in body["excluded"] and not serving

        with trio.fail_after(60):
            while not all([await excluded_by_first() for _ in range(6)]):
                await trio.sleep(0.2)

    if server is None:
        return  # SQLite lives in the frontends' host: there is no database server to restart
    logged_before_the_outage = len(first.log), len(second.log)
    server.stop()

    def while_down() -> None:
        with client(second.base) as down:
            with pytest.raises(openai.InternalServerError) as raised:
                down.responses.retrieve(stored[0])
            assert raised.value.status_code == 503
            with pytest.raises(openai.InternalServerError):
                down.responses.create(model=model, input="Tell me the riddle answer")
            assert down.responses.create(model=model, input="Tell me the riddle answer", store=False).output_text
            assert down.chat.completions.create(model=model, messages=[{"role": "user", "content": "Count"}]).choices

    await trio.to_thread.run_sync(while_down)

    def workers_logging(serve: Serve, since: int, what: str) -> set[str]:
        """The workers of `serve` whose state store logged `what` after line `since`."""
        pattern = re.compile(rf"\[worker (\d+)\] trio_direct\.state\.threaded .*{what}")
        return {m[1] for line in serve.log[since:] if (m := pattern.search(line))}

    async def every_worker_logs(what: str) -> None:
        with trio.fail_after(60):
            while len(workers_logging(first, logged_before_the_outage[0], what)) < 2 or (
                len(workers_logging(second, logged_before_the_outage[1], what)) < 2
            ):
                await trio.sleep(0.1)

    # Every worker follows the fleet through the store every 0.3s, so each notices the outage
    # within the store's timeout; the database stays down until all have (the requests above take
    # a fraction of a second: a shorter outage could fall between a worker's reads and go unseen).
    await every_worker_logs("is unavailable")
    server.start()
    # Service is back once every worker of both frontends has reached the store again (within
    # about a second of the database accepting connections): wait for that, then expect full service.
    await every_worker_logs("is reachable again")

    def after() -> None:
        with client(first.base) as one, client(second.base) as other:
            for response_id in stored:  # every acknowledged response is still there, from both
                assert other.responses.retrieve(response_id).id == response_id
                assert one.responses.retrieve(response_id).id == response_id
            again = one.responses.create(model=model, previous_response_id=stored[0], input="What is my name?")
            assert again.output_text == "Your name is Ada."

    await trio.to_thread.run_sync(after)


async def test_the_workers_of_one_serve_share_stored_responses_with_no_store_named(nursery):
    """The default for `--workers N`: a SQLite file of the run, so any worker retrieves any response."""
    serve = await start_serve(nursery, "--mock-speedup", "inf")
    assert serve.base
    async with httpx.AsyncClient(timeout=30) as http:
        model = (await http.get(serve.base + "/v1/models")).json()["data"][0]["id"]

    def create_then_retrieve() -> None:
        with client(serve.base) as fresh:
            ids = [fresh.responses.create(model=model, input="Hello", max_output_tokens=4).id for _ in range(10)]
            assert all(fresh.responses.retrieve(response_id).id == response_id for response_id in ids)

    await trio.to_thread.run_sync(create_then_retrieve)
    assert any("workers share their state in sqlite://" in line for line in serve.log)


async def test_a_tenants_limits_hold_across_every_frontend_on_one_store(nursery, tmp_path, database):
    """Issue 29's shared counters: a tenant's requests per minute are counted in the state store,
    so two `serve --workers 2` processes (four workers) on one store refuse its fifth request of the
    minute whichever of them it reaches, and each tells it what the store has left."""
    url, _ = database
    key = "key-shared"
    tenants = tmp_path / "tenants.yaml"
    entry = {
        "name": "shared",
        "api_keys_sha256": [hashlib.sha256(key.encode()).hexdigest()],
        "models": ["*"],
        "priority": 0,
        "weight": 1,
        "limits": {"requests_per_minute": 4},
    }
    tenants.write_text(json.dumps({"tenants": [entry]}))
    engine = await start_mock_engine(nursery, "--speedup", "inf")
    flags = ("--engine-url", engine.url, "--state-store", url, "--tenants-file", str(tenants))
    first, second = await start_serve(nursery, *flags), await start_serve(nursery, *flags)
    assert first.base and second.base
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as http:
        model = (await http.get(first.base + "/v1/models")).json()["data"][0]["id"]

    def send_five() -> tuple[list[str], openai.RateLimitError]:
        assert first.base is not None and second.base is not None
        one = openai.OpenAI(
            base_url=first.base + "/v1", api_key=key, max_retries=0,
            http_client=httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30),  # type: ignore[arg-type]  # the SDK takes a legacy httpx.Client too (checked at run time); its types name only httpx2
        )  # fmt: skip
        other = one.with_options(base_url=second.base + "/v1")
        remaining = []
        for sdk in (one, other, one, other):
            raw = sdk.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
            remaining.append(raw.headers["x-ratelimit-remaining-requests"])
        with pytest.raises(openai.RateLimitError) as refused:
            other.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        return remaining, refused.value

    remaining, refused = await trio.to_thread.run_sync(send_five)
    assert remaining == ["3", "2", "1", "0"]  # one count, whichever frontend and worker answered
    assert refused.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(refused.response.headers["retry-after"]) <= 60
