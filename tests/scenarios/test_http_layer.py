"""The one HTTP layer as clients meet it: route table, auth, errors, CORS, metrics, timestamps, shutdown."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import aclosing
from functools import partial

import httpx
import openai
import pytest
import trio
from support import engine_accounting, start_frontend, start_mock_engine

FAST = ("--mock-speedup", "inf")


def chat(model: str, content: str = "Hello", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def model_of(client: httpx.AsyncClient) -> str:
    return (await client.get("/v1/models")).json()["data"][0]["id"]


async def test_created_is_each_requests_own_time_and_one_streams_chunks_share_it(aio_loop, nursery):
    base = await start_frontend(nursery, *FAST)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        first = (await client.post("/v1/chat/completions", json=chat(model))).json()["created"]
        await trio.sleep(1.1)
        before = int(time.time())
        second = (await client.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 2})).json()
        assert second["created"] >= before > first - 1 and second["created"] > first
        async with client.stream("POST", "/v1/chat/completions", json=chat(model, stream=True)) as response:
            stamps = {
                json.loads(line[6:])["created"]
                for line in (await response.aread()).decode().splitlines()
                if line[6:7] == "{"
            }
        assert len(stamps) == 1 and stamps.pop() >= second["created"]
        listed = (await client.get("/v1/models")).json()["data"][0]["created"]
        assert listed >= before


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_body_that_is_not_utf8_is_a_400_in_the_openai_envelope(aio_loop, nursery, path):
    base = await start_frontend(nursery, *FAST)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body = b'{"model": "m", "prompt": "\xff\xfe", "messages": [{"role": "user", "content": "\xc3\x28"}]}'
        reply = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and "UTF-8" in error["message"]


async def test_the_sdk_retrieves_a_model_and_an_unknown_one_is_not_found(aio_loop, nursery):
    base = await start_frontend(nursery, *FAST, "--served-model-name", "org/tiny-model")
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none")
    model = await client.models.retrieve("org/tiny-model")  # a name with a slash, as HF names have
    assert (model.id, model.object) == ("org/tiny-model", "model")
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("no-such-model")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_found"
    await client.close()


async def test_unknown_paths_and_methods_answer_in_the_openai_envelope(aio_loop, nursery):
    base = await start_frontend(nursery, *FAST)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        missing = await client.get("/v1/nothing-here")
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
        wrong = await client.get("/v1/chat/completions")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
        assert wrong.json()["error"]["message"] == "Method Not Allowed: GET /v1/chat/completions"


async def test_the_api_key_scheme_is_case_insensitive(aio_loop, nursery):
    base = await start_frontend(nursery, *FAST, "--api-key", "sekret")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for scheme in ("Bearer", "bearer", "BEARER"):
            reply = await client.get("/v1/models", headers={"authorization": f"{scheme} sekret"})
            assert reply.status_code == 200, scheme
        for header in ("Bearer wrong", "Basic sekret", "sekret", "Bearer"):
            reply = await client.get("/v1/models", headers={"authorization": header})
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key", header
        assert (await client.get("/health")).status_code == 200


async def test_with_an_api_key_unknown_paths_are_401_without_it_and_metrics_take_their_own_key(aio_loop, nursery):
    base = await start_frontend(nursery, *FAST, "--api-key", "sekret", "--metrics-api-key", "scrape")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for path in ("/v1/nothing-here", "/admin/engines", "/v1/chat/completions"):
            reply = await client.get(path)  # missing, off, wrong method: all alike without the key
            assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key", path
        keyed = {"authorization": "Bearer sekret"}
        assert (await client.get("/v1/nothing-here", headers=keyed)).status_code == 404
        assert (await client.get("/v1/chat/completions", headers=keyed)).status_code == 405
        assert (await client.get("/metrics")).status_code == 401
        assert (await client.get("/metrics", headers=keyed)).status_code == 401
        scraped = await client.get("/metrics", headers={"authorization": "Bearer scrape"})
        assert scraped.status_code == 200 and "trio_direct_requests_total" in scraped.text
        assert (await client.get("/live")).status_code == 200  # probes stay open


def _counter(metrics: str, labels: str) -> float:
    """The value of `trio_direct_requests_total{labels}` in an exposition (0 when absent)."""
    for line in metrics.splitlines():
        if line.startswith(f"trio_direct_requests_total{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_requests_refused_at_the_concurrency_limit_are_counted(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--incremental-streaming-output")  # real speed: slow enough
    base = await start_frontend(nursery, "--engine-url", engine.url, "--max-concurrent-requests", "1")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        refused = 'endpoint="chat",model="",status="429",stream=""'
        served = f'endpoint="chat",model="{model}",status="200",stream="false"'
        before = (await client.get("/metrics")).text  # the registry is the process's: count the change
        statuses: list[int] = []

        async def one() -> None:
            statuses.append((await client.post("/v1/chat/completions", json=chat(model, max_tokens=60))).status_code)

        async with trio.open_nursery() as requests:
            for _ in range(4):
                requests.start_soon(one)
        assert sorted(statuses) == [200, 429, 429, 429]
        after = (await client.get("/metrics")).text
        assert _counter(after, refused) - _counter(before, refused) == 3
        assert _counter(after, served) - _counter(before, served) == 1


async def test_cors_is_off_by_default_and_answers_preflights_when_configured(aio_loop, nursery):
    plain = await start_frontend(nursery, *FAST)
    async with httpx.AsyncClient(base_url=plain, timeout=30) as client:
        reply = await client.get("/v1/models", headers={"origin": "https://app.example"})
        assert "access-control-allow-origin" not in reply.headers
    base = await start_frontend(nursery, *FAST, "--api-key", "k", "--cors-allow-origins", "https://app.example")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        preflight = await client.options(
            "/v1/chat/completions",
            headers={
                "origin": "https://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type",
            },
        )
        assert preflight.status_code == 204  # no API key on a preflight: browsers send none
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert preflight.headers["access-control-allow-methods"] == "POST"
        assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
        allowed = await client.get("/v1/models", headers={"origin": "https://app.example", "authorization": "Bearer k"})
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert allowed.headers["vary"] == "Origin"
        other = await client.get("/v1/models", headers={"origin": "https://evil.example", "authorization": "Bearer k"})
        assert other.status_code == 200 and "access-control-allow-origin" not in other.headers


async def test_a_websocket_upgrade_is_refused_without_a_traceback(aio_loop, nursery, caplog):
    base = await start_frontend(nursery, *FAST)
    host, port = base.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    request = (
        "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await stream.send_all(request.encode())
    with trio.fail_after(10):
        head = await stream.receive_some(4096)
    await stream.aclose()
    assert head.split(b"\r\n", 1)[0].split(b" ")[1].startswith(b"4")
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelname == "ERROR"]


# ---- shutdown ------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def wait_healthy(client: httpx.AsyncClient) -> None:
    with trio.fail_after(60):
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.2)


async def _serve(nursery, *args: str):
    port = free_port()
    command = [sys.executable, "-m", "trio_direct", "serve", "--port", str(port), *args]
    process = await nursery.start(partial(trio.run_process, command, check=False, stderr=subprocess.DEVNULL))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        await wait_healthy(client)
    return process, f"http://127.0.0.1:{port}"


async def _stream_through_shutdown(process, client, signals: int) -> list[str]:
    model = await model_of(client)
    body = chat(model, "Tell a long story", max_tokens=3000, ignore_eos=True, stream=True)
    events = []
    async with (
        client.stream("POST", "/v1/chat/completions", json=body) as response,
        aclosing(response.aiter_lines()) as lines,
    ):
        async for line in lines:
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                for _ in range(signals):
                    process.send_signal(signal.SIGTERM)
                    await trio.sleep(0.2)
    return events


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2], ids=["drain-deadline", "second-signal"])
async def test_streams_still_open_at_shutdown_end_with_an_error_event_and_done(aio_loop, nursery, signals):
    engine = await start_mock_engine(nursery, "--incremental-streaming-output")  # ~6 ms a token: 18 s of output
    timeout = "1" if signals == 1 else "30"
    process, base = await _serve(nursery, "--engine-url", engine.url, "--graceful-shutdown-timeout", timeout)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        with trio.fail_after(15):
            events = await _stream_through_shutdown(process, client, signals)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "service_unavailable" and "shutting down" in error["message"]
    reason = "drain deadline" if signals == 1 else "second signal"
    assert reason in error["message"]
    with trio.fail_after(15):
        assert await process.wait() == 0
    account = await engine_accounting(engine.url)
    assert account["started"] == 1 and not account["live"], account
    assert account["aborted"] + account["cancelled"] == 1 and account["abort_rpcs"], account


async def test_streamed_bodies_go_straight_to_the_connection_and_http10_clients_still_get_theirs(
    aio_loop, nursery, monkeypatch
):
    """Under `serve`, SSE events are written as chunk frames by the project, not as ASGI messages
    through hypercorn and h11, and so are the stream's head and end, and a whole JSON answer; an
    HTTP/1.0 client, whose body h11 delimits by closing, is served through ASGI as before."""
    from hypercorn.protocol import h11 as hypercorn_h11
    from hypercorn.protocol.events import Body

    bodies: list[int] = []
    original = hypercorn_h11.H11Protocol.stream_send

    async def counting(self, event):
        if isinstance(event, Body):
            bodies.append(len(event.data))
        await original(self, event)

    monkeypatch.setattr(hypercorn_h11.H11Protocol, "stream_send", counting)
    base = await start_frontend(nursery, *FAST)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        assert bodies == [], "the model list (a whole JSON answer) went straight to the connection"
        body = chat(model, max_tokens=12, stream=True)
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["transfer-encoding"] == "chunked"
            lines = [line async for line in response.aiter_lines() if line]
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert lines[-1] == "data: [DONE]" and events[-1]["choices"][0]["finish_reason"] == "length"
        assert len(events) > 2 and bodies == [], "nothing of the stream went through ASGI"
        # the connection stays usable for the next request (h11 saw the whole response end)
        assert (await client.get("/v1/models")).status_code == 200
    bodies.clear()
    payload = json.dumps(body).encode()
    host, port = base.removeprefix("http://").split(":")
    with trio.fail_after(30):
        sock = await trio.open_tcp_stream(host, int(port))
        async with sock:
            await sock.send_all(
                b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%b" % (len(payload), payload)
            )
            raw = b""
            while data := await sock.receive_some(65536):
                raw += data
    head, _, text = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0] and b"transfer-encoding" not in head.lower()
    assert text.rstrip().endswith(b"data: [DONE]") and len(bodies) > 2
