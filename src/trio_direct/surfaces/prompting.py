"""Prompt work every surface shares: long prompts are rendered and tokenized off the event loop,
and a prompt that cannot fit the model's context is refused before the work that costs memory.

A prompt's cost grows with its length (the template's rendering, the tokenizer's encoding), so a
20 MB prompt string must not be rendered and encoded whole only to be refused: first a bound from
its length alone (`refuse_if_too_long`: no token stands for more than the vocabulary's longest
entry allows, and every chat message renders to a token at least), then, for a text far longer than
the context, a count in chunks that stops at the limit (`ModelTokenizer.exceeds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from trio_direct.core import errors

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView

__all__ = [
    "THREAD_THRESHOLD_CHARS",
    "content_chars",
    "in_thread_if_long",
    "refuse_if_counted_over",
    "refuse_if_too_long",
]

#: Prompts longer than this (characters) are rendered and tokenized on a worker thread, so that one
#: long prompt does not stall every other stream on the event loop.
THREAD_THRESHOLD_CHARS = 4096

T = TypeVar("T")


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
