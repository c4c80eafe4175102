"""A stream whose engine fails mid-way continues on another engine, and the client reads one stream.

Scripted in-process engines stand in for the transport (see test_render.py): what is asserted is
what the client reads, what each engine is asked, and which engine calls get their Abort.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from core.test_render import Digits, ScriptedEngine, Writer, events

from trio_direct import metrics
from trio_direct.config import ServeConfig
from trio_direct.core.migration import continuation_request, migration_refusal
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.output import ChoiceOutput
from trio_direct.core.plan import ChoicePlan, Prompt, RequestPlan
from trio_direct.core.render import StreamCutter, stream_response, unary_response
from trio_direct.engine.errors import (
    EngineCancelled,
    EngineError,
    EngineInternal,
    EngineInvalidArgument,
    EngineResourceExhausted,
    EngineStalled,
    EngineUnavailable,
)  # fmt: skip
from trio_direct.engine.types import GenerateChunk, GenerateInput, SamplingOptions
from trio_direct.fleet.fleet import Engine, Fleet
from trio_direct.parsers.reasoning import reasoning_parser
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.surfaces.chat import ChatRenderer
from trio_direct.surfaces.completions import CompletionRenderer
from trio_direct.text.stop_strings import StopStringMatcher

RID = "a" * 32 + "0000"


class RecordingEngine(ScriptedEngine):
    """A scripted engine that also records every request it is sent."""

    def __init__(self, script: list, name: str) -> None:
        super().__init__(script, name=name)
        self.requests: list[GenerateInput] = []

    def generate(self, request: GenerateInput):
        self.requests.append(request)
        return super().generate(request)


def stand_in(**attributes: object) -> Any:
    """An engine card or fleet model with only the attributes serving reads (typed as what it stands in for)."""
    return SimpleNamespace(**attributes)


#: Routing and migration never tokenize.
NO_TOKENIZER: Any = None


def fleet_of(*scripts: list, migrations: int = 1, sampling: SamplingOptions | None = None, stops=None):
    clients = [RecordingEngine(script, f"engine{i}") for i, script in enumerate(scripts)]
    engines = [
        Engine(f"e{i}", stand_in(role="aggregated", dp_size=1, url=f"grpc://e{i}:1"), client, healthy=True)  # type: ignore[arg-type]  # a partial engine client
        for i, client in enumerate(clients)
    ]
    pool = ModelPool(
        ServeConfig(migration_limit=migrations),
        Fleet(engines, model=stand_in(served_model_name="m", context_length=None)),
        RoutingPolicy(),  # round-robin: the first request goes to e0, the next route to e1
        tokenizer=NO_TOKENIZER, chat_template_override=None,
    )  # fmt: skip
    request = GenerateInput(rid=RID, input_ids=[1, 2], sampling=sampling or SamplingOptions(max_new_tokens=4))
    output = ChoiceOutput(0, Digits(), stops)
    plan = RequestPlan(
        id="cmpl-x", key="a" * 32, created=0, model="m", prompts=[Prompt([1, 2], "go")],
        choices=[ChoicePlan(request, output)], stream=True, include_usage=True,
    )  # fmt: skip
    return pool, plan, clients


async def read(pool, plan) -> tuple[list, list]:
    writer = Writer()
    await stream_response(pool, plan, CompletionRenderer(plan, str), writer, started=0.0, cutter=StreamCutter())
    body = events(writer.writes)
    return [e for e in body if isinstance(e, dict) and e.get("choices")], body


def text_of(chunks: list) -> str:
    return "".join(e["choices"][0]["text"] for e in chunks)


def finishes(chunks: list) -> list:
    return [e["choices"][0]["finish_reason"] for e in chunks if e["choices"][0]["finish_reason"]]


async def test_a_stream_broken_mid_way_continues_on_another_engine_as_one_stream():
    first = [GenerateChunk([3]), GenerateChunk([4]), EngineUnavailable("connection lost")]
    rest = [GenerateChunk([5]), GenerateChunk([6], finish_reason="length", prompt_tokens=4, completion_tokens=2)]
    pool, plan, (broken, healthy) = fleet_of(first, rest)
    chunks, body = await read(pool, plan)
    assert text_of(chunks) == "3456" and finishes(chunks) == ["length"]
    usage = next(e for e in body if isinstance(e, dict) and e.get("usage"))["usage"]
    assert usage["completion_tokens"] == 4 and usage["prompt_tokens"] == 2  # as the client sees it
    assert body[-1] == "[DONE]" and not any("error" in e for e in body if isinstance(e, dict))
    (continuation,) = healthy.requests
    assert list(continuation.input_ids) == [1, 2, 3, 4]  # the prompt and what was generated
    assert continuation.sampling.max_new_tokens == 2  # the budget less what was sent
    assert continuation.rid != RID and len(continuation.rid) == len(RID)
    assert broken.aborted == [RID] and healthy.aborted == []  # the failed call got its Abort
    assert broken.open_calls == healthy.open_calls == 0


async def test_a_unary_answer_is_whole_after_its_engine_failed():
    first = [GenerateChunk([3]), EngineStalled("no output")]
    rest = [GenerateChunk([4, 5, 6], finish_reason="length")]
    pool, plan, _ = fleet_of(first, rest)
    plan.stream = False
    body = await unary_response(pool, plan, CompletionRenderer(plan, str), cutter=StreamCutter())
    assert b'"text":"3456"' in body and b'"completion_tokens":4' in body


async def test_stop_strings_carry_over_the_move():
    """A stop string begun on the failed engine is recognised when the continuation completes it."""
    first = [GenerateChunk([3]), GenerateChunk([4]), EngineUnavailable("connection lost")]
    rest = [GenerateChunk([5]), GenerateChunk([6]), GenerateChunk([7], finish_reason="length")]
    sampling = SamplingOptions(max_new_tokens=8)
    pool, plan, (_, healthy) = fleet_of(first, rest, sampling=sampling, stops=StopStringMatcher(("45",), False))
    chunks, _ = await read(pool, plan)
    assert text_of(chunks) == "3" and finishes(chunks) == ["stop"]
    assert healthy.aborted == [healthy.requests[0].rid]  # stopped by the frontend: the engine is told


async def test_no_migration_past_the_limit_or_when_disabled():
    first = [GenerateChunk([3]), EngineUnavailable("connection lost")]
    pool, plan, (_, healthy) = fleet_of(first, [GenerateChunk([4], finish_reason="length")], migrations=0)
    chunks, body = await read(pool, plan)
    assert text_of(chunks) == "3" and "error" in body[-2] and healthy.requests == []


async def test_a_second_failure_past_a_limit_of_one_ends_the_stream_with_an_error():
    """K=1: the stream moves once; when its second engine fails too, the client gets the text so far
    and an error event, the third engine is never asked, and the metric says the limit was reached."""
    exhausted = metrics.MIGRATIONS.labels("exhausted")
    before = exhausted._value.get()
    first = [GenerateChunk([3]), EngineUnavailable("connection lost")]
    second = [GenerateChunk([4]), EngineUnavailable("connection lost again")]
    pool, plan, (one, two, three) = fleet_of(first, second, [GenerateChunk([5], finish_reason="length")])
    chunks, body = await read(pool, plan)
    assert text_of(chunks) == "34" and finishes(chunks) == []
    assert "error" in body[-2] and body[-1] == "[DONE]"
    assert len(two.requests) == 1 and three.requests == []
    assert one.aborted == [RID] and two.aborted == [two.requests[0].rid]
    assert exhausted._value.get() == before + 1


async def test_guided_decoding_and_request_faults_are_not_migrated():
    guided = SamplingOptions(max_new_tokens=4, json_schema="{}")
    pool, plan, (_, healthy) = fleet_of([GenerateChunk([3]), EngineUnavailable("lost")], [], sampling=guided)
    _, body = await read(pool, plan)
    assert "error" in body[-2] and healthy.requests == []
    pool, plan, (_, healthy) = fleet_of([GenerateChunk([3]), EngineInvalidArgument("bad")], [])
    _, body = await read(pool, plan)
    assert "error" in body[-2] and healthy.requests == []


async def test_an_engine_failing_after_the_last_token_ends_the_stream_at_its_length():
    pool, plan, (_, healthy) = fleet_of([GenerateChunk([3, 4]), EngineUnavailable("lost")], [])
    plan.choices[0].request.sampling = SamplingOptions(max_new_tokens=2)
    chunks, _ = await read(pool, plan)
    assert text_of(chunks) == "34" and finishes(chunks) == ["length"] and healthy.requests == []


def test_which_failures_move_a_stream():
    request = GenerateInput(rid=RID, input_ids=[1])
    error: EngineError
    for error in (EngineUnavailable(), EngineStalled(), EngineInternal()):
        assert migration_refusal(request, error) is None, error
    for error in (EngineInvalidArgument(), EngineResourceExhausted(), EngineCancelled()):
        assert migration_refusal(request, error) is not None, error
    for field in ("json_schema", "regex", "ebnf", "structural_tag"):
        guide: dict[str, Any] = {field: "x"}
        guided = replace(request, sampling=SamplingOptions(**guide))
        refusal = migration_refusal(guided, EngineUnavailable())
        assert refusal is not None and "guided" in refusal


def test_the_continuation_request():
    sampling = SamplingOptions(temperature=0.3, max_new_tokens=10, min_new_tokens=5, seed=7, stop=("x",))
    request = GenerateInput(rid=RID, input_ids=[1, 2], sampling=sampling, routed_dp_rank=1, priority=3)
    continuation = continuation_request(request, [1, 2], [7, 8, 9], "b" * 36)
    assert continuation is not None
    assert list(continuation.input_ids) == [1, 2, 7, 8, 9] and continuation.rid == "b" * 36
    assert (continuation.sampling.max_new_tokens, continuation.sampling.min_new_tokens) == (7, 2)
    assert continuation.sampling.temperature == 0.3 and continuation.sampling.seed == 7
    assert continuation.priority == 3 and continuation.routed_dp_rank is None  # routing decides again
    unbounded = replace(request, sampling=SamplingOptions())
    unbounded_continuation = continuation_request(unbounded, [1], [2] * 50, "c" * 36)
    assert unbounded_continuation is not None and unbounded_continuation.sampling.max_new_tokens is None
    assert continuation_request(request, [1, 2], list(range(10)), "d" * 36) is None  # nothing left to generate


def pd_fleet_of(prefill_scripts: list[list], decode_scripts: list[list]):
    """Prefill and decode scripted engines (round-robin pairs: p0+d0 first, then p1+d1)."""

    def engines(role: str, scripts: list[list], first: int) -> tuple[list, list]:
        clients = [RecordingEngine(script, f"{role}{i}") for i, script in enumerate(scripts)]
        card = lambda i: stand_in(  # noqa: E731
            role=role, dp_size=1, url=f"grpc://{role}{i}:1", host=f"{role}{i}", bootstrap_host=None, bootstrap_port=8998
        )
        return clients, [Engine(f"e{first + i}", card(i), c, healthy=True) for i, c in enumerate(clients)]  # type: ignore[arg-type]  # a partial engine client

    prefills, prefill_engines = engines("prefill", prefill_scripts, 0)
    decodes, decode_engines = engines("decode", decode_scripts, len(prefill_scripts))
    pool = ModelPool(
        ServeConfig(migration_limit=1),
        Fleet(prefill_engines + decode_engines, model=stand_in(served_model_name="m", context_length=None)),
        RoutingPolicy(), tokenizer=NO_TOKENIZER, chat_template_override=None,
    )  # fmt: skip
    request = GenerateInput(rid=RID, input_ids=[1, 2], sampling=SamplingOptions(max_new_tokens=2))
    plan = RequestPlan(
        id="cmpl-x", key="a" * 32, created=0, model="m", prompts=[Prompt([1, 2], "go")],
        choices=[ChoicePlan(request, ChoiceOutput(0, Digits()))], stream=True,
    )  # fmt: skip
    return pool, plan, prefills, decodes


async def test_a_decode_engine_unreachable_before_the_first_token_gets_a_fresh_pair():
    """The decode leg fails before its first message: the choice is served by a new prefill +
    decode pair (a new room), and the client reads one whole stream."""
    done = GenerateChunk([], finish_reason="length", prompt_tokens=2)
    prefill_script = [GenerateChunk([0]), done]
    answer = [GenerateChunk([7]), GenerateChunk([8], finish_reason="length", completion_tokens=2)]
    pool, plan, prefills, decodes = pd_fleet_of(
        [list(prefill_script), list(prefill_script)], [[EngineUnavailable("connection lost")], answer]
    )
    chunks, body = await read(pool, plan)
    assert text_of(chunks) == "78" and finishes(chunks) == ["length"]
    assert not any("error" in e for e in body if isinstance(e, dict))
    (first,), (second,) = decodes[0].requests, decodes[1].requests
    assert list(second.input_ids) == [1, 2] and second.rid != first.rid
    assert second.bootstrap is not None and second.bootstrap.room != first.bootstrap.room
    assert [r.rid for r in prefills[1].requests] == [second.rid]  # its own prefill leg
    assert decodes[0].aborted == [first.rid]


#: A small vocabulary: a `<think>` block, then an answer.
VOCAB = {3: "<think>", 4: "weigh ", 5: "it", 6: "</think>", 7: "Yes", 8: ", done"}


class Words:
    """A detokenizer over `VOCAB`."""

    def prepare(self) -> None:
        pass

    def push(self, token_ids: list[int]) -> str:
        return "".join(VOCAB[t] for t in token_ids)

    def flush(self) -> str:
        return ""


async def test_reasoning_begun_on_the_failed_engine_is_closed_by_the_continuation():
    """The reasoning parser's state moves with the stream: a `<think>` block opened on the first
    engine and closed on the second splits into reasoning_content and content as one stream would."""
    first = [GenerateChunk([3]), GenerateChunk([4]), EngineUnavailable("connection lost")]
    rest = [GenerateChunk([5]), GenerateChunk([6]), GenerateChunk([7]), GenerateChunk([8], finish_reason="length")]
    pool, plan, (_, healthy) = fleet_of(first, rest, sampling=SamplingOptions(max_new_tokens=6))
    choice = plan.choices[0]
    choice.output = ChoiceOutput(0, Words(), reasoning_parser=reasoning_parser("deepseek_r1"))
    writer = Writer()
    renderer = ChatRenderer(plan, lambda token_id: VOCAB[token_id])
    await stream_response(pool, plan, renderer, writer, started=0.0, cutter=StreamCutter())
    deltas = [e["choices"][0]["delta"] for e in events(writer.writes) if isinstance(e, dict) and e.get("choices")]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == ("weigh it", "Yes, done")
    assert list(healthy.requests[0].input_ids) == [1, 2, 3, 4]  # the continuation repeats what was generated
