"""`POST /v1/tokenize`, `/v1/detokenize` (and SGLang's `/tokenize`, `/detokenize`): the model's
tokenizer and chat template, run in the frontend; no engine is asked.

A chat-form tokenize renders the template exactly as `/v1/chat/completions` would for the same
messages (`surfaces.chat.chat_prompt`, image parts as their placeholders), so its count is the
prompt a chat request would send. `max_model_len` is the longest prompt the engines accept.

A text is counted exactly even past the context, so a client can learn by how much to cut it, as
long as that costs little: one the cheap checks of `surfaces.prompting` prove over the context
(from its length alone, or by a chunked count of a text over 8 characters per token of it) is
refused as a generation route refuses it (400, `context_length_exceeded`). Without a known context
length only the request body limit bounds a text; long ones are encoded on a worker thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from trio_direct.core.plan import check_vocab
from trio_direct.openai.tokenization import (
    decode_detokenize_request,
    decode_tokenize_request,
    detokenize_body,
    tokenize_body,
)
from trio_direct.surfaces.chat import chat_prompt
from trio_direct.surfaces.images import take_images
from trio_direct.surfaces.prompting import in_thread_if_costly, refuse_if_counted_over, refuse_if_too_long

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["detokenize", "max_model_len", "tokenize"]


async def tokenize(exchange: Exchange) -> None:
    request = decode_tokenize_request(exchange.body)
    pool = exchange.frontend.pool_or_only(request.model)
    if request.messages is not None:
        messages = take_images(msgspec.to_builtins(request.messages)).messages
        tools = msgspec.to_builtins(request.tools) if request.tools else None
        prompt = await chat_prompt(
            pool,
            messages,
            tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        tokens = list(prompt.token_ids)  # a chat prompt's are a compact array: JSON takes a list
        if request.add_special_tokens:
            tokens = await in_thread_if_costly(pool, [prompt.text], pool.tokenizer.encode, prompt.text, True)
        encoded, single = [tokens], True
    else:
        add_special = request.add_special_tokens is not False
        single = isinstance(request.prompt, str)
        prompts = [request.prompt] if isinstance(request.prompt, str) else list(request.prompt or ())
        for text in prompts:
            refuse_if_too_long(pool, len(text), param="prompt")
        encoded = await in_thread_if_costly(pool, prompts, _encode_all, pool, prompts, add_special)
    strs: list[Any] | None = None
    if request.return_token_strs:
        strs = [[pool.tokenizer.id_to_token(t) for t in ids] for ids in encoded]
    if single:
        body = tokenize_body(encoded[0], max_model_len(pool), strs[0] if strs is not None else None)
    else:
        body = tokenize_body(list(encoded), max_model_len(pool), strs)
    await exchange.json(200, body)


def _encode_all(pool: PoolView, prompts: list[str], add_special_tokens: bool) -> list[list[int]]:
    encoded = []
    for text in prompts:
        refuse_if_counted_over(pool, text, param="prompt")
        encoded.append(pool.tokenizer.encode(text, add_special_tokens=add_special_tokens))
    return encoded


async def detokenize(exchange: Exchange) -> None:
    request = decode_detokenize_request(exchange.body)
    pool = exchange.frontend.pool_or_only(request.model)
    skip = request.skip_special_tokens
    lists = [item for item in request.tokens if isinstance(item, list)]
    if lists:  # SGLang's batch: one text per id list (mixed shapes were refused)
        texts = []
        for i, ids in enumerate(lists):
            check_vocab(pool, ids, param=f"tokens[{i}]")
            texts.append(pool.tokenizer.decode(ids, skip_special_tokens=skip))
        await exchange.json(200, detokenize_body(texts))
        return
    ids = [item for item in request.tokens if isinstance(item, int)]
    check_vocab(pool, ids, param="tokens")
    await exchange.json(200, detokenize_body(pool.tokenizer.decode(ids, skip_special_tokens=skip)))


def max_model_len(pool: PoolView) -> int:
    """The longest prompt the engines accept, else the tokenizer's `model_max_length`, else -1."""
    if pool.context_length is not None:
        return pool.context_length
    limit = pool.tokenizer.model_max_length
    return limit if limit is not None else -1
