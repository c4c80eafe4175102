"""Prompt work every surface shares: costly prompts are rendered and tokenized off the event loop,
and a prompt that cannot fit the model's context is refused before the work that costs memory.

A prompt's cost grows with its length (the template's rendering, the tokenizer's encoding), so a
20 MB prompt string must not be rendered and encoded whole only to be refused: first a bound from
its length alone (`refuse_if_too_long`: no token stands for more than the vocabulary's longest
entry allows, and every chat message renders to a token at least), then, for a text far longer than
the context, a count in chunks that stops at the limit (`ModelTokenizer.exceeds`).

Where the work runs: a prompt whose encoding is estimated to take under `LOOP_ENCODE_NS` on the
event loop, a costlier one on a worker thread, so that it does not stall every other stream
(`in_thread_if_costly`; the estimate is the encoder's rate times the characters, and a text in a
script tiktoken does not cover is priced at Hugging Face's ~8x slower rate). A chat's length is a
poor guide to its encoding's cost: a multi-turn chat resends its history, which the prompt prefix
cache already holds, and only the new turn is encoded. Chat prompts are therefore rendered on the loop (up to `LOOP_RENDER_CHARS` of
messages, `LOOP_RENDER_MESSAGES` of them and `LOOP_RENDER_TOOL_CHARS` of tools), looked up in the
cache, and their encoding finished on the loop when what is left is cheap (`encode_rendered`): a
worker thread's hand-off and its turns with the loop for the GIL cost more than such an encoding.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trio_direct.core import errors

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.engine.packed_ids import PackedIds

__all__ = [
    "LOOP_ENCODE_NS",
    "LOOP_RENDER_CHARS",
    "LOOP_RENDER_MESSAGES",
    "LOOP_RENDER_TOOL_CHARS",
    "THREAD_THRESHOLD_CHARS",
    "content_chars",
    "counted_and_encoded",
    "encode_rendered",
    "in_thread_if_costly",
    "in_thread_if_long",
    "refuse_if_counted_over",
    "refuse_if_too_long",
]

#: gpt-oss (harmony) chats longer than this (characters) are rendered and tokenized on a worker
#: thread, so that one long prompt does not stall every other stream on the event loop.
THREAD_THRESHOLD_CHARS = 4096

#: Chat messages of up to this many characters are rendered on the event loop (a template writes
#: ~40k characters of a multi-turn chat in ~0.1 ms); their encoding goes where `encode_rendered`
#: decides. Longer ones are rendered and encoded on a worker thread.
LOOP_RENDER_CHARS = 128 * 1024

#: Chats of up to this many messages are rendered on the event loop: a template takes ~5 µs a
#: message (Llama 3's and Qwen's, 1,000 short messages in ~5 ms), whatever their length.
LOOP_RENDER_MESSAGES = 128

#: Tool definitions of up to this many characters (as JSON) are rendered with the messages on the
#: event loop. Templates write tools through `tojson`, slowly: Llama 3's took ~67 ns a character of
#: them (3.1 ms for fifty 930-character tools), Qwen's ~14; a chat with more is rendered and encoded
#: on a worker thread.
LOOP_RENDER_TOOL_CHARS = 16 * 1024

#: The most time a chat prompt's rendering, lookup and encoding may take on the event loop: its
#: encoding is finished there when `PromptEncoding.cost_ns` (an estimate) fits in what is left of
#: this, on a worker thread otherwise. A thread's hand-off costs ~0.1 ms of CPU by itself on a small
#: VM; with the loop and the thread taking turns with the GIL and each other's caches, encoding every
#: multi-turn chat on the loop instead measured 0.5-1.3 ms less CPU a request (a throwaway build).
LOOP_ENCODE_NS = 1_000_000

T = TypeVar("T")


async def encode_rendered(
    pool: PoolView, text: str, *, param: str = "messages", started_ns: int | None = None
) -> PackedIds:
    """The ids of a rendered chat prompt, packed for the wire: on the event loop when what is left
    after the prompt prefix cache (a conversation's history) costs little to encode, else on a
    worker thread. Little: the estimate (`PromptEncoding.cost_ns`) fits in `LOOP_ENCODE_NS` less
    what the loop has spent on this prompt since `started_ns` (`time.thread_time_ns()`, the loop's
    CPU time, taken before its rendering). A text long enough to be counted in chunks before it is
    encoded (`refuse_if_counted_over`) is counted and encoded on a worker thread."""
    limit = pool.context_length
    if limit is not None and pool.tokenizer.counts_in_chunks(text, limit):
        return await trio.to_thread.run_sync(counted_and_encoded, pool, text, param)
    encoding = pool.tokenizer.prompt_encoding(text)
    spent = 0 if started_ns is None else time.thread_time_ns() - started_ns
    if encoding.cost_ns <= LOOP_ENCODE_NS - spent:
        return encoding.finish()
    return await trio.to_thread.run_sync(encoding.finish)


def counted_and_encoded(pool: PoolView, text: str, param: str = "messages") -> PackedIds:
    """A rendered chat prompt refused if it counts past the context (`refuse_if_counted_over`), else
    its ids packed for the wire: all of it where it runs (a worker thread, for a long prompt)."""
    refuse_if_counted_over(pool, text, param=param)
    return pool.tokenizer.encode_prompt_packed(text)


async def in_thread_if_costly(pool: PoolView, texts: Sequence[str], fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)`, which encodes `texts` whole: on the event loop when that is estimated to take
    `LOOP_ENCODE_NS` or less (`ModelTokenizer.encode_cost_ns`, over all of them), on a worker thread
    otherwise, or when one of them is long enough to be counted in chunks before it is encoded
    (`refuse_if_counted_over`). A thread's hand-off costs more than a short encoding."""
    tokenizer, limit = pool.tokenizer, pool.context_length
    cost = 0
    for text in texts:
        cost += tokenizer.encode_cost_ns(text)
        if cost > LOOP_ENCODE_NS or (limit is not None and tokenizer.counts_in_chunks(text, limit)):
            return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


async def in_thread_if_long(size: int, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on a worker thread when the prompt is `size` characters or more, else inline."""
    if size > THREAD_THRESHOLD_CHARS:
        return await trio.to_thread.run_sync(fn, *args)
    return fn(*args)


def content_chars(messages: Iterable[Mapping[str, Any]]) -> int:
    """The characters of the messages' text (string contents and text parts), without copying it."""
    total = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    total += len(part["text"])
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str):
            total += len(reasoning)
    return total


def refuse_if_too_long(pool: PoolView, chars: int, messages: int = 0, *, param: str = "messages") -> None:
    """A 400 (context length) when a prompt of `chars` characters in `messages` chat messages
    cannot fit the model's context, judged from its length alone (no rendering, no tokenizing)."""
    limit = pool.context_length
    if limit is None:
        return
    bound = max(pool.tokenizer.min_tokens(chars), messages)
    if bound >= limit:
        raise errors.context_length_exceeded(bound, limit, None, param=param, at_least=True)


def refuse_if_counted_over(pool: PoolView, text: str, *, param: str = "messages") -> None:
    """A 400 (context length) when `text`, far longer than the context, counts past it in chunks
    (`ModelTokenizer.exceeds`), before it is encoded whole. Runs where the encoding would."""
    limit = pool.context_length
    if limit is None:
        return
    over = pool.tokenizer.exceeds(text, limit)
    if over is not None:
        raise errors.context_length_exceeded(over, limit, None, param=param, at_least=True)
