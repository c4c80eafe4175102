"""From a validated OpenAI request (or the sampling fields of another surface, spelled as chat
spells them) to the engine's `SamplingOptions`.

Values the client did not give stay `None` (engine default); the SMG adapter fills SGLang's semantic
defaults. Structured output becomes the one grammar constraint the engine accepts, the way SGLang's
own gateway maps it: `json_object` is the schema `{"type": "object"}`, `json_schema` its schema as
JSON text.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import msgspec

from trio_direct.engine.types import SamplingOptions
from trio_direct.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    SamplingExtras,
)

#: A `json_object` output format as the engine takes it: any JSON object.
JSON_OBJECT_SCHEMA = '{"type":"object"}'


def stop_strings(request: GenerationRequest) -> tuple[str, ...]:
    """The request's stop strings, whether given as one string or a list."""
    return stop_tuple(request.stop)


def stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    """Stop strings given as one string, a list or nothing, as a tuple."""
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


def json_schema_text(schema: dict[str, Any] | None) -> str:
    """A `json_schema` output format's schema as the engine takes it: JSON text."""
    return msgspec.json.encode(schema).decode()


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
    json_schema = None
    response_format = request.response_format
    if isinstance(response_format, ResponseFormatJsonObject):
        json_schema = JSON_OBJECT_SCHEMA
    elif isinstance(response_format, ResponseFormatJsonSchema):
        json_schema = json_schema_text(response_format.json_schema.schema)
    return extension_sampling(
        request,
        temperature=request.temperature,
        top_p=request.top_p,
        max_new_tokens=max_new_tokens(request, default_max_tokens),
        stop=stop_strings(request),
        json_schema=json_schema,
        eos_token_ids=eos_token_ids,
    )


class SamplingFields(SamplingExtras, Protocol):
    """Every sampling field `extension_sampling` reads from a request, beyond those it is given."""

    @property
    def ignore_eos(self) -> bool | None: ...
    @property
    def regex(self) -> str | None: ...
    @property
    def ebnf(self) -> str | None: ...
    @property
    def skip_special_tokens(self) -> bool | None: ...
    @property
    def spaces_between_special_tokens(self) -> bool | None: ...


def extension_sampling(
    fields: SamplingFields,
    *,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: int | None,
    stop: tuple[str, ...],
    json_schema: str | None,
    eos_token_ids: Collection[int] = (),
) -> SamplingOptions:
    """Engine sampling parameters from SGLang's sampling fields as chat spells them (chat's request,
    or the extensions another surface accepts: `openai.extensions`; None there is chat's default)
    and the surface's own temperature, top_p, budget, stop strings and JSON schema.

    `eos_token_ids` are added to `stop_token_ids` unless `ignore_eos` (see `sampling_options`).
    """
    stop_token_ids = list(fields.stop_token_ids or ())
    if not fields.ignore_eos:
        stop_token_ids.extend(sorted(set(eos_token_ids).difference(stop_token_ids)))
    top_k = fields.top_k
    if top_k == 0:  # OpenAI-style clients mean "off"; SGLang spells that -1
        top_k = -1
    return SamplingOptions(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=fields.min_p,
        frequency_penalty=fields.frequency_penalty,
        presence_penalty=fields.presence_penalty,
        repetition_penalty=fields.repetition_penalty,
        max_new_tokens=max_new_tokens,
        min_new_tokens=fields.min_tokens,
        stop=stop,
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=True if fields.ignore_eos else None,
        seed=fields.seed,
        json_schema=json_schema,
        regex=fields.regex,
        ebnf=fields.ebnf,
        skip_special_tokens=fields.skip_special_tokens is not False,
        spaces_between_special_tokens=fields.spaces_between_special_tokens is not False,
    )


def logprob_options(request: ChatCompletionRequest | CompletionRequest) -> tuple[bool, int]:
    """`(return_logprob, top_logprobs_num)` for the engine: chat's `logprobs`/`top_logprobs`, or the
    legacy completions `logprobs` count (where `logprobs: 0` still asks for the chosen token's)."""
    if isinstance(request, ChatCompletionRequest):
        return request.logprobs, (request.top_logprobs or 0) if request.logprobs else 0
    if request.logprobs is None:
        return False, 0
    return True, request.logprobs
