"""Prefill/decode disaggregation through mock engines that hold the real bootstrap rendezvous."""

from __future__ import annotations

import json
import random
import socket
from contextlib import aclosing

import httpx
import pytest
import trio
from support import RawSseClient, engine_accounting, settled_accounts, start_frontend, start_mock_engine

pytestmark = pytest.mark.slow


INCREMENTAL = "--incremental-streaming-output"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_prefill(nursery, *args: str):
    return await start_mock_engine(
        nursery, "--role", "prefill", "--disaggregation-bootstrap-port", str(free_port()), INCREMENTAL, *args
    )


async def start_decode(nursery, *args: str):
    return await start_mock_engine(nursery, "--role", "decode", INCREMENTAL, *args)


def chats(account: dict) -> list[str]:
    return [rid for rid in account["first_output_at"] if not rid.startswith("HEALTH_CHECK")]


def assert_no_early_decode_abort(decode_account: dict) -> None:
    """The decode leg is never aborted before its first message (the KV transfer) arrived."""
    first = decode_account["first_output_at"]
    for rid, at in decode_account["abort_rpcs"]:
        assert rid in first and first[rid] <= at, f"decode leg {rid} aborted before its first message"


async def settle(*engines) -> list[dict]:
    """Accounts once no engine holds a live request and the Aborts owed arrived (bounded)."""
    return await settled_accounts([e.url for e in engines])


async def model_of(base: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        return (await client.get("/v1/models")).json()["data"][0]["id"]


@pytest.mark.parametrize("api", ["both", "vllm"])
async def test_four_chats_pair_distinct_prefill_and_decode_engines(aio_loop, nursery, api):
    """SGLang pairs by a shared bootstrap room; vLLM's connector hands the prefill's parameters on."""
    prefills = [await start_prefill(nursery, "--api", api, "--speedup", "inf") for _ in range(2)]
    decodes = [await start_decode(nursery, "--api", api, "--speedup", "inf") for _ in range(2)]
    base = await start_frontend(
        nursery,
        *(a for p in prefills for a in ("--prefill-engine-url", p.url)),
        *(a for d in decodes for a in ("--engine-url", d.url)),
    )
    model = await model_of(base)
    body = {"model": model, "messages": [{"role": "user", "content": "Split me"}], "max_tokens": 6}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for stream in (False, True, False, True):
            if not stream:
                reply = (await client.post("/v1/chat/completions", json=body)).json()
                assert reply["choices"][0]["finish_reason"] == "length"
                assert reply["usage"]["completion_tokens"] == 6 and reply["usage"]["prompt_tokens"] > 0
                continue
            events = [e async for e in RawSseClient(base).events("/v1/chat/completions", body | {"stream": True})]
            assert events[-1] == "[DONE]"
            assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) != ""
    accounts = await settle(*prefills, *decodes)
    assert [len(chats(a)) for a in accounts] == [2, 2, 2, 2]
    if api == "vllm":  # the prefill's completion parameters reached the decode leg verbatim
        handed = [r["kv_transfer_params"] for a in accounts[2:] for r in a["requests"].values()]
        assert len(handed) == 4 and all(p["do_remote_prefill"] and p["remote_room"] >= 0 for p in handed)
        asked = [r["kv_transfer_params"]["do_remote_decode"] for a in accounts[:2] for r in a["requests"].values()]
        assert asked == [True] * 4
    for prefill, decode in ((accounts[0], accounts[2]), (accounts[1], accounts[3])):
        assert prefill["finished"] == prefill["started"] and decode["finished"] == decode["started"]


async def test_an_engine_given_in_the_wrong_role_stops_start_up(aio_loop, nursery):
    from trio_direct.fleet.fleet import FleetError

    decode = await start_decode(nursery, "--speedup", "inf")
    with pytest.RaisesGroup(pytest.RaisesExc(FleetError, match="reports role 'decode'"), flatten_subgroups=True):
        async with trio.open_nursery() as inner:
            await start_frontend(inner, "--prefill-engine-url", decode.url)


async def test_vllm_engines_that_could_not_hand_over_kv_stop_start_up(aio_loop, nursery, monkeypatch):
    """The operator's pairing protocol (SMG_PAIRING_PROTOCOL in each engine's environment) differs."""
    from trio_direct.fleet.fleet import FleetError

    monkeypatch.setenv("SMG_PAIRING_PROTOCOL", "nixl-v1")
    prefill = await start_prefill(nursery, "--api", "vllm", "--speedup", "inf")
    monkeypatch.setenv("SMG_PAIRING_PROTOCOL", "nixl-v2")
    decode = await start_decode(nursery, "--api", "vllm", "--speedup", "inf")
    refused = pytest.RaisesExc(FleetError, match="pairing_protocol 'nixl-v[12]', but engine .* must agree on it")
    with pytest.RaisesGroup(refused, flatten_subgroups=True):
        async with trio.open_nursery() as inner:
            await start_frontend(inner, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)


async def disconnect_after(
    base: str, model: str, events_to_read: int, *, prompt_words: int = 5, linger: float = 0.0
) -> None:
    """Stream a chat and hang up after `events_to_read` SSE events (0: right after sending) and
    `linger` more seconds."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": " ".join(["word"] * prompt_words)}],
        "max_tokens": 40,
        "stream": True,
    }
    if events_to_read == 0:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        payload = json.dumps(body).encode()
        stream = await trio.open_tcp_stream(host, int(port))
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        await stream.send_all(head.encode() + b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        await stream.aclose()
        return
    async with aclosing(RawSseClient(base).events("/v1/chat/completions", body)) as events:
        seen = 0
        async for _event in events:
            seen += 1
            if seen >= events_to_read:
                await trio.sleep(linger)
                return


@pytest.mark.parametrize(
    ("case", "events_to_read", "linger"),
    [
        ("disconnect before dispatch", 0, 0.0),
        ("disconnect while prefill runs and decode waits at the rendezvous", 1, 0.05),
        ("disconnect right after the first token", 2, 0.0),
        ("disconnect mid-stream", 6, 0.0),
    ],
)
async def test_disconnects_leave_no_request_and_no_early_decode_abort(aio_loop, nursery, case, events_to_read, linger):
    # A slow prefill (speed 0.2x) with a long prompt keeps the decode leg waiting at the rendezvous;
    # a decode leg whose prefill leg never reached its engine gives up after 3 s, as SGLang's does.
    prefill = await start_prefill(nursery, "--speedup", "0.2")
    decode = await start_decode(nursery, "--bootstrap-timeout", "3")
    base = await start_frontend(nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)
    model = await model_of(base)
    for _ in range(3):
        await disconnect_after(base, model, events_to_read, prompt_words=400, linger=linger)
    prefill_account, decode_account = await settle(prefill, decode)
    assert_no_early_decode_abort(decode_account)
    for account in (prefill_account, decode_account):
        assert account["started"] == account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]
    if events_to_read > 1:  # tokens were flowing: every decode leg was cut, and aborted once
        assert decode_account["started"] == 3 and len(decode_account["abort_rpcs"]) == 3


async def test_a_prefill_engine_that_dies_fails_the_request_cleanly(aio_loop, nursery):
    prefill = await start_prefill(nursery, "--speedup", "inf")
    decode = await start_decode(nursery, "--speedup", "inf", "--bootstrap-timeout", "1")
    base = await start_frontend(
        nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url, "--decode-abort-deadline", "3"
    )
    model = await model_of(base)
    prefill.process.kill()
    await prefill.process.wait()
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        with trio.fail_after(15):
            reply = await client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
            )
    assert reply.status_code in (502, 503)
    assert "error" in reply.json()
    (decode_account,) = await settle(decode)
    assert_no_early_decode_abort(decode_account)


async def test_a_decode_engine_that_dies_fails_the_request_and_aborts_the_prefill_leg(aio_loop, nursery):
    prefill = await start_prefill(nursery, "--speedup", "inf", "--bootstrap-timeout", "2")
    decode = await start_decode(nursery, "--speedup", "inf")
    base = await start_frontend(nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)
    model = await model_of(base)
    decode.process.kill()
    await decode.process.wait()
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        with trio.fail_after(15):
            reply = await client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4},
            )
    assert reply.status_code in (502, 503)
    (prefill_account,) = await settle(prefill)
    assert (
        prefill_account["started"]
        == prefill_account["aborted"] + prefill_account["cancelled"] + prefill_account["failed"]
    )


async def test_a_rendezvous_timeout_fails_the_request(aio_loop, nursery):
    # The prefill takes ~seconds (speed 0.02x on a long prompt); decode gives up after 0.5 s.
    prefill = await start_prefill(nursery, "--speedup", "0.02")
    decode = await start_decode(nursery, "--bootstrap-timeout", "0.5")
    base = await start_frontend(nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)
    model = await model_of(base)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        with trio.fail_after(20):
            reply = await client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "word " * 400}], "max_tokens": 4},
            )
        assert reply.status_code == 502
        assert "abort" in reply.json()["error"]["message"].lower()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "word " * 400}],
            "max_tokens": 4,
            "stream": True,
        }
        events = [e async for e in RawSseClient(base).events("/v1/chat/completions", body)]
    assert events[-1] == "[DONE]" and "error" in events[-2], "a streamed request ends with an error event"
    prefill_account, decode_account = await settle(prefill, decode)
    assert_no_early_decode_abort(decode_account)
    assert not prefill_account["live"]


async def test_five_hundred_random_disconnects(aio_loop, nursery):
    prefill = await start_prefill(nursery, "--speedup", "2")
    decode = await start_decode(nursery, "--speedup", "2", "--bootstrap-timeout", "3")
    base = await start_frontend(nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)
    model = await model_of(base)
    rng = random.Random(5)
    limiter = trio.Semaphore(25)

    async def one() -> None:
        async with limiter:
            await disconnect_after(
                base,
                model,
                rng.choice([0, 1, 1, 2, 3, 5, 8, 100]),
                prompt_words=rng.choice([5, 200]),
                linger=rng.random() * 0.02,
            )

    async with trio.open_nursery() as requests:
        for _ in range(500):
            requests.start_soon(one)
    prefill_account, decode_account = await settle(prefill, decode)
    assert_no_early_decode_abort(decode_account)
    for account in (prefill_account, decode_account):
        ended = account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]
        assert account["started"] == ended, json.dumps({k: v for k, v in account.items() if k != "first_output_at"})


async def test_kv_routing_sends_a_shared_prefix_to_the_prefill_engine_that_has_it(aio_loop, nursery):
    kv = json.dumps({"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": ""})
    prefills = [await start_prefill(nursery, "--speedup", "inf", "--kv-events-config", kv) for _ in range(2)]
    decode = await start_decode(nursery, "--speedup", "inf")
    base = await start_frontend(
        nursery, "--router-mode", "kv", "--engine-url", decode.url,
        *(a for p in prefills for a in ("--prefill-engine-url", p.url)),
    )  # fmt: skip
    model = await model_of(base)
    system = "You are a careful assistant. " + "Always cite the rules. " * 60
    body: dict = {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "one"}],
        "max_tokens": 3,
    }
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        first = (await client.post("/v1/chat/completions", json=body)).json()
        with trio.fail_after(10):
            while (await client.get("/debug/routing")).json()["kv"]["index"]["blocks"] == 0:
                await trio.sleep(0.02)
        body["messages"][1]["content"] = "two"
        second = (await client.post("/v1/chat/completions", json=body)).json()
        report = (await client.post("/debug/routing", json=body)).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, "the prefill leg hit its cache"
    accounts = [await engine_accounting(p.url) for p in prefills]
    served = [len(chats(a)) for a in accounts]
    assert sorted(served) == [0, 2], f"both requests went to one prefill engine: {served}"
    assert report["route"]["prefill"]["engine"] == ["e1", "e2"][served.index(2)]
    assert report["route"]["decode"]["engine"] == "e0"
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
