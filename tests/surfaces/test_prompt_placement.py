"""Where a chat prompt is rendered and encoded: on the event loop when what the prompt prefix cache
leaves to encode is cheap (a conversation's follow-up), on a worker thread when it is not (a long
new prompt, a follow-up that adds a long turn) or when the template's work is (very long messages,
many of them, many tools); always to the ids a whole encode gives."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from trio_direct.openai.requests import decode_chat_request
from trio_direct.surfaces import chat as chat_surface
from trio_direct.surfaces import prompting
from trio_direct.surfaces.chat import plan_chat
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer, PromptEncoding


def words(tokenizer: ModelTokenizer, n: int, seed: int) -> str:
    """`n` words of the vocabulary (a token each), a new conversation per `seed` (no prefix shared
    past the template's)."""
    vocabulary = sorted(t[1:] for t in tokenizer.tokenizer.get_vocab() if t[:1] == "Ġ" and t[1:].isalpha())
    return f"Conversation {seed}:" + "".join(f" {vocabulary[(i * 7919) % len(vocabulary)]}" for i in range(n))


@pytest.fixture
def finishes(monkeypatch) -> list[tuple[int, bool]]:
    """Every prompt encoding finished, as (its estimated cost in ns, on the event loop's thread)."""
    seen: list[tuple[int, bool]] = []
    finish = PromptEncoding.finish

    def recording(self: PromptEncoding):
        seen.append((self.cost_ns, threading.current_thread() is threading.main_thread()))
        return finish(self)

    monkeypatch.setattr(PromptEncoding, "finish", recording)
    return seen


async def chat(pool, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    body: dict = {"model": "m", "messages": messages}
    if tools:
        body["tools"] = tools
    plan = await plan_chat(pool, decode_chat_request(json.dumps(body).encode()))
    return list(plan.prompts[0].token_ids)


def whole_encode(tokenizer: ModelTokenizer, messages: list[dict], **render) -> list[int]:
    return tokenizer.encode(render_chat(tokenizer, messages, **render), add_special_tokens=False)


@pytest.fixture
def rendered_on(monkeypatch) -> list[bool]:
    """Every chat rendered, as whether it was on the event loop's thread."""
    seen: list[bool] = []
    render = chat_surface._render

    def recording(*args):
        seen.append(threading.current_thread() is threading.main_thread())
        return render(*args)

    monkeypatch.setattr(chat_surface, "_render", recording)
    return seen


async def test_a_follow_up_whose_history_is_cached_is_encoded_on_the_loop_and_a_long_new_prompt_on_a_thread(
    make_pool, tokenizer, finishes
):
    pool = make_pool(context_length=None)
    history = [{"role": "user", "content": words(tokenizer, 5000, seed=1)}]
    assert await chat(pool, history) == whole_encode(tokenizer, history)
    (first,) = finishes
    assert first[0] > prompting.LOOP_ENCODE_NS and not first[1], "a long new prompt went to a worker thread"

    follow_up = [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And then?"}]
    assert await chat(pool, follow_up) == whole_encode(tokenizer, follow_up)
    cost, on_loop = finishes[1]
    assert on_loop and cost <= prompting.LOOP_ENCODE_NS, "the cached history left little to encode: on the loop"
    assert cost < first[0] / 4

    long_turn = [
        *follow_up,
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": words(tokenizer, 5000, 2)},
    ]
    assert await chat(pool, long_turn) == whole_encode(tokenizer, long_turn)
    assert not finishes[2][1], "a follow-up that adds a long turn is encoded on a worker thread"


async def test_a_short_chat_is_encoded_on_the_loop_and_a_huge_one_rendered_and_encoded_on_a_thread(
    make_pool, tokenizer, finishes, rendered_on
):
    pool = make_pool(context_length=None)
    short = [{"role": "user", "content": "Hello there"}]
    assert await chat(pool, short) == whole_encode(tokenizer, short)
    assert finishes[-1][1] and rendered_on == [True]
    huge = [{"role": "user", "content": "lorem ipsum " * (prompting.LOOP_RENDER_CHARS // 12 + 1)}]
    assert await chat(pool, huge) == whole_encode(tokenizer, huge)
    assert rendered_on == [True, False], "messages past LOOP_RENDER_CHARS are rendered on a worker thread"
    assert not finishes[-1][1]


def tool(index: int) -> dict:
    """A tool definition of ~900 characters as JSON, as agents send by the dozen."""
    properties = {f"p{i}": {"type": "string", "description": "A parameter of this tool. " * 3} for i in range(8)}
    parameters = {"type": "object", "properties": properties, "required": ["p0"]}
    return {
        "type": "function",
        "function": {"name": f"tool_{index}", "description": "Does a thing.", "parameters": parameters},
    }


async def test_a_chat_with_many_tools_is_rendered_on_a_thread_and_one_with_a_few_on_the_loop(
    make_pool, tokenizer, rendered_on
):
    """Templates write tools through `tojson`, at ~15-70 ns a character: fifty tools took a Llama 3
    template 3 ms. A short chat carrying that many is rendered on a worker thread."""
    template = (Path(__file__).parents[1] / "text" / "templates" / "qwen_tools.jinja").read_text()
    pool = make_pool(context_length=None, template=template)
    messages = [{"role": "user", "content": "What can you do?"}]
    few, many = [tool(i) for i in range(3)], [tool(i) for i in range(40)]
    assert len(json.dumps(many)) > prompting.LOOP_RENDER_TOOL_CHARS > len(json.dumps(few))
    for tools in (few, many):
        expected = whole_encode(tokenizer, messages, tools=tools, chat_template=template)
        assert await chat(pool, messages, tools) == expected
    assert rendered_on == [True, False]


async def test_a_chat_of_many_messages_is_rendered_on_a_thread(make_pool, tokenizer, rendered_on):
    """A template spends ~5 µs a message however short: an agent's chat of hundreds of messages
    would hold the event loop for milliseconds."""
    pool = make_pool(context_length=None)
    many = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i}"} for i in range(201)]
    assert len(many) > prompting.LOOP_RENDER_MESSAGES
    assert await chat(pool, many) == whole_encode(tokenizer, many)
    assert await chat(pool, many[:5]) == whole_encode(tokenizer, many[:5])
    assert rendered_on == [False, True]
