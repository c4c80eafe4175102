"""KV-aware routing from the engines' own ZMQ KV events, through real mock engines."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from functools import partial

import httpx
import pytest
import trio
from support import engine_accounting, start_frontend, start_mock_engine

from trio_direct.mock.server import MockEngineConfig, run_mock_engine

pytestmark = pytest.mark.slow

FAST = ("--speedup", "inf", "--incremental-streaming-output")
SYSTEM_PROMPTS = [
    f"You are assistant number {i}. " + " ".join(f"rule {i}.{j}: be precise and kind." for j in range(40))
    for i in range(6)
]


def kv_config(fmt: str = "map", *, replay: bool = True) -> str:
    config = {"publisher": "zmq", "endpoint": "tcp://*:0", "topic": "", "format": fmt}
    if replay:
        config["replay_endpoint"] = "tcp://*:0"
    return json.dumps(config)


def chat_body(model: str, system: str, question: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }


async def model_of(client: httpx.AsyncClient) -> str:
    return (await client.get("/v1/models")).json()["data"][0]["id"]


async def indexed_blocks(client: httpx.AsyncClient) -> int:
    return (await client.get("/debug/routing")).json()["kv"]["index"]["blocks"]


async def served_by(engines, response: dict) -> int:
    """Which engine served a response: the one whose accounting saw its rid."""
    rid = response["id"].split("-", 1)[1] + "0000"
    for i, engine in enumerate(engines):
        if rid in (await engine_accounting(engine.url))["first_output_at"]:
            return i
    raise AssertionError(f"no engine served {rid}")


@pytest.mark.parametrize(("fmt", "api"), [("map", "both"), ("array", "both"), ("map", "vllm")])
async def test_a_shared_system_prompt_goes_where_it_is_cached(aio_loop, nursery, fmt, api):
    """SGLang engines publish over ZMQ (both encodings); vLLM engines over their gRPC stream."""
    kv = ("--kv-events-config", kv_config(fmt))
    engines = [await start_mock_engine(nursery, "--api", api, *FAST, *kv) for _ in range(2)]
    base = await start_frontend(nursery, "--router-mode", "kv", *(a for e in engines for a in ("--engine-url", e.url)))
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        first = (await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[0], "Hi"))).json()
        with trio.fail_after(10):
            while await indexed_blocks(client) == 0:  # the engine's BlockStored events arrive
                await trio.sleep(0.02)
        second = (await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[0], "Hello?"))).json()
        explained = await client.post("/debug/routing", json=chat_body(model, SYSTEM_PROMPTS[0], "Hey"))
    assert await served_by(engines, first) == await served_by(engines, second)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    route = explained.json()["route"]["decision"]
    assert len(route["candidates"]) == 2
    assert max(c["overlap_blocks"] for c in route["candidates"]) > 0


async def test_prefix_groups_stick_to_one_engine_while_load_stays_spread(aio_loop, nursery):
    engines = [await start_mock_engine(nursery, *FAST, "--kv-events-config", kv_config()) for _ in range(3)]
    base = await start_frontend(nursery, "--router-mode", "kv", *(a for e in engines for a in ("--engine-url", e.url)))
    first: dict[int, int] = {}
    later: dict[int, set[int]] = {group: set() for group in range(6)}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        responses: dict[int, dict] = {}

        async def ask(group: int, system: str) -> None:
            body = chat_body(model, system, "question 0")
            responses[group] = (await client.post("/v1/chat/completions", json=body)).json()

        async with trio.open_nursery() as asking:  # the groups arrive together: load spreads them
            for group, system in enumerate(SYSTEM_PROMPTS):
                asking.start_soon(ask, group, system)
        for group, response in responses.items():
            first[group] = await served_by(engines, response)
        with trio.fail_after(10):  # their KV events land
            while await indexed_blocks(client) < 6 * 8:
                await trio.sleep(0.02)
        for round_ in range(1, 4):  # then each group follows its cached prefix
            for group, system in enumerate(SYSTEM_PROMPTS):
                body = chat_body(model, system, f"question {round_}")
                response = (await client.post("/v1/chat/completions", json=body)).json()
                later[group].add(await served_by(engines, response))
    assert set(first.values()) == {0, 1, 2}, f"the first requests spread over every engine: {first}"
    assert all(where == {first[group]} for group, where in later.items()), (first, later)


async def test_dp_ranks_are_routed_separately(aio_loop, nursery):
    engine = await start_mock_engine(nursery, *FAST, "--dp-size", "2", "--kv-events-config", kv_config())
    base = await start_frontend(nursery, "--router-mode", "kv", "--engine-url", engine.url)
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[1], "Hi"))
        with trio.fail_after(10):
            while await indexed_blocks(client) == 0:
                await trio.sleep(0.02)
        report = (await client.post("/debug/routing", json=chat_body(model, SYSTEM_PROMPTS[1], "Again"))).json()
    candidates = report["route"]["decision"]["candidates"]
    assert sorted(c["dp_rank"] for c in candidates) == [0, 1]
    overlaps = sorted(c["overlap_blocks"] for c in candidates)
    assert overlaps[0] == 0 and overlaps[1] > 0, "only the rank that served the prompt holds it"


async def test_approximate_mode_learns_from_its_own_routing(aio_loop, nursery):
    engines = [await start_mock_engine(nursery, *FAST) for _ in range(2)]
    base = await start_frontend(
        nursery, "--router-mode", "kv", "--no-router-kv-events", *(a for e in engines for a in ("--engine-url", e.url))
    )
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        responses = [
            (await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[2], f"q{i}"))).json()
            for i in range(3)
        ]
    assert len({await served_by(engines, r) for r in responses}) == 1
    assert responses[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def start_in_process_engine(nursery, **config):
    return await nursery.start(
        run_mock_engine, MockEngineConfig(speedup=float("inf"), incremental_streaming_output=True, **config)
    )


async def subscriber_counters(client: httpx.AsyncClient) -> dict:
    return (await client.get("/debug/routing")).json()["kv"]["subscribers"]["e0"]


@pytest.mark.parametrize("replay", [True, False])
async def test_a_sequence_gap_is_replayed_or_clears_the_index(aio_loop, nursery, replay):
    running = await start_in_process_engine(nursery, kv_events_config=kv_config(replay=replay))
    base = await start_frontend(nursery, "--router-mode", "kv", "--engine-url", f"grpc://127.0.0.1:{running.port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[3], "one"))
        with trio.fail_after(10):
            while await indexed_blocks(client) == 0:
                await trio.sleep(0.02)
        running.engine._publishers[0].drop_next(1)  # the next batch is lost on the wire
        await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[4], "two"))
        await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[5], "three"))
        with trio.fail_after(10):
            while (await subscriber_counters(client))["gaps"] == 0:
                await trio.sleep(0.02)
        counters = await subscriber_counters(client)
        if replay:
            assert counters["replays"] >= 1 and counters["lost"] == 0
            report = (await client.post("/debug/routing", json=chat_body(model, SYSTEM_PROMPTS[4], "x"))).json()
            assert report["route"]["decision"]["overlap_blocks"] > 0, "the replayed batch was indexed"
        else:
            assert counters["lost"] >= 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("api", ["both", "vllm"])
async def test_an_engine_restart_resets_its_index(aio_loop, nursery, api):
    """Over ZMQ the sequence restarts on the same socket; over vLLM's gRPC stream the subscription
    reconnects, resumes from its last sequence and sees the new engine's numbering start over."""
    port, kv_port = free_port(), free_port()
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kv_port}", "topic": ""})
    args = ("--api", api, *FAST, "--kv-events-config", config)
    # The restarted engine must come back on the same ports, so it is run by hand here.
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", str(port), *args]

    async def start_fixed():
        process = await nursery.start(partial(trio.run_process, command, stdout=subprocess.PIPE, check=False))
        with trio.fail_after(30):
            assert await process.stdout.receive_some()
        return process

    process = await start_fixed()
    first_started = trio.current_time()
    base = await start_frontend(nursery, "--router-mode", "kv", "--engine-url", f"grpc://127.0.0.1:{port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[0], "before"))
        with trio.fail_after(10):
            while await indexed_blocks(client) == 0:
                await trio.sleep(0.02)
        process.kill()
        await process.wait()
        # The gRPC subscriber tells a restarted engine by its start time (now - uptime), to within
        # a second: a real engine takes longer than that to load, a mock can be back sooner.
        await trio.sleep_until(first_started + 1.5)
        await start_fixed()
        await trio.sleep(0.5)  # the new publisher's subscription settles
        reply = await client.post("/v1/chat/completions", json=chat_body(model, SYSTEM_PROMPTS[1], "after"))
        assert reply.status_code == 200
        # The subscription finds the new engine within its reconnect backoff (at most 5 s).
        with trio.fail_after(20):
            while (await subscriber_counters(client))["restarts"] + (await subscriber_counters(client))["lost"] == 0:
                await trio.sleep(0.05)
        report = (await client.post("/debug/routing", json=chat_body(model, SYSTEM_PROMPTS[0], "x"))).json()
    assert report["route"]["decision"]["overlap_blocks"] == 0, "what the old process cached is forgotten"


# ---- history the frontend never saw: restarts and replicas (issue: KV routing that survives them) ----

#: Eight prefix groups, each a 700-word system prompt, as a chat service's personas or tenants.
GROUPS = [
    f"You are the assistant of team {g}. " + " ".join(f"Guideline {g}.{j}: answer with care." for j in range(140))
    for g in range(8)
]


def engine_args(engines) -> list[str]:
    return [arg for engine in engines for arg in ("--engine-url", engine.url)]


async def ask(client: httpx.AsyncClient, model: str, group: int, question: str) -> dict:
    reply = await client.post("/v1/chat/completions", json=chat_body(model, GROUPS[group], question))
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]


async def known_somewhere(client: httpx.AsyncClient, model: str, group: int) -> bool:
    """Whether the frontend's index credits some engine with the group's system prompt."""
    report = (await client.post("/debug/routing", json=chat_body(model, GROUPS[group], "probe"))).json()
    return max(c["overlap_blocks"] for c in report["route"]["decision"]["candidates"]) > 0


async def wait_known(client: httpx.AsyncClient, model: str, groups) -> None:
    with trio.fail_after(20):
        for group in groups:
            while not await known_somewhere(client, model, group):
                await trio.sleep(0.02)


async def first_requests(client: httpx.AsyncClient, model: str, tag: str) -> None:
    """One request per group, all at once (load spreads them), then their KV events are indexed."""
    async with trio.open_nursery() as asking:
        for group in range(len(GROUPS)):
            asking.start_soon(ask, client, model, group, f"{tag}: first question")
    await wait_known(client, model, range(len(GROUPS)))


async def follow_up_ratio(client: httpx.AsyncClient, model: str, tag: str, rounds: int = 2) -> float:
    """Cached share of the prompt tokens of follow-ups in every group."""
    cached = prompt = 0
    for round_ in range(rounds):
        for group in range(len(GROUPS)):
            usage = await ask(client, model, group, f"{tag}: follow-up {round_}")
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt += usage["prompt_tokens"]
    return cached / prompt


async def test_a_restarted_frontend_routes_to_the_engines_warm_caches(aio_loop, nursery):
    """Frontends restart on every deploy while the engines keep their caches."""
    engines = [await start_mock_engine(nursery, *FAST, "--kv-events-config", kv_config(replay=False)) for _ in range(4)]
    async with trio.open_nursery() as first_process:
        base = await start_frontend(first_process, "--router-mode", "kv", *engine_args(engines))
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            model = await model_of(client)
            await first_requests(client, model, "before")
            uninterrupted = await follow_up_ratio(client, model, "before")
        first_process.cancel_scope.cancel()  # the frontend process stops; the engines stay up

    base = await start_frontend(nursery, "--router-mode", "kv", *engine_args(engines))
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        # One request per group: a new process knows nothing before it hears from the engines.
        await first_requests(client, model, "after")
        after_restart = await follow_up_ratio(client, model, "after")
        index = (await client.get("/debug/routing")).json()["kv"]["index"]
    assert uninterrupted > 0.9, uninterrupted
    assert after_restart >= 0.95 * uninterrupted, (after_restart, uninterrupted, index)


async def test_two_replicas_alternating_send_a_prefix_to_the_same_warm_engine(aio_loop, nursery):
    engines = [await start_mock_engine(nursery, *FAST, "--kv-events-config", kv_config()) for _ in range(4)]
    replicas = [await start_frontend(nursery, "--router-mode", "kv", *engine_args(engines)) for _ in range(2)]
    clients = [httpx.AsyncClient(base_url=base, timeout=30) for base in replicas]
    try:
        model = await model_of(clients[0])
        for group in (0, 1):
            await ask(clients[group], model, group, "first question")
        for client in clients:
            await wait_known(client, model, (0, 1))
        cached = prompt = 0
        for turn in range(12):  # each group's requests alternate between the two replicas
            for group in (0, 1):
                usage = await ask(clients[(turn + group) % 2], model, group, f"follow-up {turn}")
                cached += usage["prompt_tokens_details"]["cached_tokens"]
                prompt += usage["prompt_tokens"]
    finally:
        for client in clients:
            await client.aclose()
    assert cached / prompt >= 0.9, cached / prompt


async def test_a_replica_started_late_finds_the_warm_engine_after_one_request(aio_loop, nursery):
    """It missed the root stores; the first request it routes locates what the engines hold."""
    engines = [await start_mock_engine(nursery, *FAST, "--kv-events-config", kv_config(replay=False)) for _ in range(2)]
    early = await start_frontend(nursery, "--router-mode", "kv", *engine_args(engines))
    async with httpx.AsyncClient(base_url=early, timeout=30) as client:
        model = await model_of(client)
        await ask(client, model, 0, "first question")
        await wait_known(client, model, (0,))
    late = await start_frontend(nursery, "--router-mode", "kv", *engine_args(engines))
    async with httpx.AsyncClient(base_url=late, timeout=30) as client:
        await ask(client, model, 0, "the late replica's first")
        await wait_known(client, model, (0,))
        ratios = []
        for turn in range(4):
            usage = await ask(client, model, 0, f"follow-up {turn}")
            ratios.append(usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"])
    assert min(ratios) > 0.9, ratios


# ---- sessions ------------------------------------------------------------------------------------


async def test_a_session_sticks_to_one_engine_in_round_robin_mode(aio_loop, nursery):
    engines = [await start_mock_engine(nursery, *FAST) for _ in range(3)]
    base = await start_frontend(nursery, "--router-mode", "round-robin", *engine_args(engines))
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        model = await model_of(client)
        served = set()
        for turn in range(6):
            body = chat_body(model, SYSTEM_PROMPTS[turn % len(SYSTEM_PROMPTS)], f"turn {turn}")
            reply = await client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "conversation-1"})
            served.add(await served_by(engines, reply.json()))
    assert len(served) == 1, served
