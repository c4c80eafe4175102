"""Embeddings on the engines (`core.embedding`): every input routed, answered in order, and every
call the engine did not answer aborted, whatever ends the request."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import trio

from trio_direct.config import ServeConfig
from trio_direct.core.embedding import embed_on_engine, plan_embeddings, run_embeddings
from trio_direct.core.errors import ApiError
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.plan import Prompt
from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineInvalidArgument, EngineUnavailable
from trio_direct.engine.types import EmbedInput, EmbedOutput
from trio_direct.fleet.fleet import Engine, Fleet
from trio_direct.routing.policy import RoutingPolicy


@dataclass(eq=False)
class EmbeddingEngine:
    """An engine client whose `Embed` answers [first id, length] after `delay`, or fails or hangs
    for the inputs a test names; records what it was asked and aborted."""

    name: str
    delay: float = 0.0
    fail: dict[int, Exception] = field(default_factory=dict)
    hang: set[int] = field(default_factory=set)
    #: Per first token id, a delay other than `delay`.
    delays: dict[int, float] = field(default_factory=dict)
    api: str = "native"
    asked: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    open_calls: int = 0
    most_open: int = 0
    last_output_at: float = -math.inf

    async def embed(self, request: EmbedInput) -> EmbedOutput:
        self.asked.append(request.rid)
        self.open_calls += 1
        self.most_open = max(self.most_open, self.open_calls)
        try:
            first = request.input_ids[0]
            await trio.sleep(self.delays.get(first, self.delay))
            if first in self.fail:
                raise self.fail[first]
            if first in self.hang:
                await trio.sleep_forever()
            return EmbedOutput([float(first), float(len(request.input_ids))], len(request.input_ids) + 1)
        finally:
            self.open_calls -= 1

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool:
        self.aborted.append(rid)
        return True


def pool_of(
    *clients: EmbeddingEngine, embedding: bool = True, max_retries: int = 1, idle_timeout: float = 120.0
) -> ModelPool:
    engines = [
        Engine(f"e{i}", SimpleNamespace(role="aggregated", dp_size=1, url=f"grpc://e{i}:1"), client)  # type: ignore[arg-type]
        for i, client in enumerate(clients)
    ]
    model = SimpleNamespace(served_model_name="m", context_length=100, is_embedding=embedding)
    config = ServeConfig(max_retries=max_retries, abort_timeout=1.0, stream_idle_timeout=idle_timeout)
    return ModelPool(config, Fleet(engines, model), RoutingPolicy(), tokenizer=None, chat_template_override=None)  # type: ignore[arg-type]  # a stand-in model; no tokenizer


def prompts(*firsts: int, length: int = 3) -> list[Prompt]:
    return [Prompt([first] * length, "") for first in firsts]


async def test_vectors_come_back_in_input_order_and_the_inputs_spread_over_the_engines():
    a, b = EmbeddingEngine("a", delay=0.01), EmbeddingEngine("b")
    pool = pool_of(a, b)
    plan = plan_embeddings(pool, prompts(1, 2, 3, 4))
    outputs = await run_embeddings(pool, plan)
    assert [output.embedding for output in outputs] == [[1.0, 3.0], [2.0, 3.0], [3.0, 3.0], [4.0, 3.0]]
    assert [output.prompt_tokens for output in outputs] == [4, 4, 4, 4]
    assert len(a.asked) == 2 and len(b.asked) == 2  # round-robin, one input at a time
    rids = [request.rid for request in plan.inputs]
    assert len(set(rids)) == 4 and {len(rid) for rid in rids} == {36}
    assert sorted(a.asked + b.asked) == sorted(rids) and a.aborted == b.aborted == []


async def test_a_failing_input_fails_the_request_and_aborts_the_inputs_still_running():
    engine = EmbeddingEngine("a", fail={2: EngineInvalidArgument("prompt too long")}, hang={1, 3})
    pool = pool_of(engine)
    plan = plan_embeddings(pool, prompts(1, 2, 3))
    with pytest.raises(ApiError) as caught:
        await run_embeddings(pool, plan)
    assert caught.value.status == 400 and "prompt too long" in caught.value.message
    hung = {plan.inputs[0].rid, plan.inputs[2].rid}
    assert set(engine.aborted) == hung  # the failed one ended at the engine: no Abort owed for it


async def test_a_client_that_leaves_aborts_every_unanswered_input_once():
    engine = EmbeddingEngine("a", hang={1, 2})
    pool = pool_of(engine)
    plan = plan_embeddings(pool, prompts(1, 2, 3))
    with trio.move_on_after(0.2):
        await run_embeddings(pool, plan)
    assert sorted(engine.aborted) == sorted([plan.inputs[0].rid, plan.inputs[1].rid])
    assert engine.open_calls == 0


async def test_an_unreachable_engine_is_left_for_another():
    down = EmbeddingEngine("down", fail={7: EngineUnavailable("refused")})
    up = EmbeddingEngine("up")
    pool = pool_of(down, up)
    plan = plan_embeddings(pool, prompts(7))
    outputs = await run_embeddings(pool, plan)
    assert outputs[0].embedding == [7.0, 3.0]
    assert down.asked == up.asked == [plan.inputs[0].rid]


async def watched(pool: ModelPool, plan, stall_timeout: float) -> list[EmbedOutput]:
    """`run_embeddings` with the frontend's stream watch running, as `serve` runs it."""
    pool.watch = watch = StreamWatch(stall_timeout=stall_timeout)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        try:
            return await run_embeddings(pool, plan)
        finally:
            nursery.cancel_scope.cancel()


async def test_an_engine_that_answers_nothing_within_the_idle_timeout_is_aborted_and_left(autojump_clock):
    hung = EmbeddingEngine("hung", hang={7})
    up = EmbeddingEngine("up")
    pool = pool_of(hung, up, idle_timeout=30.0)
    plan = plan_embeddings(pool, prompts(7))
    before = trio.current_time()
    outputs = await watched(pool, plan, 30.0)
    assert outputs[0].embedding == [7.0, 3.0]
    assert 30.0 <= trio.current_time() - before <= 30.0 + 30.0 / 4  # found at the watch's next tick
    assert hung.aborted == [plan.inputs[0].rid] and hung.open_calls == 0
    assert up.asked == [plan.inputs[0].rid]


async def test_an_engine_that_answers_other_inputs_is_busy_not_hung(autojump_clock):
    """As for streams: a slow call on an engine that answers others meanwhile is waited for."""
    busy = EmbeddingEngine("busy", delays={1: 25.0, 7: 50.0})
    pool = pool_of(busy, idle_timeout=30.0)
    plan = plan_embeddings(pool, prompts(1, 7))
    outputs = await watched(pool, plan, 30.0)
    assert [output.embedding for output in outputs] == [[1.0, 3.0], [7.0, 3.0]]
    assert busy.aborted == [] and len(busy.asked) == 2


async def test_with_the_idle_timeout_off_an_embed_call_may_take_as_long_as_it_takes(autojump_clock):
    slow = EmbeddingEngine("slow", delay=600.0)
    pool = pool_of(slow, idle_timeout=0.0)
    outputs = await watched(pool, plan_embeddings(pool, prompts(3)), 0.0)
    assert outputs[0].embedding == [3.0, 3.0] and slow.aborted == []


async def test_a_batch_keeps_a_bounded_number_of_calls_open():
    from trio_direct.core.embedding import MAX_CALLS_IN_FLIGHT

    engine = EmbeddingEngine("a", delay=0.001)
    pool = pool_of(engine)
    outputs = await run_embeddings(pool, plan_embeddings(pool, prompts(*range(3 * MAX_CALLS_IN_FLIGHT))))
    assert len(outputs) == 3 * MAX_CALLS_IN_FLIGHT and engine.most_open <= MAX_CALLS_IN_FLIGHT


def test_a_generation_model_or_a_bad_input_is_refused_before_any_engine_is_asked():
    with pytest.raises(ApiError) as caught:
        plan_embeddings(pool_of(EmbeddingEngine("a"), embedding=False), prompts(1))
    assert caught.value.code == "model_not_supported"
    with pytest.raises(ApiError) as caught:
        plan_embeddings(pool_of(EmbeddingEngine("a")), [Prompt([1], ""), Prompt([], "")], listed=True)
    assert caught.value.param == "input[1]"
    with pytest.raises(ApiError) as caught:
        plan_embeddings(pool_of(EmbeddingEngine("a")), [Prompt([1] * 100, "")])
    assert caught.value.code == "context_length_exceeded"


async def test_an_embed_call_left_early_is_aborted_and_one_answered_is_not():
    engine = EmbeddingEngine("a", hang={1})
    request = EmbedInput(rid="r" * 36, input_ids=[1])
    with trio.move_on_after(0.05):
        await embed_on_engine(engine, request, abort_timeout=1.0)  # type: ignore[arg-type]  # a partial engine client
    assert engine.aborted == ["r" * 36]
    await embed_on_engine(engine, EmbedInput(rid="s" * 36, input_ids=[2]), abort_timeout=1.0)  # type: ignore[arg-type]  # a partial engine client
    assert engine.aborted == ["r" * 36]
