"""Under overload and engine failure (issue #19): requests queue instead of being refused, busy
engines get nothing new, streams of a dead or hung engine finish on another one, and every request
is traceable from the client's id to the engine's work.

Real `trio-direct mock-engine` processes where engines die (kill -9, SIGSTOP); in-process servers
elsewhere. Each stream's text is checked against the mock's scripted answer, token for token: a
migrated stream shows neither a gap nor a repeat.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import pytest
import trio
from support import engine_accounting, settled_accounts, start_frontend, start_mock_engine, wait_until
from tokenizers import Tokenizer

from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model

INCREMENTAL = "--incremental-streaming-output"
#: The mock's answer to every prompt: numbered words, so that a lost or repeated token shows.
ANSWER = " ".join(f"w{i:03d}" for i in range(100))
MAX_TOKENS = 160  # of the answer's 400 tokens


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("script") / "answer.json"
    path.write_text(json.dumps([{"match": None, "text": ANSWER, "resumable": True}]))
    return path


@pytest.fixture(scope="module")
def expected_text() -> str:
    """The first MAX_TOKENS tokens of the answer, as text."""
    tokenizer = Tokenizer.from_file(str(ensure_tiny_model(default_tiny_model_dir()) / "tokenizer.json"))
    ids = tokenizer.encode(ANSWER, add_special_tokens=False).ids
    return tokenizer.decode(ids[:MAX_TOKENS])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def model_of(client: httpx.AsyncClient) -> str:
    return (await client.get("/v1/models")).json()["data"][0]["id"]


def chat(model: str, question: str = "Count.", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS, **extra}


async def stream_chat(client: httpx.AsyncClient, body: dict, into: dict) -> None:
    """Read one streamed chat completion: its text, finish reasons, usage, errors and raw lines."""
    into.update(text="", finishes=[], usage=None, errors=[], lines=[], done=False, id=None, chunks=0)
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        into["status"] = response.status_code
        into["request_id"] = response.headers.get("x-request-id")
        async for line in response.aiter_lines():
            into["lines"].append(line)
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                into["done"] = True
                continue
            event = json.loads(data)
            if "error" in event:
                into["errors"].append(event["error"])
                continue
            into["id"] = event["id"]
            if event.get("usage"):
                into["usage"] = event["usage"]
            for choice in event["choices"]:
                into["text"] += choice["delta"].get("content") or ""
                into["chunks"] += 1
                if choice["finish_reason"]:
                    into["finishes"].append(choice["finish_reason"])


def served_rid(response_id: str, choice: int = 0) -> str:
    return response_id.split("-", 1)[1] + f"{choice:04x}"


async def metric(client: httpx.AsyncClient, name: str) -> float:
    total = 0.0
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.split()[-1])
    return total


async def metric_at_least(client: httpx.AsyncClient, name: str, value: float) -> bool:
    return await metric(client, name) >= value


async def metric_is(client: httpx.AsyncClient, name: str, value: float) -> bool:
    return await metric(client, name) == value


async def until(check, timeout: float = 10.0, interval: float = 0.02) -> None:
    """Poll the async predicate `check` until it holds; fail the test after `timeout` seconds."""
    for _ in range(int(timeout / interval)):
        if await check():
            return
        await trio.sleep(interval)
    raise AssertionError(f"not within {timeout:g}s")


async def settle(urls: list[str], timeout: float = 20.0) -> list[dict]:
    return await settled_accounts(urls, timeout)


def ended(account: dict) -> int:
    return account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]


async def routable(client: httpx.AsyncClient) -> set[str]:
    return {w["engine"] for w in (await client.get("/debug/routing")).json()["workers"]}


# ---- 1. admission: a queue in front of dispatch ---------------------------------------------------


@pytest.mark.slow
async def test_past_the_limit_requests_wait_in_the_queue_and_past_the_queue_get_429(aio_loop, nursery, script):
    engine = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))  # real speed
    flags = ("--max-concurrent-requests", "2", "--max-queued-requests", "2", "--queue-timeout", "60")
    base = await start_frontend(nursery, "--engine-url", engine.url, *flags)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        replies: list[httpx.Response] = []
        waits = await metric(client, "trio_direct_queue_wait_seconds_count")  # metrics are per process
        limited = await metric(client, 'trio_direct_admission_rejections_total{reason="limit"}')

        async def one() -> None:
            replies.append(await client.post("/v1/chat/completions", json=chat(model, max_tokens=60)))

        async with trio.open_nursery() as requests:
            for _ in range(6):
                requests.start_soon(one)
        assert sorted(r.status_code for r in replies) == [200, 200, 200, 200, 429, 429]
        refused = [r for r in replies if r.status_code == 429]
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_error" for r in refused)
        assert await metric(client, "trio_direct_queue_wait_seconds_count") == waits + 2  # two waited, then ran
        assert await metric(client, 'trio_direct_admission_rejections_total{reason="limit"}') == limited + 2
        assert await metric(client, "trio_direct_queue_depth") == 0
    (account,) = await settle([engine.url])
    assert account["started"] == 4 == ended(account)


@pytest.mark.slow
async def test_a_request_that_waits_too_long_gets_503_and_a_queued_client_that_leaves_costs_nothing(
    aio_loop, nursery, script
):
    engine = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))
    flags = ("--max-concurrent-requests", "1", "--max-queued-requests", "5", "--queue-timeout", "0.5")
    base = await start_frontend(nursery, "--engine-url", engine.url, *flags)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        running: dict = {}
        timeouts = await metric(client, 'trio_direct_admission_rejections_total{reason="timeout"}')
        async with trio.open_nursery() as requests:
            requests.start_soon(stream_chat, client, chat(model, max_tokens=300), running)
            await wait_until(lambda: running.get("chunks", 0) > 0, timeout=20)
            late = await client.post("/v1/chat/completions", json=chat(model, max_tokens=5))
            assert late.status_code == 503 and late.headers["retry-after"] == "1"
            assert "waited" in late.json()["error"]["message"]
            # A client that gives up while queued: nothing of it reaches the engine.
            before = (await engine_accounting(engine.url))["started"]
            with trio.move_on_after(0.2):
                await client.post("/v1/chat/completions", json=chat(model, max_tokens=5))
            await trio.sleep(0.6)
            assert await metric(client, "trio_direct_queue_depth") == 0
            assert (await engine_accounting(engine.url))["started"] == before
        assert running["done"] and not running["errors"]
        assert await metric(client, 'trio_direct_admission_rejections_total{reason="timeout"}') == timeouts + 1


@pytest.mark.slow
async def test_queued_requests_go_by_priority_and_the_engine_gets_it(aio_loop, nursery, script):
    engine = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))
    flags = ("--max-concurrent-requests", "1", "--max-queued-requests", "10", "--queue-timeout", "60")
    base = await start_frontend(nursery, "--engine-url", engine.url, *flags)
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        holder: dict = {}
        order: list[int] = []

        async def ask(priority: int) -> None:
            reply = await client.post("/v1/chat/completions", json=chat(model, max_tokens=3, priority=priority))
            assert reply.status_code == 200, reply.text
            order.append(priority)
            rid = served_rid(reply.json()["id"])
            assert (await engine_accounting(engine.url))["requests"][rid]["priority"] == priority

        async with trio.open_nursery() as requests:
            requests.start_soon(stream_chat, client, chat(model, max_tokens=400), holder)
            await wait_until(lambda: holder.get("chunks", 0) > 0, timeout=20)
            for priority in (0, 10, 5, -3, 7):
                requests.start_soon(ask, priority)
            await until(lambda: metric_at_least(client, "trio_direct_queue_depth", 5))
        assert order == [10, 7, 5, 0, -3]
        bad = await client.post("/v1/chat/completions", json=chat(model, priority="high"))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"


# ---- 2. busy engines ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_busy_engine_gets_nothing_new_and_when_all_are_busy_requests_wait(aio_loop, nursery, script):
    busy = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))
    idle = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))
    # Another frontend's load: three long streams on the first engine, invisible but to GetLoad.
    other = await start_frontend(nursery, "--engine-url", busy.url)
    flags = ("--engine-busy-threshold", "3", "--load-poll-interval", "0.1", "--max-queued-requests", "4",
             "--queue-timeout", "60")  # fmt: skip
    base = await start_frontend(nursery, "--engine-url", busy.url, "--engine-url", idle.url, *flags)
    async with (
        httpx.AsyncClient(base_url=other, timeout=60) as loader,
        httpx.AsyncClient(base_url=base, timeout=60) as client,
    ):
        model = await model_of(client)
        load: list[dict] = [{} for _ in range(3)]
        async with trio.open_nursery() as loading:
            for into in load:
                loading.start_soon(stream_chat, loader, chat(model, max_tokens=400), into)
            await wait_until(lambda: all(i.get("chunks", 0) > 0 for i in load), timeout=20)
            await trio.sleep(0.3)  # a poll or two
            started = (await engine_accounting(busy.url))["started"]
            for i in range(6):
                reply = await client.post("/v1/chat/completions", json=chat(model, f"q{i}", max_tokens=2))
                assert reply.status_code == 200, reply.text
            assert (await engine_accounting(busy.url))["started"] == started, "the busy engine got new requests"
            # Now the idle engine gets busy too (three streams through this frontend): the next
            # request waits for room rather than pile onto either engine.
            mine: list[dict] = [{} for _ in range(3)]
            for into in mine:
                loading.start_soon(stream_chat, client, chat(model, max_tokens=120), into)
            await wait_until(lambda: all(i.get("chunks", 0) > 0 for i in mine), timeout=20)
            waited: dict = {}
            loading.start_soon(stream_chat, client, chat(model, "patient", max_tokens=2), waited)
            await until(lambda: metric_at_least(client, "trio_direct_queue_depth", 1))
            assert not waited.get("chunks"), "a request went to a busy engine"
        assert waited["done"] and not waited["errors"] and waited["finishes"] == ["length"]
        assert all(not i["errors"] for i in load + mine)


# ---- 3. migration of a broken stream ---------------------------------------------------------------


def assert_whole(stream: dict, expected_text: str) -> None:
    """One uninterrupted stream: the scripted text exactly, one finish, usage as the client saw it."""
    assert stream["status"] == 200 and stream["done"], stream["lines"][-3:]
    assert not stream["errors"], stream["errors"]
    assert stream["text"] == expected_text, (stream["text"][:200], expected_text[:200])
    assert stream["finishes"] == ["length"]
    assert stream["usage"]["completion_tokens"] == MAX_TOKENS


async def under_way_on(url: str, streams: list[dict], timeout: float = 60.0) -> int:
    """Wait until streams run on the engine at `url`: once half of all streams are under way, or
    sooner if one of those on the engine is half done (under load streams start far apart, and
    waiting for the last ones would let the engine's finish first); returns how many run there,
    by the engine's own account (a client in this busy process may read well behind it)."""
    for _ in range(int(timeout / 0.02)):
        if any(s.get("chunks", 0) >= 3 for s in streams):
            account = await engine_accounting(url)
            served, live = set(account["first_output_at"]), set(account["live"])
            mine = [s for s in streams if s.get("chunks", 0) >= 3 and served_rid(s["id"]) in served]
            # Still running at the engine (the client's view lags), with most of the answer to come.
            running = [s for s in mine if served_rid(s["id"]) in live and s["chunks"] < MAX_TOKENS // 2]
            enough = sum(s.get("chunks", 0) >= 3 for s in streams) >= len(streams) // 2
            if running and (enough or any(s["chunks"] >= MAX_TOKENS // 2 for s in mine)):
                return len(running)
        await trio.sleep(0.02)
    raise AssertionError(f"no stream under way on {url} within {timeout:g}s")


def continuations(account: dict, streams: list[dict]) -> list[str]:
    """The rids an engine served that no client request started: the migrated streams' continuations."""
    originals = {served_rid(s["id"]) for s in streams}
    return [rid for rid in account["requests"] if rid not in originals]


@pytest.mark.slow
async def test_streams_of_an_engine_killed_mid_way_complete_on_the_other(aio_loop, nursery, script, expected_text):
    args = (INCREMENTAL, "--scripted-outputs", str(script), "--speedup", "0.25")  # ~24 ms a token
    flaky, steady = await start_mock_engine(nursery, *args), await start_mock_engine(nursery, *args)
    base = await start_frontend(
        nursery, "--engine-url", flaky.url, "--engine-url", steady.url, "--health-interval", "0.3",
        "--health-timeout", "10", "--abort-timeout", "1",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=100)) as client:
        model = await model_of(client)
        streams: list[dict] = [{} for _ in range(50)]
        migrated = await metric(client, 'trio_direct_migrations_total{outcome="migrated"}')
        async with trio.open_nursery() as reading:
            for i, into in enumerate(streams):
                reading.start_soon(stream_chat, client, chat(model, f"story {i}"), into)
            running = await under_way_on(flaky.url, streams)
            flaky.process.kill()  # SIGKILL, mid-stream
            await flaky.process.wait()
        for stream in streams:
            assert_whole(stream, expected_text)
        (account,) = await settle([steady.url])
        assert account["started"] == ended(account)
        moved = continuations(account, streams)  # the killed engine's streams that had not finished
        assert running and moved  # (some of the `running` ones may have finished just before the kill)
        assert await metric(client, 'trio_direct_migrations_total{outcome="migrated"}') == migrated + len(moved)
        assert "e0" not in await routable(client)
        await until(lambda: metric_is(client, "trio_direct_requests_in_flight", 0))


@pytest.mark.slow
async def test_streams_of_a_stopped_engine_move_within_the_idle_timeout(aio_loop, nursery, script, expected_text):
    args = (INCREMENTAL, "--scripted-outputs", str(script), "--speedup", "0.5")
    flaky, steady = await start_mock_engine(nursery, *args), await start_mock_engine(nursery, *args)
    base = await start_frontend(
        nursery, "--engine-url", flaky.url, "--engine-url", steady.url, "--stream-idle-timeout", "1",
        "--abort-timeout", "0.5", "--health-interval", "0.5", "--health-timeout", "0.5",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        streams: list[dict] = [{} for _ in range(8)]
        stalls = await metric(client, "trio_direct_engine_stalls_total")
        retries = await metric(client, "trio_direct_retries_total")
        try:
            async with trio.open_nursery() as reading:
                for i, into in enumerate(streams):
                    reading.start_soon(stream_chat, client, chat(model, f"story {i}"), into)
                running = await under_way_on(flaky.url, streams)
                flaky.process.send_signal(signal.SIGSTOP)  # alive to TCP, silent to everyone
                await wait_until(lambda: all(s.get("done") for s in streams), timeout=30)
            for stream in streams:
                assert_whole(stream, expected_text)
            assert "e0" not in await routable(client), "the hung engine was marked down"
            (account,) = await settle([steady.url])
            moved = continuations(account, streams)
            assert running and moved
            # Each stalled call went on elsewhere: as a continuation under a new rid, or, when it had
            # not sent its first token yet (a stream that had only just reached the engine when it
            # stopped), as a retry under its own.
            retried = await metric(client, "trio_direct_retries_total") - retries
            assert await metric(client, "trio_direct_engine_stalls_total") == stalls + len(moved) + retried
        finally:
            flaky.process.send_signal(signal.SIGCONT)


@pytest.mark.slow
async def test_keepalive_pings_notice_a_dead_connection_and_its_streams_move(aio_loop, nursery, script, expected_text):
    """No idle timeout here: only the HTTP/2 pings can tell that the stopped engine is gone."""
    args = (INCREMENTAL, "--scripted-outputs", str(script), "--speedup", "0.5")
    flaky, steady = await start_mock_engine(nursery, *args), await start_mock_engine(nursery, *args)
    base = await start_frontend(
        nursery, "--engine-url", flaky.url, "--engine-url", steady.url, "--stream-idle-timeout", "0",
        "--engine-keepalive-interval", "0.5", "--engine-keepalive-timeout", "0.5", "--abort-timeout", "0.5",
        "--health-interval", "0",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        streams: list[dict] = [{} for _ in range(4)]
        try:
            async with trio.open_nursery() as reading:
                for i, into in enumerate(streams):
                    reading.start_soon(stream_chat, client, chat(model, f"story {i}"), into)
                await under_way_on(flaky.url, streams)
                flaky.process.send_signal(signal.SIGSTOP)
                await wait_until(lambda: all(s.get("done") for s in streams), timeout=30)
            for stream in streams:
                assert_whole(stream, expected_text)
        finally:
            flaky.process.send_signal(signal.SIGCONT)


@pytest.mark.slow
async def test_a_decode_engine_lost_mid_stream_continues_through_a_fresh_prefill(
    aio_loop, nursery, script, expected_text
):
    bootstrap = ("--disaggregation-bootstrap-port", str(free_port()))
    common = (INCREMENTAL, "--scripted-outputs", str(script))
    prefill = await start_mock_engine(nursery, "--role", "prefill", *common, *bootstrap)
    decodes = [await start_mock_engine(nursery, "--role", "decode", *common, "--speedup", "0.5") for _ in range(2)]
    base = await start_frontend(
        nursery, "--prefill-engine-url", prefill.url, "--engine-url", decodes[0].url, "--engine-url", decodes[1].url,
        "--health-interval", "0.3", "--health-timeout", "10", "--abort-timeout", "1",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        streams: list[dict] = [{} for _ in range(8)]
        async with trio.open_nursery() as reading:
            for i, into in enumerate(streams):
                reading.start_soon(stream_chat, client, chat(model, f"story {i}"), into)
            running = await under_way_on(decodes[0].url, streams)
            decodes[0].process.kill()
            await decodes[0].process.wait()
        for stream in streams:
            assert_whole(stream, expected_text)
        prefill_account, decode_account = await settle([prefill.url, decodes[1].url])
        moved = continuations(decode_account, streams)
        assert running and moved
        # Each continuation was prefilled afresh (its prompt: the original plus what was generated).
        assert prefill_account["started"] == len(streams) + len(moved) == ended(prefill_account)
        assert set(moved) <= set(continuations(prefill_account, streams))
        assert decode_account["started"] == ended(decode_account)


# ---- 4. request ids, keep-alives and traces ---------------------------------------------------------


async def test_x_request_id_is_returned_and_prefixes_the_engine_rid(aio_loop, nursery, mock_engine_factory):
    running = await mock_engine_factory(incremental_streaming_output=True)
    base = await start_frontend(nursery, "--engine-url", f"grpc://127.0.0.1:{running.port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        reply = await client.post(
            "/v1/chat/completions", json=chat(model, max_tokens=2), headers={"x-request-id": "req-42"}
        )
        assert reply.status_code == 200 and reply.headers["x-request-id"] == "req-42"
        rids = list(running.engine.accounting.requests)
        assert rids[-1].startswith("req-42---") and len(rids[-1]) == 52
        generated = await client.post("/v1/chat/completions", json=chat(model, max_tokens=2))
        key = generated.json()["id"].split("-", 1)[1]
        assert generated.headers["x-request-id"] == key  # the response's own id, without its prefix
        refused = await client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": []}, headers={"x-request-id": "r-7"}
        )
        assert refused.status_code in (400, 404) and refused.headers["x-request-id"] == "r-7"
        assert "x-request-id" not in (await client.get("/v1/models")).headers


@pytest.mark.slow
async def test_a_quiet_stream_gets_sse_keepalive_comments(aio_loop, nursery, script):
    engine = await start_mock_engine(nursery, INCREMENTAL, "--scripted-outputs", str(script))
    base = await start_frontend(
        nursery, "--engine-url", engine.url, "--sse-keepalive", "0.2", "--stream-idle-timeout", "0"
    )
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        model = await model_of(client)
        stream: dict = {}
        try:
            async with trio.open_nursery() as reading:
                reading.start_soon(stream_chat, client, chat(model, max_tokens=60), stream)
                await wait_until(lambda: stream.get("chunks", 0) >= 2, timeout=20)
                engine.process.send_signal(signal.SIGSTOP)  # a long pause, as behind a long prefill
                await trio.sleep(1.0)
                engine.process.send_signal(signal.SIGCONT)
        finally:
            engine.process.send_signal(signal.SIGCONT)
        assert stream["done"] and not stream["errors"]
        assert stream["lines"].count(": ping") >= 2


async def test_traces_continue_the_clients_traceparent_down_to_the_engine(aio_loop, nursery, mock_engine_factory):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from trio_direct import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    try:
        running = await mock_engine_factory(incremental_streaming_output=True)
        base = await start_frontend(nursery, "--engine-url", f"grpc://127.0.0.1:{running.port}")
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        headers = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01", "x-request-id": "traced"}
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            model = await model_of(client)
            stream: dict = {}
            body = {**chat(model, max_tokens=3), "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                stream["lines"] = [line async for line in response.aiter_lines()]
        await wait_until(lambda: any(s.name.startswith("POST") for s in exporter.get_finished_spans()))
        spans = exporter.get_finished_spans()
        (root,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
        assert root.context is not None and root.parent is not None and root.attributes is not None
        assert f"{root.context.trace_id:032x}" == trace_id and root.parent.span_id == 0x00F067AA0BA902B7
        assert root.attributes["trio_direct.request_id"] == "traced"
        children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
        assert {"plan", "response", "engine.generate"} <= set(children), sorted(children)
        call = children["engine.generate"]
        assert call.attributes is not None
        rid = call.attributes["trio_direct.rid"]
        assert isinstance(rid, str) and rid.startswith("traced---")
        assert call.attributes["trio_direct.role"] == "aggregated"
        (seen,) = [r["trace_headers"] for r in running.engine.accounting.requests.values()]
        assert seen["traceparent"].split("-")[1] == trace_id  # the engine continues the client's trace
        assert seen["traceparent"].split("-")[2] == f"{call.context.span_id:016x}"
    finally:
        tracing.disable()
