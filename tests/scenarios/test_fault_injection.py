"""Fault injection (issue #7 §5): clients that vanish in every phase, engines killed mid-stream,
and KV-event publishers that restart, skip sequence numbers or send garbage.

What a user would notice is what is asserted: nothing keeps running on an engine for a client that
left, streams of a dead engine finish on another (migration, issue #19), routing moves on and comes
back, and the frontend keeps answering whatever arrives on its KV-event sockets.
"""

from __future__ import annotations

import json
import random
import socket
from contextlib import aclosing
from dataclasses import dataclass

import h11
import httpx
import msgspec
import pytest
import trio
from support import RawSseClient, engine_accounting, settled_accounts, start_frontend, start_mock_engine, wait_until

pytestmark = pytest.mark.slow

INCREMENTAL = "--incremental-streaming-output"
LONG_PROMPT_WORDS = 300


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kv_config(endpoint_port: int = 0, *, replay: bool = True) -> str:
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{endpoint_port}", "topic": ""}
    if replay:
        config["replay_endpoint"] = "tcp://*:0"
    return json.dumps(config)


async def model_of(base: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return (await client.get("/v1/models")).json()["data"][0]["id"]


def served_rid(response: dict, choice: int = 0) -> str:
    """The engine-side request id of one choice of a response (uuid hex + 4-hex choice index)."""
    return response["id"].split("-", 1)[1] + f"{choice:04x}"


def ended(account: dict) -> int:
    return account["finished"] + account["aborted"] + account["cancelled"] + account["failed"]


def brief(account: dict) -> str:
    return json.dumps({k: v for k, v in account.items() if k not in ("first_output_at", "outcomes", "abort_rpcs")})


def assert_no_early_decode_abort(decode_account: dict) -> None:
    """The decode leg is never aborted before its first message (the KV transfer) arrived."""
    first = decode_account["first_output_at"]
    for rid, at in decode_account["abort_rpcs"]:
        assert rid in first and first[rid] <= at, f"decode leg {rid} aborted before its first message"


async def settle(urls: list[str], timeout: float = 20.0) -> list[dict]:
    """Every engine's accounts once none holds a live request and the Aborts owed arrived (bounded)."""
    return await settled_accounts(urls, timeout)


async def eventually(check, timeout: float, what: str) -> None:
    """Poll the async predicate `check` until it holds; an AssertionError naming `what` after `timeout`.

    (No cancel scope around the HTTP calls: an httpx request cancelled mid-flight leaks its body stream.)
    """
    deadline = trio.current_time() + timeout
    while not await check():
        assert trio.current_time() < deadline, f"not within {timeout:g}s: {what}"
        await trio.sleep(0.05)


async def _idle(client: httpx.AsyncClient) -> bool:
    return await in_flight(client) == 0


async def in_flight(client: httpx.AsyncClient) -> float:
    """`trio_direct_requests_in_flight` from /metrics."""
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("trio_direct_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no trio_direct_requests_in_flight in /metrics")


# ---- 1. a thousand clients that hang up in every phase ------------------------------------------

#: Where a try hangs up, with its weight. "sent": right after the body, before the response
#: headers; "headers": after them, before the first token; "rendezvous": a long prompt whose
#: (disaggregated: slow) prefill is still running; "first": right after the first token;
#: "mid": mid-stream; "end": one event before the last; "unary": a non-streamed request cut
#: while it waits; "complete": read to the end (it must succeed).
PHASES = {"sent": 2, "headers": 2, "rendezvous": 2, "first": 2, "mid": 3, "end": 2, "unary": 2, "complete": 1}


@dataclass(slots=True)
class Try:
    """One client's request and where it hangs up."""

    base: str
    path: str
    body: dict
    phase: str
    #: SSE `data:` records to read before hanging up.
    events: int
    linger: float


def plan_try(rng: random.Random, bases: list[str], model: str) -> Try:
    phase = rng.choices(list(PHASES), weights=list(PHASES.values()))[0]
    chat = rng.random() < 0.6
    n = rng.choice([1, 1, 1, 1, 2, 3])
    max_tokens = rng.choice([8, 24, 40])
    words = LONG_PROMPT_WORDS if phase == "rendezvous" or rng.random() < 0.15 else rng.randint(1, 12)
    text = " ".join(rng.choice(["word", "token", "engine", "abort", "trio"]) for _ in range(words))
    body: dict = {"model": model, "max_tokens": max_tokens, "n": n, "stream": phase != "unary"}
    if phase == "complete":
        body["stream"] = rng.random() < 0.7
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    opening = n if chat else 0  # the role chunk of every chat choice precedes the tokens
    events = {
        "first": opening + 1,
        "mid": opening + rng.randint(2, max(2, max_tokens * n // 2)),
        "end": opening + max_tokens * n - 1,
    }.get(phase, 0)
    base = rng.choice(bases)
    linger = rng.random() * (0.05 if phase in ("rendezvous", "unary") else 0.01)
    return Try(base, "/v1/chat/completions" if chat else "/v1/completions", body, phase, events, linger)


async def run_try(attempt: Try) -> None:
    """Send `attempt` on a bare socket and hang up where it says; a completed one is checked."""
    host, port = attempt.base.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(attempt.body).encode()
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        head = (
            f"POST {attempt.path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        await stream.send_all(head.encode() + payload)
        if attempt.phase == "sent":
            return
        if attempt.phase == "unary":
            await trio.sleep(attempt.linger)
            return
        connection = h11.Connection(h11.CLIENT)
        connection.send(h11.Request(method="POST", target=attempt.path, headers=[("Host", host)]))
        connection.send(h11.EndOfMessage())
        body = b""
        seen = 0
        records: list = []
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                assert event.status_code == 200, f"status {event.status_code} for {attempt}"
                if attempt.phase in ("headers", "rendezvous"):
                    await trio.sleep(attempt.linger)
                    return
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
                if not attempt.body["stream"]:
                    continue
                *complete, body = body.split(b"\n\n")
                for record in complete:
                    data = record.removeprefix(b"data: ")
                    records.append("[DONE]" if data == b"[DONE]" else json.loads(data))
                    seen += 1
                    if attempt.phase != "complete" and seen >= attempt.events:
                        await trio.sleep(attempt.linger)
                        return
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if attempt.phase != "complete":
            return  # the whole stream came before the planned hang-up
        if attempt.body["stream"]:
            assert records and records[-1] == "[DONE]", f"{attempt}: {records[-3:]}"
            assert not any("error" in r for r in records[:-1] if isinstance(r, dict)), f"{attempt}: {records}"
        else:
            reply = json.loads(body)
            assert len(reply["choices"]) == attempt.body["n"], reply
    finally:
        await stream.aclose()


async def aborts_not_delivered(base: str) -> float:
    """Aborts this process's frontends gave up on (`trio_direct_engine_aborts` failed or timed out)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        text = (await client.get("/metrics")).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("trio_direct_engine_aborts_total{") and ('"failed"' in line or '"timed_out"' in line)
    )


async def routing_load(base: str, model: str) -> list[tuple[str, int]]:
    """Per candidate of a fixed probe prompt, the decode blocks the kv router counts there."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        probe = {"model": model, "messages": [{"role": "user", "content": "probe " * 40}], "max_tokens": 1}
        report = (await client.post("/debug/routing", json=probe)).json()
    decisions = [report["route"]["decision"], report["route"].get("decode_decision")]
    return sorted((c["worker"], c["decode_blocks"]) for d in decisions if d for c in d["candidates"])


@pytest.mark.parametrize("setup", ["aggregated", "disaggregated", "vllm-aggregated", "vllm-disaggregated"])
async def test_a_thousand_random_disconnects_leave_nothing_running(aio_loop, nursery, setup):
    """Over SGLang's APIs and over vLLM's (`--api vllm`: Abort by exact id, KV events on gRPC)."""
    kv = ("--kv-events-config", kv_config())
    api = ("--api", "vllm") if setup.startswith("vllm-") else ()
    if setup.endswith("aggregated") and not setup.endswith("disaggregated"):
        engines = [await start_mock_engine(nursery, *api, INCREMENTAL, "--speedup", "8", *kv) for _ in range(2)]
        flags = [a for e in engines for a in ("--engine-url", e.url)]
    else:  # a slow prefill keeps decode legs waiting at the rendezvous
        bootstrap = ("--disaggregation-bootstrap-port", str(free_port()))
        prefill_args = ("--role", "prefill", *api, INCREMENTAL, "--speedup", "3", *bootstrap, *kv)
        prefill = await start_mock_engine(nursery, *prefill_args)
        decode_args = ("--role", "decode", *api, INCREMENTAL, "--speedup", "8", "--bootstrap-timeout", "3")
        decode = await start_mock_engine(nursery, *decode_args)
        engines = [prefill, decode]
        flags = ["--prefill-engine-url", prefill.url, "--engine-url", decode.url]
    # Two frontends over the same engines: round-robin (most tries) and kv-aware routing. Health
    # checks get a generous timeout: a loaded 2-core box is not what this test is about.
    flags += ["--health-timeout", "10"]
    round_robin = await start_frontend(nursery, *flags)
    # Polling off: what is checked below is the load this frontend counts itself, exactly.
    kv_aware = await start_frontend(nursery, "--router-mode", "kv", "--load-poll-interval", "0", *flags)
    model = await model_of(round_robin)
    load_before = await routing_load(kv_aware, model)
    aborts_given_up = await aborts_not_delivered(round_robin)
    limiter = trio.Semaphore(32)

    async def one(seed: int, index: int) -> None:
        attempt = plan_try(random.Random(f"{seed}/{index}"), [round_robin, round_robin, kv_aware], model)
        async with limiter:
            await run_try(attempt)

    async with trio.open_nursery() as tries:
        for seed in (11, 22, 33, 44):
            for index in range(250):
                tries.start_soon(one, seed, index)

    accounts = await settle([e.url for e in engines])
    missing: dict[str, str] = {}
    for account in accounts:
        assert account["started"] == ended(account), brief(account)
        aborts = [rid for rid, _ in account["abort_rpcs"]]
        assert len(aborts) == len(set(aborts)), "one Abort per request, never two"
        cut_short = {rid for rid, outcome in account["outcomes"].items() if outcome in ("cancelled", "aborted")}
        missing |= {rid: account["outcomes"][rid] for rid in cut_short - set(aborts)}
    # Every request the client left while it ran got its Abort, unless the Abort itself failed or
    # timed out (an engine starved of CPU on a loaded box; the frontend logs and counts those).
    given_up = await aborts_not_delivered(round_robin) - aborts_given_up
    assert len(missing) <= given_up, f"requests left without an Abort: {missing}; {[brief(a) for a in accounts]}"
    assert sum(a["started"] for a in accounts) >= 500, [brief(a) for a in accounts]
    if setup.endswith("disaggregated"):
        assert_no_early_decode_abort(accounts[1])
    else:
        assert all(a["failed"] == 0 for a in accounts), [brief(a) for a in accounts]

    for base in (round_robin, kv_aware):
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            body = {"model": model, "messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 5}
            reply = await client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] in ("length", "stop")
            body = {"model": model, "prompt": "x", "max_tokens": 3, "stream": True}
            streamed = [e async for e in RawSseClient(base).events("/v1/completions", body)]
            assert streamed[-1] == "[DONE]" and all("error" not in e for e in streamed[:-1])
            await eventually(lambda: _idle(client), 10, "requests_in_flight back to 0")
    assert await routing_load(kv_aware, model) == load_before, "the kv router still counts load of gone requests"


# ---- 2. kill -9 an engine mid-stream, restart it on the same port -------------------------------

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly and cite sources." for i in range(30))


def chat_body(model: str, system: str, question: str, **extra) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": 3, **extra}


async def routable(client: httpx.AsyncClient) -> set[str]:
    """The engines routing may pick now (healthy ones)."""
    return {w["engine"] for w in (await client.get("/debug/routing")).json()["workers"]}


async def _absent(client: httpx.AsyncClient, engine: str) -> bool:
    return engine not in await routable(client)


async def _present(client: httpx.AsyncClient, engine: str) -> bool:
    return engine in await routable(client)


async def _overlaps(client: httpx.AsyncClient, body: dict, engine: str) -> bool:
    return await overlap_on(client, body, engine) > 0


async def overlap_on(client: httpx.AsyncClient, body: dict, engine: str) -> int:
    """Prompt blocks the kv router believes `engine` caches for `body`."""
    decision = (await client.post("/debug/routing", json=body)).json()["route"]["decision"]
    return sum(c["overlap_blocks"] for c in decision["candidates"] if c["engine_id"] == engine)


async def land_prefix_on(client: httpx.AsyncClient, model: str, served, tag: str) -> dict:
    """A fresh long system prompt the kv router sent to the engine whose `served(rid)` holds.

    A few prompts go at once: with nothing cached, load spreads them over the engines.
    """
    for attempt in range(8):
        bodies = [chat_body(model, f"{tag} {attempt}.{i}. {SYSTEM}", "Hi") for i in range(4)]
        replies: list[dict] = [{}] * len(bodies)

        async def ask(i: int, bodies: list[dict] = bodies, replies: list[dict] = replies) -> None:
            reply = await client.post("/v1/chat/completions", json=bodies[i])
            assert reply.status_code == 200, reply.text
            replies[i] = reply.json()

        async with trio.open_nursery() as asking:
            for i in range(len(bodies)):
                asking.start_soon(ask, i)
        for body, reply in zip(bodies, replies, strict=True):
            if await served(served_rid(reply)):
                return body
    raise AssertionError("no prompt was routed to the engine")


async def read_stream(base: str, body: dict, into: list) -> None:
    async for event in RawSseClient(base).events("/v1/chat/completions", body):
        into.append(event)


async def kill_and_restart_an_engine(nursery, *, new_kv_port: bool) -> None:
    port, kv_port = free_port(), free_port()
    flaky_args = (INCREMENTAL, "--port", str(port))  # the last --port wins over start_mock_engine's
    flaky = await start_mock_engine(nursery, *flaky_args, "--kv-events-config", kv_config(kv_port))
    steady = await start_mock_engine(nursery, INCREMENTAL, "--kv-events-config", kv_config())
    base = await start_frontend(
        nursery, "--router-mode", "kv", "--engine-url", flaky.url, "--engine-url", steady.url,
        "--health-interval", "0.3", "--max-retries", "1",
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        # Streams at real speed (~6 ms a token), spread by load over both engines; none may end early
        # (an EOS sampled a few tokens in), or which ones are still running at the kill would depend
        # on which prompts routing happened to send to the engine that dies.
        streams: list[list] = [[] for _ in range(8)]
        async with trio.open_nursery() as reading:
            for i, events in enumerate(streams):
                # ignore_eos: every stream is still running at the kill (an early EOS would end one first)
                body = chat_body(model, "Be long.", f"Tell story {i}", max_tokens=400, stream=True, ignore_eos=True)
                reading.start_soon(read_stream, base, body, events)
            await wait_until(lambda: all(len(events) >= 3 for events in streams), timeout=20)
            on_flaky = set((await engine_accounting(flaky.url))["first_output_at"])
            doomed = [served_rid(events[0]) in on_flaky for events in streams]
            assert 0 < sum(doomed) < len(streams), f"load spread the streams over both engines: {doomed}"
            flaky.process.kill()  # SIGKILL
            await flaky.process.wait()
        # Every stream completes: those of the killed engine continue on the steady one (migration).
        for events in streams:
            assert events[-1] == "[DONE]"
            assert not [e for e in events[:-1] if "error" in e], events[-3:]
            finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
            assert finishes in (["length"], ["stop"]), events[-3:]

        # New requests go to the steady engine: a request that meets the dead one is retried there.
        before = (await engine_accounting(steady.url))["started"]
        for i in range(10):
            reply = await client.post("/v1/chat/completions", json=chat_body(model, "Short.", f"q{i}"))
            assert reply.status_code == 200, reply.text
        assert (await engine_accounting(steady.url))["started"] == before + 10
        await eventually(lambda: _absent(client, "e0"), 5, "the dead engine left routing")
        assert (await client.get("/health")).status_code == 200

        # Back on the same gRPC port; its KV events on the same ZMQ port, or a new one.
        restarted_kv = kv_config(free_port() if new_kv_port else kv_port)
        await start_mock_engine(nursery, *flaky_args, "--kv-events-config", restarted_kv)
        await eventually(lambda: _present(client, "e0"), 10, "the restarted engine rejoined")

        async def on_restarted(rid: str) -> bool:
            return rid in (await engine_accounting(flaky.url))["first_output_at"]

        body = await land_prefix_on(client, model, on_restarted, "after the restart")
        await eventually(lambda: _overlaps(client, body, "e0"), 5, "the restarted engine's KV events are indexed")
        again = (await client.post("/v1/chat/completions", json=body | {"max_tokens": 2})).json()
        assert await on_restarted(served_rid(again)), "the cached prefix goes to the restarted engine"


async def test_an_engine_killed_mid_stream_has_its_streams_completed_elsewhere_and_rejoins(aio_loop, nursery):
    await kill_and_restart_an_engine(nursery, new_kv_port=False)


async def test_an_engine_that_comes_back_on_a_new_kv_events_port_is_indexed_again(aio_loop, nursery):
    await kill_and_restart_an_engine(nursery, new_kv_port=True)


# ---- 3. KV-event publishers that restart, skip sequence numbers, or send garbage ----------------


async def start_kv_fleet(mock_engine_factory, nursery, count: int = 2) -> tuple[list, str]:
    """In-process mock engines publishing KV events (with replay), and a kv-routing frontend."""
    engines = [
        await mock_engine_factory(incremental_streaming_output=True, kv_events_config=kv_config()) for _ in range(count)
    ]
    urls = [a for e in engines for a in ("--engine-url", f"grpc://127.0.0.1:{e.port}")]
    return engines, await start_frontend(nursery, "--router-mode", "kv", *urls)


def engine_served(running):
    async def served(rid: str) -> bool:
        await trio.lowlevel.checkpoint()
        return rid in running.engine.accounting.first_output_at

    return served


async def counters_of(client: httpx.AsyncClient, engine: str) -> dict:
    return (await client.get("/debug/routing")).json()["kv"]["subscribers"][engine]


async def cached_prefix_on_one_engine(
    client: httpx.AsyncClient, model: str, engines: list, tag: str
) -> tuple[int, dict]:
    """Send a fresh long prompt, wait until the index knows it; returns (engine index, body)."""
    body = chat_body(model, f"{tag}. {SYSTEM}", "first")
    reply = (await client.post("/v1/chat/completions", json=body)).json()
    index = [await engine_served(e)(served_rid(reply)) for e in engines].index(True)
    await eventually(lambda: _overlaps(client, body, f"e{index}"), 10, "the prompt's KV events are indexed")
    return index, body


async def goes_to(client: httpx.AsyncClient, body: dict, running) -> bool:
    reply = await client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return await engine_served(running)(served_rid(reply.json()))


def batch(*events) -> bytes:
    return msgspec.msgpack.encode([1.0, list(events), 0])


#: Messages that are not KV-event batches but decode (or fail to decode) as msgspec expects.
MALFORMED_PAYLOADS = [
    b"\xc1",  # no msgpack at all
    b"\x93\x01",  # truncated
    msgspec.msgpack.encode(42),
    msgspec.msgpack.encode({"ts": "yesterday", "events": []}),
    msgspec.msgpack.encode([1.0, "not a list", 0]),
    msgspec.msgpack.encode(["no timestamp", []]),
]
#: A well-formed batch whose events are all malformed or unknown: the batch counts, its events drop.
BAD_EVENTS = batch(
    ["BlockStored", "x"],
    {"type": "BlockRemoved", "block_hashes": ["not", "ints"]},
    {"type": "SomethingNew"},
    ["BlockStored", [1], None, [1, 2], 0],
    {"type": "BlockStored", "block_hashes": [7, 7], "parent_block_hash": None, "token_ids": [1, 2], "block_size": 1},
)
#: Multipart messages of the wrong shape (no seq is used up).
MALFORMED_FRAMES = [[b""], [b"", b"short", b"x"], [b"", (0).to_bytes(8, "big"), b"x", b"extra"]]


async def test_malformed_kv_messages_are_counted_and_routing_carries_on(aio_loop, nursery, mock_engine_factory):
    engines, base = await start_kv_fleet(mock_engine_factory, nursery)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        index, body = await cached_prefix_on_one_engine(client, model, engines, "malformed")
        engine, publisher = f"e{index}", engines[index].engine._publishers[0]
        before = await counters_of(client, engine)
        for frames in MALFORMED_FRAMES:
            publisher.send_frames(frames)
        for payload in MALFORMED_PAYLOADS:
            publisher.publish_payload(payload)
        publisher.publish_payload(BAD_EVENTS)
        bad = len(MALFORMED_FRAMES) + len(MALFORMED_PAYLOADS)

        async def counted() -> bool:
            return (await counters_of(client, engine))["bad_batches"] - before["bad_batches"] == bad

        await eventually(counted, 10, f"{bad} bad messages counted")
        after = await counters_of(client, engine)
        assert after["dropped_events"] - before["dropped_events"] == 5
        assert after["batches"] - before["batches"] == 1
        # Malformed batches still used their seqs in order: no gap, no restart, nothing cleared.
        assert (after["gaps"], after["restarts"], after["lost"]) == (before["gaps"], before["restarts"], before["lost"])
        assert await overlap_on(client, body, engine) > 0
        next_question = chat_body(model, body["messages"][0]["content"], "next")
        assert await goes_to(client, next_question, engines[index]), "the cached prefix still wins"
        assert (await client.get("/health")).status_code == 200
        metrics = (await client.get("/metrics")).text
        counter = f'trio_direct_kv_events_total{{engine="{engine}",kind="bad_batches",model="{model}"}}'
        assert f"{counter} {float(after['bad_batches'])}" in metrics


async def test_a_kv_sequence_gap_is_replayed_and_a_publisher_restart_clears_and_rebuilds(
    aio_loop, nursery, mock_engine_factory
):
    engines, base = await start_kv_fleet(mock_engine_factory, nursery)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        index, body = await cached_prefix_on_one_engine(client, model, engines, "gaps")
        engine, running = f"e{index}", engines[index]
        publisher = running.engine._publishers[0]
        system = body["messages"][0]["content"]

        # A lost batch: the next one shows the gap, and replay fills it.
        before = await counters_of(client, engine)
        publisher.drop_next(1)
        assert await goes_to(client, chat_body(model, system, "second question"), running)
        assert await goes_to(client, chat_body(model, system, "third question"), running)

        async def gap_seen() -> bool:
            return (await counters_of(client, engine))["gaps"] > before["gaps"]

        await eventually(gap_seen, 10, "the gap is noticed")
        after = await counters_of(client, engine)
        assert after["replays"] > before["replays"] and after["lost"] == before["lost"] == 0
        assert await overlap_on(client, body, engine) > 0, "nothing was cleared: the gap was replayed"

        # The engine restarts: its cache is gone (the flush's AllBlocksCleared dies with the old
        # process, never published) and its new publisher numbers from 0 with an empty replay ring.
        clears = (await client.get("/debug/routing")).json()["kv"]["index"]["clears"]
        publisher.drop_next(1)
        assert running.engine.flush_cache()
        publisher.restart_sequence()
        fourth = chat_body(model, system, "fourth question")
        assert await goes_to(client, fourth, running)  # the index still (wrongly) says it caches the prompt

        async def restarted() -> bool:
            return (await counters_of(client, engine))["restarts"] > after["restarts"]

        await eventually(restarted, 10, "the publisher restart is noticed")
        assert (await client.get("/debug/routing")).json()["kv"]["index"]["clears"] > clears, "old entries dropped"
        # The new process re-cached the fourth prompt from scratch: indexed again from seq 0.
        await eventually(lambda: _overlaps(client, fourth, engine), 10, "the re-cached prompt is indexed")
        # ...and what it reports from now on is indexed again.
        fresh = await land_prefix_on(client, model, engine_served(running), "after the publisher restart")
        await eventually(lambda: _overlaps(client, fresh, engine), 10, "new KV events are indexed after the restart")
        assert await goes_to(client, fresh | {"max_tokens": 2}, running)
        assert (await client.get("/health")).status_code == 200


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\xa2\xff\xfe", id="invalid-utf8-str"),
        pytest.param(b"\x91" * 100_000 + b"\xc0", id="deep-nesting"),
    ],
)
async def test_an_undecodable_kv_batch_does_not_take_the_frontend_down(aio_loop, mock_engine_factory, payload):
    async with trio.open_nursery() as nursery:  # a crashing frontend fails the test body itself
        engines, base = await start_kv_fleet(mock_engine_factory, nursery, count=1)
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            await cached_prefix_on_one_engine(client, model, engines, "undecodable")  # subscribed for sure
            before = await counters_of(client, "e0")
            engines[0].engine._publishers[0].publish_payload(payload)

            async def counted() -> bool:
                return (await counters_of(client, "e0"))["bad_batches"] > before["bad_batches"]

            await eventually(counted, 10, "the undecodable batch is counted")
            assert (await client.get("/health")).status_code == 200
            reply = await client.post("/v1/chat/completions", json=chat_body(model, "Short.", "still there?"))
            assert reply.status_code == 200
        nursery.cancel_scope.cancel()


async def test_after_lost_kv_history_new_prompts_are_indexed_again(aio_loop, nursery, mock_engine_factory):
    """After a clear, the engine's stores chain onto pages the index forgot (for chat: at least the
    template's first tokens); the prompt routed there says what those pages hold."""
    running = await mock_engine_factory(incremental_streaming_output=True, kv_events_config=kv_config(replay=False))
    base = await start_frontend(nursery, "--router-mode", "kv", "--engine-url", f"grpc://127.0.0.1:{running.port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await cached_prefix_on_one_engine(client, model, [running], "lost history")
        running.engine._publishers[0].drop_next(1)
        await client.post("/v1/chat/completions", json=chat_body(model, "Lost.", "one"))
        await client.post("/v1/chat/completions", json=chat_body(model, "Noticed.", "two"))

        async def lost() -> bool:
            return (await counters_of(client, "e0"))["lost"] > 0

        await eventually(lost, 10, "the lost batch is noticed")
        fresh = chat_body(model, f"A new topic. {SYSTEM}", "three")
        assert (await client.post("/v1/chat/completions", json=fresh)).status_code == 200
        await eventually(lambda: _overlaps(client, fresh, "e0"), 5, "a new prompt is indexed after the clear")


# ---- 4. a client that vanishes while its response is being written ------------------------------


async def test_a_client_gone_while_a_chunk_is_being_written_ends_the_request_quietly(
    aio_loop, nursery, mock_engine_factory
):
    """The ASGI app itself, with a socket write that hangs until the client's disconnect."""
    from trio_direct.config import parse_serve_args
    from trio_direct.frontend.runtime import run_frontend
    from trio_direct.service import build_app

    running = await mock_engine_factory(incremental_streaming_output=True)
    config = parse_serve_args(["--engine-url", f"grpc://127.0.0.1:{running.port}"], environ={})
    frontend = await nursery.start(run_frontend, config)
    asgi = build_app(lambda: frontend, config)
    body = {"model": frontend.pools()[0].name, "prompt": "go", "max_tokens": 200, "stream": True}
    requested = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    writing, gone = trio.Event(), trio.Event()

    async def receive() -> dict:
        if requested:
            return requested.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            writing.set()
            await trio.sleep_forever()  # the client stopped reading; this write never completes

    async def disconnect_during_the_write() -> None:
        await writing.wait()
        gone.set()

    scope = {"type": "http", "path": "/v1/completions", "method": "POST", "headers": []}
    with trio.fail_after(10):
        async with trio.open_nursery() as request:
            request.start_soon(disconnect_during_the_write)
            await asgi(scope, receive, send)  # returns quietly once the request is torn down
    (account,) = await settle([f"grpc://127.0.0.1:{running.port}"])
    assert account["started"] == ended(account) == 1


# ---- 5. many streams on one engine ----------------------------------------------------------------


async def test_more_than_a_hundred_streams_do_not_get_a_healthy_engine_marked_down(aio_loop, nursery):
    engine = await start_mock_engine(nursery, INCREMENTAL)  # real speed: ~6 ms a token
    health = ("--health-interval", "0.3", "--health-timeout", "1")
    base = await start_frontend(nursery, "--engine-url", engine.url, *health)
    model = await model_of(base)
    opened = [0]

    async def hold_a_stream(index: int) -> None:
        body = {"model": model, "prompt": f"go {index}", "max_tokens": 2000, "ignore_eos": True, "stream": True}
        async with aclosing(RawSseClient(base).events("/v1/completions", body)) as events:
            async for _event in events:
                opened[0] += 1
                await trio.sleep_forever()  # keep it open (the generation goes on)

    async with httpx.AsyncClient(base_url=base, timeout=30) as client, trio.open_nursery() as streams:
        for index in range(130):
            streams.start_soon(hold_a_stream, index)
            await trio.sleep(0.005)
        # Every stream gets going, and the engine stays routable all along (and ten intervals more).
        deadline, settled = trio.current_time() + 20, None
        while settled is None or trio.current_time() < settled:
            assert await _present(client, "e0"), f"the engine was marked down with {opened[0]} streams open"
            assert trio.current_time() < deadline, f"only {opened[0]} of 130 streams started"
            if settled is None and opened[0] == 130:
                settled = trio.current_time() + 3
            await trio.sleep(0.1)
        streams.cancel_scope.cancel()
