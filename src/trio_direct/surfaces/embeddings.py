"""`POST /v1/embeddings`: OpenAI's embeddings over the engines' `Embed` RPC.

Inputs are tokenized here (text with the model's special tokens, as SGLang's server does; token ids
as given, checked against the vocabulary), each becomes one `Embed` call (`core.embedding`), and the
vectors come back in input order. `dimensions` follows SGLang: only a Matryoshka model (its
`config.json` has `matryoshka_dimensions` or `is_matryoshka`) may be cut, to one of its listed sizes
and at most `hidden_size`; the cut vector is L2-normalised again. Neither gRPC API carries
`dimensions`, so the frontend cuts the engine's full vector itself. Usage counts prompt tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.core.embedding import plan_embeddings, run_embeddings
from trio_direct.core.plan import Prompt, check_vocab
from trio_direct.core.request_context import CURRENT
from trio_direct.openai.embeddings import (
    EmbeddingRequest,
    decode_embedding_request,
    embedding_inputs,
    embeddings_body,
    truncate_normalized,
)
from trio_direct.surfaces.prompting import in_thread_if_costly, refuse_if_counted_over, refuse_if_too_long

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["handle", "output_dimensions"]

#: Floats above which the response body is encoded on a worker thread (~20 JSON bytes each).
_THREAD_THRESHOLD_FLOATS = 16384


async def handle(exchange: Exchange) -> None:
    request = decode_embedding_request(exchange.body)
    pool = exchange.frontend.pool(request.model)
    exchange.label(pool.name, False)
    prompts = await embedding_prompts(pool, request)
    listed = is_listed(request)
    plan = plan_embeddings(pool, prompts, listed=listed, session_key=exchange.session_key(request.user))
    dimensions = output_dimensions(pool.model_config, request.dimensions, pool.name)
    await exchange.admit(pool)  # the admission queue, as every generation waits in it
    with exchange.frontend.cutter.guard() as guard:
        outputs = await run_embeddings(pool, plan)
    if guard.cancelled_caught:
        raise errors.service_unavailable("The server is shutting down.")
    vectors: list[Sequence[float]] = [output.embedding for output in outputs]
    if dimensions is not None:
        if any(len(vector) < dimensions for vector in vectors):
            raise errors.invalid_request(
                f"Provided dimensions are greater than max embedding dimension: {min(map(len, vectors))}",
                param="dimensions",
            )
        vectors = [truncate_normalized(vector, dimensions) for vector in vectors]
    prompt_tokens = sum(output.prompt_tokens for output in outputs)
    metrics.TOKENS.labels(pool.name, "input").inc(prompt_tokens)
    context = CURRENT.get()
    if context is not None:  # the access log's token count
        context.prompt_tokens = prompt_tokens
    exchange.count_usage(prompt_tokens)
    size = sum(len(vector) for vector in vectors)
    args = (pool.name, vectors, prompt_tokens, request.encoding_format)
    if size > _THREAD_THRESHOLD_FLOATS:
        body = await trio.to_thread.run_sync(embeddings_body, *args)
    else:
        body = embeddings_body(*args)
    await exchange.json(200, body)


async def embedding_prompts(pool: PoolView, request: EmbeddingRequest) -> list[Prompt]:
    """One prompt per input: text tokenized with the model's special tokens (on a worker thread
    when that costs much), token ids checked against the vocabulary; a text that cannot fit the context is
    refused before it is encoded whole (`surfaces.prompting`)."""
    items = embedding_inputs(request)
    listed = is_listed(request)
    for index, item in enumerate(items):
        where = f"input[{index}]" if listed else "input"
        if isinstance(item, str):
            refuse_if_too_long(pool, len(item), param=where)
        else:
            check_vocab(pool, item, param=where)
    texts = [item for item in items if isinstance(item, str)]
    return await in_thread_if_costly(pool, texts, _prompts, pool, items, listed)


def is_listed(request: EmbeddingRequest) -> bool:
    """Whether `input` is a list of inputs (strings or id lists), not one string or one id list."""
    given = request.input
    return not isinstance(given, str) and not isinstance(given[0], int)


def _prompts(pool: PoolView, items: list[str | list[int]], listed: bool) -> list[Prompt]:
    prompts = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            refuse_if_counted_over(pool, item, param=f"input[{index}]" if listed else "input")
            prompts.append(Prompt(pool.tokenizer.encode(item, add_special_tokens=True), item))
        else:
            prompts.append(Prompt(item, ""))
    return prompts


def output_dimensions(model_config: Mapping[str, Any], dimensions: int | None, model: str) -> int | None:
    """The `dimensions` to cut vectors to, or None for the model's own; a 400 (SGLang's wording)
    for a model that is not Matryoshka, a size it does not list, or one above its `hidden_size`."""
    if dimensions is None:
        return None
    listed = model_config.get("matryoshka_dimensions")
    if not listed and not model_config.get("is_matryoshka"):
        raise errors.invalid_request(
            f"Model '{model}' does not support matryoshka representation, changing output dimensions will lead "
            "to poor results.",
            param="dimensions",
        )
    if listed and isinstance(listed, list) and dimensions not in listed:
        raise errors.invalid_request(
            f"Model '{model}' only supports {listed} matryoshka dimensions, using other output dimensions will "
            "lead to poor results.",
            param="dimensions",
        )
    hidden = model_config.get("hidden_size")
    if isinstance(hidden, int) and dimensions > hidden:
        raise errors.invalid_request(
            f"Provided dimensions are greater than max embedding dimension: {hidden}", param="dimensions"
        )
    return dimensions
