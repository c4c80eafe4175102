"""A living fleet through `trio-direct serve`: engines found in DNS (A/AAAA of a headless-Service-like
name, SRV records), a file and the admin API, scaled up and down under load with no failed request,
a DNS outage that drops nothing.

The DNS server is real (dnslib's, on loopback, records changed as the test runs); mock engines listen
on distinct loopback addresses (127.0.0.2, 127.0.0.3: Linux routes all of 127/8) behind one name.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import openai
import pytest
import trio
from support import (
    EngineExited,
    LoopbackDns,
    MockEngineProcess,
    engine_accounting,
    established_connections,
    start_frontend,
    start_mock_engine,
    wait_until,
)

pytestmark = pytest.mark.slow

ADMIN_KEY = "admin-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
NAME = "sglang.test.svc.cluster.local"
#: Requests of ~16 tokens take ~0.1 s on these engines: some are always in flight. (A name of their
#: own: the request counters of this test process are shared with other tests' frontends.)
ENGINE = ("--speedup", "2", "--incremental-streaming-output", "--served-model-name", "discovered")
#: Lookups every 0.25 s; an engine missing from two answers in a row leaves; health checks every 0.2 s.
QUICK = (
    "--discovery-interval", "0.25", "--discovery-grace", "0.25",
    "--health-interval", "0.2", "--health-timeout", "1", "--admin-api-key", ADMIN_KEY,
)  # fmt: skip


async def engines_on(nursery, *hosts: str) -> list[MockEngineProcess]:
    """One mock engine per loopback address, all on the same port (as pods behind a Service).

    The first engine's ephemeral port may be taken on the other addresses: a socket bound to the
    wildcard address holds it on every one (the ZMQ publishers of other tests' engines bind
    `tcp://*:0`). An engine that cannot bind exits with status 2; then all start again on another
    port."""
    for _ in range(5):
        first = await start_mock_engine(nursery, "--host", hosts[0], *ENGINE)
        started = [first]
        try:
            for host in hosts[1:]:
                started.append(await start_mock_engine(nursery, "--host", host, "--port", str(first.port), *ENGINE))
            return started
        except EngineExited as exited:
            if exited.returncode != 2:
                raise
            for engine in started:
                engine.process.kill()
                await engine.process.wait()
    raise AssertionError(f"no port free on all of {hosts} in five tries")


@dataclass
class Load:
    """Clients (the official SDK, each in a thread) streaming chat completions back to back until
    `stop`; every outcome counted."""

    model: str
    completed: int = 0
    failures: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.stopping.set()

    @asynccontextmanager
    async def running(self, base: str, clients: int = 4) -> AsyncIterator[Load]:
        """The clients run for the body of the ``async with`` (and stop however it is left)."""
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(trio.to_thread.run_sync, self._run, base)
            try:
                yield self
            finally:
                self.stop()

    def _run(self, base: str) -> None:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        try:
            while not self.stopping.is_set():
                try:
                    stream = client.chat.completions.create(
                        model=self.model, messages=[{"role": "user", "content": "Count to ten."}], max_tokens=16,
                        stream=True,
                    )  # fmt: skip
                    finish = None
                    for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    if finish != "length":
                        self.failures.append(f"finish_reason {finish!r}")
                    self.completed += 1
                except openai.OpenAIError as error:
                    self.failures.append(repr(error))
        finally:
            client.close()


async def admin_engines(client: httpx.AsyncClient) -> list[dict]:
    reply = await client.get("/admin/engines", headers=ADMIN)
    assert reply.status_code == 200, reply.text
    return reply.json()["data"]


async def serving(client: httpx.AsyncClient) -> dict[str, str]:
    """URL -> id of the engines serving now."""
    return {e["url"]: e["id"] for e in await admin_engines(client) if e["state"] == "serving"}


async def requests_served(url: str) -> int:
    account = await engine_accounting(url)
    return sum(1 for rid in account["first_output_at"] if not rid.startswith("HEALTH_CHECK"))


def settled(account: dict) -> bool:
    """Nothing runs, and every request the engine started ended (finished, aborted or cancelled)."""
    ended = account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]
    return not account["live"] and account["started"] == ended


async def test_engines_behind_a_dns_name_scale_up_and_down_under_load(aio_loop, nursery):
    a, b = await engines_on(nursery, "127.0.0.2", "127.0.0.3")
    dns = LoopbackDns()
    try:
        dns.set_a(NAME, ["127.0.0.2"])
        # Lookups every second here: an engine is probed and joins well within one under load.
        base = await start_frontend(
            nursery, "--engine-dns", f"{NAME}:{a.port}", "--discovery-nameserver", dns.nameserver, *QUICK,
            "--discovery-interval", "1", "--discovery-grace", "1",
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            assert list(await serving(client)) == [a.url]
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            load = Load(model)
            async with load.running(base):
                await wait_until(lambda: load.completed >= 8, timeout=30)

                # Scale up: the new pod's address joins the record set. It is found by one of the
                # next two lookups, probed, and gets traffic with the next requests once it serves.
                lookups = dns.queries[(NAME, "A")]
                dns.set_a(NAME, ["127.0.0.2", "127.0.0.3"])
                with trio.fail_after(20):
                    while b.url not in {e["url"] for e in await admin_engines(client)}:
                        await trio.sleep(0.01)
                assert dns.queries[(NAME, "A")] - lookups <= 2
                with trio.fail_after(20):
                    while b.url not in await serving(client):
                        await trio.sleep(0.01)
                joined_at = load.completed
                with trio.fail_after(20):
                    while not await requests_served(b.url):
                        await trio.sleep(0.01)
                assert load.completed - joined_at <= 8  # round-robin over both engines from then on
                assert sorted(await serving(client)) == [a.url, b.url]
                before = load.completed
                await wait_until(lambda: load.completed >= before + 8, timeout=30)

                # Scale down: the first pod leaves the record set; it drains under load.
                dns.set_a(NAME, ["127.0.0.3"])
                with trio.fail_after(20):
                    while any(e["url"] == a.url for e in await admin_engines(client)):
                        await trio.sleep(0.05)
                before = load.completed
                await wait_until(lambda: load.completed >= before + 8, timeout=30)
            assert load.failures == []
            assert await serving(client) == {b.url: "e1"}
            # The drained engine: idle, every request it started ended, no connection left to it.
            await wait_until(lambda: established_connections("127.0.0.2", a.port) == 0, timeout=10)
            served_by_a = await requests_served(a.url)
            account = await engine_accounting(a.url)
            assert settled(account), account
            metrics = (await client.get("/metrics")).text
            # Its series are gone (the routing counters' too, checked in tests/frontend: other
            # frontends of this test process count decisions for their own "e0").
            assert 'engine="e0"' not in "\n".join(m for m in metrics.splitlines() if "routing_decisions" not in m)
            assert 'trio_direct_engine_healthy{engine="e1"' in metrics
            for _ in range(3):
                body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            assert await requests_served(a.url) == served_by_a  # nothing more reaches it
    finally:
        dns.stop()


async def test_a_dns_outage_and_empty_answers_drop_no_engine(aio_loop, nursery):
    a, b = await engines_on(nursery, "127.0.0.2", "127.0.0.3")
    dns = LoopbackDns()
    dns.set_a(NAME, ["127.0.0.2", "127.0.0.3"])
    base = await start_frontend(
        nursery, "--engine-dns", f"{NAME}:{a.port}", "--discovery-nameserver", dns.nameserver, *QUICK
    )
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert sorted(await serving(client)) == [a.url, b.url]
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

        dns.forget(NAME)  # NXDOMAIN, as for a Service without ready endpoints
        asked = dns.queries[(NAME, "A")]
        await wait_until(lambda: dns.queries[(NAME, "A")] >= asked + 3, timeout=10)
        assert sorted(await serving(client)) == [a.url, b.url]

        dns.stop()  # no answer at all
        await trio.sleep(2.0)  # several intervals, each lookup timing out
        assert sorted(await serving(client)) == [a.url, b.url]
        before = [await requests_served(e.url) for e in (a, b)]
        for _ in range(6):
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        after = [await requests_served(e.url) for e in (a, b)]
        assert [y - x for x, y in zip(before, after, strict=True)] == [3, 3]  # both still take turns


async def test_srv_records_give_each_engine_its_own_port(aio_loop, nursery):
    a = await start_mock_engine(nursery, "--host", "127.0.0.2", *ENGINE)
    b = await start_mock_engine(nursery, "--host", "127.0.0.3", *ENGINE)
    assert a.port != b.port
    service = f"_grpc._tcp.{NAME}"
    dns = LoopbackDns()
    try:
        dns.set_a(f"pod-a.{NAME}", ["127.0.0.2"])
        dns.set_a(f"pod-b.{NAME}", ["127.0.0.3"])
        dns.set_srv(service, [(f"pod-a.{NAME}.", a.port), (f"pod-b.{NAME}.", b.port)])
        base = await start_frontend(
            nursery, "--engine-dns-srv", service, "--discovery-nameserver", dns.nameserver, *QUICK
        )
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            engines = {e["url"]: e for e in await admin_engines(client)}
            assert sorted(engines) == [a.url, b.url]
            assert all(e["sources"] == [f"dns-srv:{service}"] and e["state"] == "serving" for e in engines.values())
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            for _ in range(4):
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            assert [await requests_served(e.url) for e in (a, b)] == [2, 2]

            dns.set_srv(service, [(f"pod-b.{NAME}.", b.port)])
            with trio.fail_after(20):
                while a.url in {e["url"] for e in await admin_engines(client)}:
                    await trio.sleep(0.05)
            for _ in range(4):
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            assert [await requests_served(e.url) for e in (a, b)] == [2, 6]
    finally:
        dns.stop()


async def test_an_engine_file_is_followed_as_it_is_edited(aio_loop, nursery, tmp_path, caplog):
    a, b = await engines_on(nursery, "127.0.0.2", "127.0.0.3")
    path = tmp_path / "engines.yaml"
    path.write_text(f"- {a.url}\n")
    base = await start_frontend(nursery, "--engine-file", str(path), *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert list(await serving(client)) == [a.url]

        path.write_text(json.dumps([a.url, {"url": b.url, "role": "aggregated"}]))
        with trio.fail_after(20):
            while len(await serving(client)) < 2:
                await trio.sleep(0.05)

        path.write_text(f"- {b.url}\n- url: [unclosed\n")  # a bad edit: the last good list stays
        await wait_until(lambda: "is malformed" in caplog.text, timeout=10)
        await trio.sleep(1.0)  # several intervals (and grace periods) later
        assert sorted(await serving(client)) == [a.url, b.url]

        path.write_text(f"- {b.url}\n")
        with trio.fail_after(20):
            while a.url in {e["url"] for e in await admin_engines(client)}:
                await trio.sleep(0.05)
        assert list(await serving(client)) == [b.url]
    await wait_until(lambda: established_connections("127.0.0.2", a.port) == 0, timeout=10)


async def test_the_admin_api_adds_and_removes_engines_and_needs_its_own_key(aio_loop, nursery):
    a, b = await engines_on(nursery, "127.0.0.2", "127.0.0.3")
    base = await start_frontend(nursery, "--engine-url", a.url, "--api-key", "client-key", *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for headers in ({}, {"authorization": "Bearer client-key"}, {"authorization": "Bearer wrong"}):
            reply = await client.get("/admin/engines", headers=headers)
            assert reply.status_code == 401 and reply.json()["error"]["type"]
        assert (await client.post("/admin/engines", json={"url": b.url})).status_code == 401
        assert [e["id"] for e in await admin_engines(client)] == ["e0"]

        bad = await client.post("/admin/engines", headers=ADMIN, json={"url": "not a url"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "url"
        added = await client.post("/admin/engines", headers=ADMIN, json={"url": b.url})
        assert added.status_code == 201
        entry = added.json()
        assert (entry["id"], entry["url"], entry["sources"]) == ("e1", b.url, ["admin"])
        with trio.fail_after(20):
            while len(await serving(client)) < 2:
                await trio.sleep(0.05)
        again = await client.post("/admin/engines", headers=ADMIN, json={"url": b.url})
        assert again.status_code == 200 and again.json()["id"] == "e1"

        listed = {e["id"]: e for e in await admin_engines(client)}
        assert listed["e0"]["sources"] == ["engine-url"] and listed["e0"]["healthy"] is True
        assert {"model", "role", "in_flight", "kv_index_blocks", "reason"} <= set(listed["e1"])

        assert (await client.delete("/admin/engines/e9", headers=ADMIN)).status_code == 404
        assert (await client.delete("/admin/engines/e0")).status_code == 401
        removed = await client.delete("/admin/engines/e0", headers=ADMIN)
        assert removed.status_code == 200 and removed.json()["id"] == "e0"
        with trio.fail_after(20):
            while any(e["id"] == "e0" for e in await admin_engines(client)):
                await trio.sleep(0.05)
        assert (await client.get("/admin/engines", headers=ADMIN)).json()["excluded"] == [a.url]
        model = (await client.get("/v1/models", headers={"authorization": "Bearer client-key"})).json()["data"][0]["id"]
        before = await requests_served(a.url)
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        for _ in range(4):
            reply = await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer client-key"})
            assert reply.status_code == 200
        assert await requests_served(a.url) == before
    await wait_until(lambda: established_connections("127.0.0.2", a.port) == 0, timeout=10)


async def test_without_an_admin_key_the_admin_api_does_not_exist(aio_loop, nursery):
    a = await start_mock_engine(nursery, *ENGINE)
    base = await start_frontend(nursery, "--engine-url", a.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for method, path in (("GET", "/admin/engines"), ("POST", "/admin/engines"), ("DELETE", "/admin/engines/e0")):
            reply = await client.request(method, path, headers=ADMIN)
            assert reply.status_code == 404 and reply.json()["error"]["type"] == "not_found_error"


async def test_prefill_and_decode_engines_from_a_file_drain_like_any_other(aio_loop, nursery, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        bootstrap = str(sock.getsockname()[1])
    prefill = await start_mock_engine(
        nursery, "--role", "prefill", "--disaggregation-bootstrap-port", bootstrap, *ENGINE
    )
    decodes = [await start_mock_engine(nursery, "--role", "decode", *ENGINE) for _ in range(3)]
    path = tmp_path / "engines.json"

    def write(*engines) -> None:
        entries = [{"url": prefill.url, "role": "prefill"}] + [{"url": d.url, "role": "decode"} for d in engines]
        path.write_text(json.dumps(entries))

    write(*decodes)
    # Migration off: a stream cut at the drain timeout ends with an error event (with migration on it
    # moves instead; the test after this one).
    base = await start_frontend(
        nursery, "--engine-file", str(path), "--drain-timeout", "2", "--migration-limit", "0", *QUICK
    )
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert (await client.get("/debug/routing")).json()["disaggregated"]
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        load = Load(model)
        async with load.running(base):
            await wait_until(lambda: load.completed >= 8, timeout=30)

            # A decode engine leaves; its requests (~0.1 s each) finish within the drain timeout.
            write(decodes[1], decodes[2])
            with trio.fail_after(20):
                while decodes[0].url in {e["url"] for e in await admin_engines(client)}:
                    await trio.sleep(0.05)
            before = load.completed
            await wait_until(lambda: load.completed >= before + 8, timeout=30)
        assert load.failures == []
        # Past the drain timeout: a request still running on the leaving decode engine ends with an
        # error event, and both of its legs end on the engines.
        long_body = {"model": model, "messages": [{"role": "user", "content": "Go on"}], "max_tokens": 8000,
                     "stream": True, "ignore_eos": True}  # fmt: skip
        events: list = []

        async def read_stream() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=long_body) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])

        async with trio.open_nursery() as streams:
            for _ in range(2):
                streams.start_soon(read_stream)
            await wait_until(lambda: len(events) >= 10, timeout=20)
            on = [d for d in decodes[1:] if (await engine_accounting(d.url))["live"]]
            leaving = on[0]
            write(*(d for d in decodes[1:] if d is not leaving))
            # The cut comes ~2 s later. A stream on the decode engine that stays would run on for its
            # 8000 tokens (~40 s): once the cut has arrived, the client leaves it (its legs must end on
            # the engines all the same, checked below).
            await wait_until(lambda: any('"error"' in e for e in events), timeout=20)
            streams.cancel_scope.cancel()
    cut = [json.loads(e) for e in events if e.startswith("{") and '"error"' in e]
    assert len(cut) >= 1 and all(e["error"]["type"] for e in cut)
    for engine in (prefill, *decodes):
        with trio.fail_after(20):
            while not settled(await engine_accounting(engine.url)):
                await trio.sleep(0.05)
    host, port = leaving.url.removeprefix("grpc://").rsplit(":", 1)
    await wait_until(lambda: established_connections(host, int(port)) == 0, timeout=10)


async def test_a_stream_cut_at_the_drain_timeout_moves_to_another_decode_engine(aio_loop, nursery, tmp_path):
    """A scale-down loses nothing: the stream still running on a leaving decode engine when
    `--drain-timeout` ends gets its Abort there and goes on through a fresh prefill on the decode
    engine that stays, to its full length, with one finish_reason."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        bootstrap = str(sock.getsockname()[1])
    prefill = await start_mock_engine(
        nursery, "--role", "prefill", "--disaggregation-bootstrap-port", bootstrap, *ENGINE
    )
    decodes = [await start_mock_engine(nursery, "--role", "decode", *ENGINE) for _ in range(2)]
    path = tmp_path / "engines.json"

    def write(*engines) -> None:
        entries = [{"url": prefill.url, "role": "prefill"}] + [{"url": d.url, "role": "decode"} for d in engines]
        path.write_text(json.dumps(entries))

    write(*decodes)
    base = await start_frontend(nursery, "--engine-file", str(path), "--drain-timeout", "1", *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "Go on"}], "max_tokens": 1200,
                "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        events: list[dict] = []

        async def read_stream() -> None:
            async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for line in reply.aiter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))

        async with trio.open_nursery() as streams:
            streams.start_soon(read_stream)
            await wait_until(lambda: len(events) >= 10, timeout=20)
            leaving = [d for d in decodes if (await engine_accounting(d.url))["live"]][0]
            write(*(d for d in decodes if d is not leaving))
    assert not [e for e in events if "error" in e]
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["length"]
    assert events[-1]["usage"]["completion_tokens"] == 1200
    cut = await engine_accounting(leaving.url)
    assert cut["aborted"] + cut["cancelled"] >= 1  # ended there, not left running
    stays = next(d for d in decodes if d is not leaving)
    assert (await engine_accounting(stays.url))["finished"] >= 1
    for engine in (prefill, *decodes):
        with trio.fail_after(20):
            while not settled(await engine_accounting(engine.url)):
                await trio.sleep(0.05)
