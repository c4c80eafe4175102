"""From a validated OpenAI request to the engine's `SamplingOptions`.

Values the client did not give stay `None` (engine default); the SMG adapter fills SGLang's semantic
defaults. Structured output becomes the one grammar constraint the engine accepts, the way SGLang's
own gateway maps it: `json_object` is the schema `{"type": "object"}`, `json_schema` its schema as
JSON text.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from trio_direct.engine.types import SamplingOptions
from trio_direct.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
)

_JSON_OBJECT_SCHEMA = '{"type":"object"}'


def stop_strings(request: GenerationRequest) -> tuple[str, ...]:
    """The request's stop strings, whether given as one string or a list."""
    stop = request.stop
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


def max_new_tokens(request: GenerationRequest, default: int | None = None) -> int | None:
    """The completion budget: `max_completion_tokens` over `max_tokens`, else `default`."""
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
        return request.max_completion_tokens
    if request.max_tokens is not None:
        return request.max_tokens
    return default


def sampling_options(
    request: ChatCompletionRequest | CompletionRequest,
    *,
    eos_token_ids: Collection[int],
    default_max_tokens: int | None = None,
) -> SamplingOptions:
    """Engine sampling parameters for one choice of `request`.

    `eos_token_ids` (the tokenizer's EOS set) are added to `stop_token_ids` unless `ignore_eos`:
    an engine started without its tokenizer, or one whose config lists fewer EOS ids than the
    generation config, would otherwise run past the end of a turn. Stop strings are passed on as
    well; the frontend also cuts text at them itself.
    """
    stop_token_ids = list(request.stop_token_ids or ())
    if not request.ignore_eos:
        stop_token_ids.extend(sorted(set(eos_token_ids).difference(stop_token_ids)))
    top_k = request.top_k
    if top_k == 0:  # OpenAI-style clients mean "off"; SGLang spells that -1
        top_k = -1
    json_schema = None
    response_format = request.response_format
    if isinstance(response_format, ResponseFormatJsonObject):
        json_schema = _JSON_OBJECT_SCHEMA
    elif isinstance(response_format, ResponseFormatJsonSchema):
        json_schema = msgspec.json.encode(response_format.json_schema.schema).decode()
    return SamplingOptions(
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=top_k,
        min_p=request.min_p,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
        repetition_penalty=request.repetition_penalty,
        max_new_tokens=max_new_tokens(request, default_max_tokens),
        min_new_tokens=request.min_tokens,
        stop=stop_strings(request),
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=True if request.ignore_eos else None,
        seed=request.seed,
        json_schema=json_schema,
        regex=request.regex,
        ebnf=request.ebnf,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
    )


def logprob_options(request: ChatCompletionRequest | CompletionRequest) -> tuple[bool, int]:
    """`(return_logprob, top_logprobs_num)` for the engine: chat's `logprobs`/`top_logprobs`, or the
    legacy completions `logprobs` count (where `logprobs: 0` still asks for the chosen token's)."""
    if isinstance(request, ChatCompletionRequest):
        return request.logprobs, (request.top_logprobs or 0) if request.logprobs else 0
    if request.logprobs is None:
        return False, 0
    return True, request.logprobs
