"""Plans, events and a model pool for the surfaces' unit tests: what the request core hands a
surface's planner and renderer (importable from every test folder: `from surface_support import ...`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trio_direct.config import ServeConfig
from trio_direct.core.output import ChoiceEvent, ChoiceOutput, ChoiceResult
from trio_direct.core.plan import ChoicePlan, Prompt, RequestPlan
from trio_direct.engine.types import GenerateInput
from trio_direct.parsers.tools import ToolCallDelta
from trio_direct.text.tokenizer import ModelTokenizer

KEY = "ab" * 16
CREATED = 1_700_000_000


class NoDecoder:
    def prepare(self) -> None:
        pass

    def push(self, token_ids: list[int]) -> str:
        return ""

    def flush(self) -> str:
        return ""


def one_choice_plan(
    prefix: str, *, prompt_tokens: int = 12, completion_tokens: int = 7, cached: int = 4
) -> RequestPlan:
    """A planned one-choice request whose usage reads as given."""
    output = ChoiceOutput(0, NoDecoder(), prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
    output.cached_tokens = cached
    prompt = Prompt(list(range(prompt_tokens)), "prompt")
    choice = ChoicePlan(GenerateInput(rid=KEY + "0000", input_ids=prompt.token_ids), output)
    return RequestPlan(id=prefix + KEY, key=KEY, created=CREATED, model="m", prompts=[prompt], choices=[choice])


def event(
    text: str = "", *, reasoning: str = "", calls: Sequence[ToolCallDelta] = (), finish: str | None = None, matched=None
):
    return ChoiceEvent(0, text, [], finish, matched, reasoning=reasoning, tool_calls=list(calls))


def call(index: int, arguments: str, *, name: str | None = None, call_id: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(index, call_id, name, arguments)


#: A Qwen3-style turn: reasoning, a sentence, then a tool call whose arguments arrive in pieces.
TOOL_TURN = [
    [event(reasoning="The user wants ")],
    [event(reasoning="the weather.")],
    [event("\n\n")],
    [event("Let me "), event("check.")],
    [event(calls=[call(0, '{"city": ', name="get_weather", call_id="call_1")])],
    [event(calls=[call(0, '"Paris"}')]), event("\n", finish="tool_calls")],
]


def result_of(batches: list[list[ChoiceEvent]]) -> ChoiceResult:
    result = ChoiceResult(0)
    for batch in batches:
        for item in batch:
            result.add(item)
    return result


def stream(renderer, plan: RequestPlan, batches: list[list[ChoiceEvent]]) -> bytes:
    """What `core.render.stream_response` writes for these batches, end to end."""
    renderer.prepare()
    data = renderer.opening()
    for batch in batches:
        data += renderer.events(batch)
    return data + renderer.closing(plan.usage())


def sse_records(data: bytes) -> Iterator[tuple[str, bytes]]:
    """(event name, data) of each named SSE event; every record is exactly one event line and one data line."""
    assert data.endswith(b"\n\n")
    for record in data[:-2].split(b"\n\n"):
        name, payload = record.split(b"\n")
        assert name.startswith(b"event: ") and payload.startswith(b"data: ")
        yield name[len(b"event: ") :].decode(), payload[len(b"data: ") :]


#: A template that shows the switch a request's mapping sets (`chat_template_kwargs.enable_thinking`).
SWITCHES_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}enable_thinking={{ enable_thinking }}"
)


def tiny_pool(
    model: Path,
    *,
    reasoning_parser: str | None = "qwen3",
    tool_call_parser: str | None = "hermes",
    chat_template: str | None = None,
) -> Any:
    """A model pool as planning sees it: the tiny ChatML model's tokenizer and template (or
    `chat_template`), no engines. Typed `Any`: it stands in for the concrete `ModelPool` with only
    the attributes planning reads."""
    return SimpleNamespace(
        name="tiny",
        config=ServeConfig(),
        tokenizer=ModelTokenizer.from_directory(model),
        chat_template_override=chat_template,
        harmony=False,
        context_length=4096,
        reasoning_parser=reasoning_parser,
        tool_call_parser=tool_call_parser,
        is_embedding=False,
        supports_images=False,
        model_config={},
    )
