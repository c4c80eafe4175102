"""Engines that are down when the frontend starts: it serves from the others, and they join later."""

from __future__ import annotations

import json
import socket
import uuid

import httpx
import pytest
import trio
from support import engine_accounting, start_frontend, start_mock_engine

pytestmark = pytest.mark.slow

FAST = ("--speedup", "inf", "--incremental-streaming-output")
#: Health checks (which also probe pending engines) every 0.2 s; start-up waits 0.5 s once one is up.
QUICK = ("--health-interval", "0.2", "--health-timeout", "0.5", "--engine-join-grace", "0.5")
KV_EVENTS = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": ""})
SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {j}: answer briefly and kindly." for j in range(30))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chat(model: str, question: str, system: str = "Be brief.") -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": 3}


async def served(url: str) -> set[str]:
    """Request ids the engine produced output for (health checks left out)."""
    account = await engine_accounting(url)
    return {rid for rid in account["first_output_at"] if not rid.startswith("HEALTH_CHECK")}


def rid_of(response: dict) -> str:
    return response["id"].split("-", 1)[1] + "0000"


async def routing(client: httpx.AsyncClient) -> dict:
    return (await client.get("/debug/routing")).json()


async def test_an_engine_down_at_start_up_joins_when_it_comes_up(aio_loop, nursery):
    first = await start_mock_engine(nursery, *FAST)
    port = free_port()
    late_url = f"grpc://127.0.0.1:{port}"
    base = await start_frontend(nursery, "--engine-url", first.url, "--engine-url", f"127.0.0.1:{port}", *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        state = await routing(client)
        assert [(p["engine"], p["url"]) for p in state["pending"]] == [("e1", f"127.0.0.1:{port}")]
        assert [w["engine"] for w in state["workers"]] == ["e0"]
        assert (await client.get("/health")).status_code == 200
        metrics = (await client.get("/metrics")).text
        # Its model is unknown until it answers (several models may be served): the label is empty.
        expected = f'trio_direct_engine_healthy{{engine="e1",model="",role="unknown",url="127.0.0.1:{port}"}} 0.0'
        assert expected in metrics
        for i in range(4):  # served meanwhile, all by the engine that is up
            assert (await client.post("/v1/chat/completions", json=chat(model, f"q{i}"))).status_code == 200
        assert len(await served(first.url)) == 4

        late = await start_mock_engine(nursery, *FAST, "--port", str(port))
        assert late.port == port
        with trio.fail_after(10):  # it joins within a few health intervals, then takes its turns
            while not await served(late_url):
                assert (await client.post("/v1/chat/completions", json=chat(model, "again"))).status_code == 200
                await trio.sleep(0.05)
        state = await routing(client)
        assert state["pending"] == []
        assert [(w["engine"], w["url"]) for w in state["workers"]] == [("e0", first.url), ("e1", f"127.0.0.1:{port}")]
        before = len(await served(late_url))
        for i in range(4):
            assert (await client.post("/v1/chat/completions", json=chat(model, f"round-robin {i}"))).status_code == 200
        assert len(await served(late_url)) == before + 2  # round-robin over both engines


async def test_a_joining_engine_of_another_model_is_served_as_a_model_of_its_own(aio_loop, nursery):
    first = await start_mock_engine(nursery, *FAST, "--served-model-name", "tiny")
    port = free_port()
    base = await start_frontend(nursery, "--engine-url", first.url, "--engine-url", f"127.0.0.1:{port}", *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["tiny"]
        await start_mock_engine(nursery, *FAST, "--served-model-name", "other", "--port", str(port))
        with trio.fail_after(10):
            while len((await client.get("/v1/models")).json()["data"]) < 2:
                await trio.sleep(0.05)
        assert sorted(m["id"] for m in (await client.get("/v1/models")).json()["data"]) == ["other", "tiny"]
        for i in range(4):
            assert (await client.post("/v1/chat/completions", json=chat("tiny", f"q{i}"))).status_code == 200
            assert (await client.post("/v1/chat/completions", json=chat("other", f"q{i}"))).status_code == 200
        state = (await routing(client))["models"]
        assert [w["engine"] for w in state["tiny"]["workers"]] == ["e0"]
        assert [w["engine"] for w in state["other"]["workers"]] == ["e1"]
    assert len(await served(first.url)) == 4
    assert len(await served(f"grpc://127.0.0.1:{port}")) == 4


async def test_a_joining_engine_that_disagrees_with_its_model_stays_out(aio_loop, nursery):
    first = await start_mock_engine(nursery, *FAST, "--served-model-name", "tiny", "--page-size", "1")
    port = free_port()
    base = await start_frontend(nursery, "--engine-url", first.url, "--engine-url", f"127.0.0.1:{port}", *QUICK)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await start_mock_engine(nursery, *FAST, "--served-model-name", "tiny", "--page-size", "16", "--port", str(port))
        with trio.fail_after(10):  # probed, and refused
            while "block size (page_size) 16" not in (await routing(client))["pending"][0]["reason"]:
                await trio.sleep(0.05)
        for i in range(4):
            assert (await client.post("/v1/chat/completions", json=chat("tiny", f"q{i}"))).status_code == 200
        state = await routing(client)
        assert [w["engine"] for w in state["workers"]] == ["e0"] and [p["engine"] for p in state["pending"]] == ["e1"]
    assert len(await served(first.url)) == 4
    assert not await served(f"grpc://127.0.0.1:{port}")


async def test_in_kv_mode_a_joining_engine_s_kv_events_are_indexed(aio_loop, nursery):
    first = await start_mock_engine(nursery, *FAST, "--kv-events-config", KV_EVENTS)
    port = free_port()
    late_url = f"grpc://127.0.0.1:{port}"
    base = await start_frontend(
        nursery, "--router-mode", "kv", "--engine-url", first.url, "--engine-url", f"127.0.0.1:{port}", *QUICK
    )
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        assert list((await routing(client))["kv"]["subscribers"]) == ["e0"]
        await start_mock_engine(nursery, *FAST, "--kv-events-config", KV_EVENTS, "--port", str(port))
        with trio.fail_after(10):
            while (await routing(client))["pending"]:
                await trio.sleep(0.05)
        assert list((await routing(client))["kv"]["subscribers"]) == ["e0", "e1"]

        # A prompt new to both engines (no shared first block) goes to either, a tie broken at
        # random: ask until one lands on the joined engine.
        with trio.fail_after(20):
            for _ in range(100):
                system = f"{uuid.uuid4().hex} {SYSTEM}"
                response = (await client.post("/v1/chat/completions", json=chat(model, "Hi", system))).json()
                if rid_of(response) in await served(late_url):
                    break
            else:
                raise AssertionError("no request reached the joined engine")
        with trio.fail_after(10):  # its KV events arrive and are indexed
            while (await routing(client))["kv"]["subscribers"]["e1"]["batches"] == 0:
                await trio.sleep(0.02)
        explained = (await client.post("/debug/routing", json=chat(model, "Hello?", system))).json()
        again = (await client.post("/v1/chat/completions", json=chat(model, "Hello?", system))).json()
    overlaps = {c["engine_id"]: c["overlap_blocks"] for c in explained["route"]["decision"]["candidates"]}
    assert overlaps["e1"] > 0 and overlaps["e0"] == 0
    assert rid_of(again) in await served(late_url)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_a_late_prefill_engine_joins_only_in_the_role_its_flag_says(aio_loop, nursery):
    decode = await start_mock_engine(nursery, *FAST, "--role", "decode")
    port = free_port()
    late_url = f"grpc://127.0.0.1:{port}"
    base = await start_frontend(
        nursery, "--engine-url", decode.url, "--prefill-engine-url", f"127.0.0.1:{port}", "--served-model-name", "m",
        *QUICK,
    )  # fmt: skip
    body = chat("m", "Split me")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert (await client.get("/health")).status_code == 503  # a decode engine never serves alone
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 503

        wrong = await start_mock_engine(nursery, *FAST, "--port", str(port))  # aggregated, not prefill
        with trio.fail_after(10):
            while "not 'prefill'" not in (await routing(client))["pending"][0]["reason"]:
                await trio.sleep(0.05)
        assert (await client.get("/health")).status_code == 503
        wrong.process.kill()
        await wrong.process.wait()

        bootstrap = str(free_port())
        await start_mock_engine(
            nursery, *FAST, "--role", "prefill", "--disaggregation-bootstrap-port", bootstrap, "--port", str(port)
        )
        with trio.fail_after(10):
            while (await client.get("/health")).status_code != 200:
                await trio.sleep(0.05)
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200 and (await routing(client))["disaggregated"]
    rid = rid_of(reply.json())
    assert rid in await served(late_url) and rid in await served(decode.url)
