"""Where a chat prompt is encoded: on the event loop when what the prompt prefix cache leaves to
encode is cheap (a conversation's follow-up), on a worker thread when it is not (a long new
prompt, a follow-up that adds a long turn), and always to the ids a whole encode gives."""

from __future__ import annotations

import json
import threading

import pytest

from trio_direct.openai.requests import decode_chat_request
from trio_direct.surfaces import prompting
from trio_direct.surfaces.chat import plan_chat
from trio_direct.text.tokenizer import ModelTokenizer, PromptEncoding


def words(n: int, seed: int) -> str:
    """`n` words of prose, a new conversation per `seed` (no prefix shared past the template's)."""
    return f"Conversation {seed}: " + "lorem ipsum dolor sit amet " * (n // 5)


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


async def chat(pool, messages: list[dict]) -> list[int]:
    body = {"model": "m", "messages": messages}
    plan = await plan_chat(pool, decode_chat_request(json.dumps(body).encode()))
    return plan.prompts[0].token_ids


def whole_encode(tokenizer: ModelTokenizer, messages: list[dict]) -> list[int]:
    from trio_direct.text.chat_template import render_chat

    return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)


async def test_a_follow_up_whose_history_is_cached_is_encoded_on_the_loop_and_a_long_new_prompt_on_a_thread(
    make_pool, tokenizer, finishes
):
    pool = make_pool(context_length=None)
    history = [{"role": "user", "content": words(6000, seed=1)}]
    assert await chat(pool, history) == whole_encode(tokenizer, history)
    (first,) = finishes
    assert first[0] > prompting.LOOP_ENCODE_NS and not first[1], "a long new prompt went to a worker thread"

    follow_up = [*history, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And then?"}]
    assert await chat(pool, follow_up) == whole_encode(tokenizer, follow_up)
    cost, on_loop = finishes[1]
    assert on_loop and cost <= prompting.LOOP_ENCODE_NS, "the cached history left little to encode: on the loop"
    assert cost < first[0] / 2

    long_turn = [*follow_up, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": words(6000, 2)}]
    assert await chat(pool, long_turn) == whole_encode(tokenizer, long_turn)
    assert not finishes[2][1], "a follow-up that adds a long turn is encoded on a worker thread"


async def test_a_short_chat_is_encoded_on_the_loop_and_a_huge_one_rendered_and_encoded_on_a_thread(
    make_pool, tokenizer, finishes, monkeypatch
):
    pool = make_pool(context_length=None)
    short = [{"role": "user", "content": "Hello there"}]
    assert await chat(pool, short) == whole_encode(tokenizer, short)
    assert finishes[-1][1]
    rendered_on: list[bool] = []
    from trio_direct.surfaces import chat as chat_surface

    render = chat_surface._render

    def recording(*args):
        rendered_on.append(threading.current_thread() is threading.main_thread())
        return render(*args)

    monkeypatch.setattr(chat_surface, "_render", recording)
    huge = [{"role": "user", "content": "lorem ipsum " * (prompting.LOOP_RENDER_CHARS // 12 + 1)}]
    assert await chat(pool, huge) == whole_encode(tokenizer, huge)
    assert rendered_on == [False], "messages past LOOP_RENDER_CHARS are rendered on a worker thread"
