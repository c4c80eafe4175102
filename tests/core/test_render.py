"""A streamed completion's SSE events, as `core.render.stream_response` writes them.

A scripted in-process engine client stands in for the gRPC transport, so these run in milliseconds:
what is asserted is what the client would read, and what the engine and the router are told.
"""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import trio

from trio_direct import metrics
from trio_direct.config import ServeConfig
from trio_direct.core.errors import ApiError
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.output import ChoiceOutput
from trio_direct.core.plan import ChoicePlan, Prompt, RequestPlan
from trio_direct.core.render import StreamCutter, stream_response
from trio_direct.engine.errors import EngineError, EngineInternal
from trio_direct.engine.types import GenerateChunk, GenerateInput
from trio_direct.fleet.fleet import Engine, Fleet
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.routing.simple import NoWorkerAvailable
from trio_direct.surfaces.completions import CompletionRenderer

HANG = object()  # in a script: the engine sends nothing more until the call is left


class Chunks:
    """What `EngineClient.generate` yields: scripted chunks one at a time, then an end, an error or
    a hang (each chunk arrives on its own, as from a fast engine)."""

    def __init__(self, script: list) -> None:
        self._script = list(script)

    def __aiter__(self) -> Chunks:
        return self

    async def __anext__(self) -> GenerateChunk:
        await trio.lowlevel.checkpoint()
        if not self._script:
            raise StopAsyncIteration
        item = self._script.pop(0)
        if item is HANG:
            await trio.sleep_forever()
        if isinstance(item, EngineError):
            raise item
        return item

    def next_nowait(self) -> GenerateChunk:
        raise trio.WouldBlock

    async def wait_written(self) -> None:
        await trio.lowlevel.checkpoint()


@dataclass(eq=False)
class ScriptedEngine:
    """An engine client whose every generation plays `script`; records aborts and open calls."""

    script: list
    api: str = "native"
    name: str = "scripted"
    aborted: list[str] = field(default_factory=list)
    open_calls: int = 0

    @asynccontextmanager
    async def generate(self, request: GenerateInput):
        self.open_calls += 1
        try:
            yield Chunks(self.script)
        finally:
            self.open_calls -= 1

    async def connect(self) -> None:
        pass

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool:
        self.aborted.append(rid)
        return True


@dataclass(eq=False)
class LoadLedger:
    """Stands in for kv routing: records the load a request holds until it is released."""

    held: set[str] = field(default_factory=set)
    router: object = None

    def choose(self, router, workers, key, token_ids, request_id, pinned=None):
        if not workers:
            raise NoWorkerAvailable("no healthy engine")
        self.held.add(request_id)
        return workers[0], None

    def free(self, request_id: str) -> None:
        self.held.discard(request_id)

    def first_token(self, request_id: str) -> None:
        pass


class Digits:
    """A detokenizer: token id 3 reads '3'."""

    def prepare(self) -> None:
        pass

    def push(self, token_ids: list[int]) -> str:
        return "".join(str(t) for t in token_ids)

    def flush(self) -> str:
        return ""


def setup(script: list, *, n: int = 1, include_usage: bool = False, healthy: bool = True):
    client = ScriptedEngine(script)
    card = SimpleNamespace(role="aggregated", dp_size=1, url="grpc://scripted:1")
    engine = Engine("e0", card, client, healthy=healthy)  # type: ignore[arg-type]  # a stand-in card and a partial engine client
    ledger = LoadLedger()
    pool = ModelPool(
        ServeConfig(), Fleet([engine], model=SimpleNamespace(served_model_name="m", context_length=None)),  # type: ignore[arg-type]  # a stand-in model
        RoutingPolicy(kv=ledger), tokenizer=None, chat_template_override=None,  # type: ignore[arg-type]  # a load ledger for KV routing; no tokenizer
    )  # fmt: skip
    choices = [
        ChoicePlan(GenerateInput(rid=f"{'a' * 32}{i:04x}", input_ids=[1, 2]), ChoiceOutput(i, Digits()))
        for i in range(n)
    ]
    plan = RequestPlan(
        id="cmpl-x", key="a" * 32, created=0, model="m", prompts=[Prompt([1, 2], "go")], choices=choices, n=n,
        stream=True, include_usage=include_usage,
    )  # fmt: skip
    return pool, plan, client, ledger


class Writer:
    """The HTTP side: records what was written, before and after the stream's first write."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.writes: list[bytes] = []
        self.ended = False

    async def start(self, status: int, headers) -> None:
        self.status = status

    async def send(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(data)

    async def end(self) -> None:
        self.ended = True


def events(chunks: list[bytes]) -> list:
    """The SSE events the client reads: JSON objects, and "[DONE]"."""
    out = []
    for line in b"".join(chunks).decode().splitlines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def read_all(pool, plan, writer: Writer | None = None) -> tuple[list[bytes], list[bytes]]:
    """The writes during the stream, and the closing write after it."""
    writer = writer or Writer()
    renderer = CompletionRenderer(plan, str)
    await stream_response(pool, plan, renderer, writer, started=0.0, cutter=StreamCutter())
    assert writer.ended and writer.status == 200
    return writer.writes[:-1], writer.writes[-1:]


async def test_tokens_stream_then_done_and_the_load_is_released():
    script = [GenerateChunk([3]), GenerateChunk([4], finish_reason="length", prompt_tokens=2, completion_tokens=2)]
    pool, plan, client, ledger = setup(script, include_usage=True)
    written, ending = await read_all(pool, plan)
    body = events(written + ending)[:-2]
    assert "".join(e["choices"][0]["text"] for e in body) == "34"
    # The events that end the stream go out in one write with its end (usage, [DONE]).
    *last, usage, done = events(ending)
    assert last and last[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 2 and done == "[DONE]"
    assert client.aborted == [] and client.open_calls == 0 and not ledger.held


async def test_an_engine_failure_mid_stream_ends_it_with_an_error_event_then_done():
    pool, plan, client, ledger = setup([GenerateChunk([3]), EngineInternal("boom")])
    written, ending = await read_all(pool, plan)
    assert events(written)[0]["choices"][0]["text"] == "3"
    error, done = events(ending)
    assert error["error"]["message"] == "The engine failed to complete the request." and done == "[DONE]"
    assert client.aborted == [] and not ledger.held  # the engine itself ended the request


async def test_an_engine_abort_ends_the_stream_with_an_error_event():
    script = [GenerateChunk([3], finish_reason="abort", abort_message="preempted")]
    pool, plan, _client, ledger = setup(script)
    written, ending = await read_all(pool, plan)
    assert written == []
    error, done = events(ending)
    assert "preempted" in error["error"]["message"] and done == "[DONE]"
    assert not ledger.held


async def test_a_caller_cancelled_mid_write_leaves_quietly_and_aborts_every_choice():
    """The disconnect case: the caller's task is cancelled while it writes a chunk."""
    pool, plan, client, ledger = setup([GenerateChunk([3]), HANG], n=2)

    class LeavingClient(Writer):
        async def send(self, data: bytes) -> None:
            request.cancel()
            await trio.sleep_forever()  # the write the client never takes

    with trio.CancelScope() as request:
        await stream_response(
            pool, plan, CompletionRenderer(plan, str), LeavingClient(), started=0.0, cutter=StreamCutter()
        )
    assert request.cancelled_caught  # nothing but the cancellation left the block
    assert sorted(client.aborted) == [c.request.rid for c in plan.choices]
    assert client.open_calls == 0 and not ledger.held


def _gaps_counted() -> float:
    return metrics.REGISTRY.get_sample_value("trio_direct_inter_token_latency_seconds_count", {"model": "m"}) or 0.0


async def test_every_gap_between_writes_reaches_the_histogram_by_the_streams_end():
    """Each write after a stream's first is one inter-token gap; they are tallied and added to the
    histogram together, by the end of the stream, whether it completed or its client left."""
    script = [*(GenerateChunk([t]) for t in range(3, 9)), GenerateChunk([9], finish_reason="length")]
    pool, plan, _client, _ledger = setup(script)
    before = _gaps_counted()
    writer = Writer()
    await read_all(pool, plan, writer)
    assert len(writer.writes) >= 3 and _gaps_counted() - before == len(writer.writes) - 1

    pool, plan, _client, _ledger = setup([*(GenerateChunk([t]) for t in range(3, 9)), HANG])

    class LeavingClient(Writer):
        async def send(self, data: bytes) -> None:
            if len(self.writes) == 3:
                request.cancel()
                await trio.sleep_forever()  # the write the client never takes
            await super().send(data)

    before = _gaps_counted()
    with trio.CancelScope() as request:
        await stream_response(
            pool, plan, CompletionRenderer(plan, str), LeavingClient(), started=0.0, cutter=StreamCutter()
        )
    assert request.cancelled_caught and _gaps_counted() - before == 2


async def test_no_engine_before_dispatch_is_an_error_status_not_a_stream():
    pool, plan, _client, ledger = setup([], healthy=False)
    writer = Writer()
    with pytest.raises(ApiError) as caught:
        await stream_response(pool, plan, CompletionRenderer(plan, str), writer, started=0.0, cutter=StreamCutter())
    assert caught.value.status == 503 and not ledger.held
    assert writer.status is None and writer.writes == []  # the HTTP layer answers with the status


async def test_a_cut_stream_ends_with_an_error_event_then_done_and_aborts_its_engine_call():
    """The drain deadline of a shutdown (or a second signal) ends an open stream cleanly."""
    pool, plan, client, ledger = setup([GenerateChunk([3]), HANG])
    cutter = StreamCutter()

    class CutAfterFirstWrite(Writer):
        async def send(self, data: bytes) -> None:
            await super().send(data)
            if len(self.writes) == 1:
                cutter.cut("drain deadline")

    writer = CutAfterFirstWrite()
    await stream_response(pool, plan, CompletionRenderer(plan, str), writer, started=0.0, cutter=cutter)
    first, *rest = events(writer.writes)
    assert first["choices"][0]["text"] == "3"
    error, done = rest
    assert error["error"]["type"] == "service_unavailable" and "shutting down" in error["error"]["message"]
    assert done == "[DONE]" and writer.ended
    assert client.aborted == [plan.choices[0].request.rid] and not ledger.held
