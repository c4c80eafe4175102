"""Planning: prompts and sampling in, a `RequestPlan` out (one engine request and output pipeline per choice).

A surface (chat, completions, ...) decodes its own request, renders and tokenizes its prompts and
maps its sampling fields; `plan_request` does what every surface shares: the `n` and context-length
checks, the request ids, one `GenerateInput` and one `ChoiceOutput` per choice. Nothing here routes
or runs anything: the engine of each choice is chosen at dispatch, so routing load is only ever
counted for a request that will release it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from trio_direct.core import errors
from trio_direct.core.output import ChoiceOutput, ReasoningSplitter
from trio_direct.core.pool import ServingPool
from trio_direct.core.request_context import CURRENT, engine_rid, new_request_key
from trio_direct.engine.packed_ids import PackedIds
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.logs import REQUEST_ID
from trio_direct.parsers.selection import skip_special_tokens
from trio_direct.parsers.tools import ToolParser
from trio_direct.text.detokenizer import IncrementalDetokenizer
from trio_direct.text.stop_strings import StopStringMatcher

__all__ = [
    "MAX_CHOICES",
    "ChoicePlan",
    "OutputOptions",
    "Prompt",
    "RequestPlan",
    "Usage",
    "check_vocab",
    "new_request_key",
    "plan_request",
    "refuse_too_many_choices",
]


@dataclass(slots=True)
class Prompt:
    """One prompt as the engine gets it, and as `echo` returns it; `image_data` are its images
    (URLs or data URLs), one per image placeholder the text holds."""

    #: A list, or (a chat prompt's, from the prompt prefix cache) an array of unsigned 32-bit ints:
    #: 4 bytes an id, where a list of Python ints takes ~40 (`text.prefix_cache`).
    token_ids: Sequence[int]
    text: str
    #: Tokens that end the turn for this prompt's format, beyond the tokenizer's EOS (harmony's
    #: `<|return|>` and `<|call|>`).
    stop_token_ids: tuple[int, ...] = ()
    image_data: list[str] = field(default_factory=list)
    #: `token_ids` packed for the wire where they were tokenized (chat prompts); None: packed per request.
    packed: PackedIds | None = None


@dataclass(slots=True)
class Usage:
    """Token counts of one request (all choices). `cached_tokens` must come from the prefill leg."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class ChoicePlan:
    """One choice: the engine request that generates it, and its output pipeline."""

    request: GenerateInput
    output: ChoiceOutput
    prompt_index: int = 0


@dataclass(slots=True)
class RequestPlan:
    """A planned request: what dispatch runs and a renderer writes."""

    id: str
    #: 32 hex characters; each choice's rid is `tag` + this + 4 hex digits (never a prefix of another:
    #: see `core.request_context`).
    key: str
    #: When the request was created (Unix seconds): every chunk and body of it carries this.
    created: int
    model: str
    prompts: list[Prompt]
    choices: list[ChoicePlan]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    #: Routing affinity: requests with the same key prefer the same engine (`X-Session-ID`).
    session_key: str | None = None
    #: The rid prefix derived from the client's `X-Request-Id` ("" without one).
    tag: str = ""
    #: The request's `priority` (SGLang's extension field; higher is served first), if given.
    priority: int | None = None
    #: The request's `tracing.RequestTrace`, when tracing is on.
    trace: Any = None

    def usage(self) -> Usage:
        outputs = [choice.output for choice in self.choices]
        return Usage(
            # the engine's count where it gave one: it includes what images expand to
            prompt_tokens=sum(
                max(len(p.token_ids), o.prompt_tokens) for p, o in zip(self.prompts, outputs[:: self.n], strict=True)
            ),
            completion_tokens=sum(o.completion_tokens for o in outputs),
            # the choices of one prompt share its cache hit: count it once per prompt
            cached_tokens=sum(o.usage_cached_tokens for o in outputs[:: self.n]),
            reasoning_tokens=sum(o.reasoning_tokens for o in outputs),
        )


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How each choice's text is made: detokenizer settings, stop strings, parsers."""

    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    stop_strings: tuple[str, ...] = ()
    include_stop_str: bool = False
    #: A fresh reasoning parser for a choice of this prompt, or None.
    reasoning_parser: Callable[[Prompt], ReasoningSplitter | None] | None = None
    #: A fresh tool-call parser for a choice, or None. A parser that reads the model's own markup
    #: (often special tokens: `<|python_tag|>`, DeepSeek's) makes the detokenizer keep them, as
    #: SGLang does.
    tool_parser: Callable[[], ToolParser | None] | None = None


#: Engine requests one client request may start (prompts × n): each is an engine call, a task and
#: its share of the engine's queue, so a body of a million one-word prompts is refused, not run.
#: OpenAI's own batch limit for embeddings inputs is the same number.
MAX_CHOICES = 2048


def refuse_too_many_choices(prompts: int, n: int = 1, *, param: str = "prompt") -> None:
    """`ApiError` 400 when `prompts` × `n` is over `MAX_CHOICES`; cheap, so surfaces call it with
    the prompt count before they tokenize anything."""
    if prompts * n > MAX_CHOICES:
        asked = f"{prompts} prompts" + (f" × n={n}" if n > 1 else "")
        raise errors.invalid_request(
            f"Invalid value for '{param}': one request may ask for at most {MAX_CHOICES} completions "
            f"(prompts × n); this one asks for {asked}.",
            param=param,
        )


def plan_request(
    pool: ServingPool,
    prompts: list[Prompt],
    sampling: SamplingOptions,
    *,
    id_prefix: str,
    n: int = 1,
    output: OutputOptions = OutputOptions(),
    return_logprob: bool = False,
    top_logprobs: int = 0,
    prompt_logprobs: bool = False,
    stream: bool = False,
    include_usage: bool = False,
    prompt_param: str = "prompt",
    session_key: str | None = None,
    created: int | None = None,
) -> RequestPlan:
    """One `ChoicePlan` per prompt and sample; raises `ApiError` for what no engine could serve."""
    if pool.is_embedding:
        raise errors.embedding_model_cannot_generate(pool.name)
    if n > pool.config.max_n:
        raise errors.invalid_request(f"n must be at most {pool.config.max_n}.", param="n")
    refuse_too_many_choices(len(prompts), n, param=prompt_param)
    limit = pool.context_length
    for prompt in prompts:
        if not prompt.token_ids:
            raise errors.invalid_request("The prompt is empty after tokenization.", param=prompt_param)
        if limit is not None and len(prompt.token_ids) >= limit:
            raise errors.context_length_exceeded(
                len(prompt.token_ids), limit, sampling.max_new_tokens, param=prompt_param
            )
    context = CURRENT.get()
    if context is None:  # planned outside the HTTP layer (tests, benchmarks)
        key, tag, trace = new_request_key(), "", None
        REQUEST_ID.set(id_prefix + key)
    else:
        key, tag, trace = context.key, context.tag, context.trace
    # A non-streamed answer whose tokens nothing reads as they come (no stop string to match, no
    # logprob rows to slice) is asked of the engine whole: one message instead of one per token or
    # batch, each a gRPC message, a protobuf parse and a pass of the output pipeline. Such a call is
    # quiet until its end, so only a health probe can tell its engine hung (`core.watch`): without
    # health checks the engine streams. A disaggregated pair's decode leg streams all the same
    # (`dispatch._pair_with_prefill`).
    engine_stream = stream or bool(output.stop_strings) or return_logprob or pool.config.health_interval <= 0
    choices = []
    for prompt_index, prompt in enumerate(prompts):
        options = sampling
        room = limit - len(prompt.token_ids) if limit is not None else None
        if options.max_new_tokens is None:
            # OpenAI's semantics: no limit from the client generates until EOS or the context is
            # full, unless the operator set `--default-max-tokens`. Left unset, the native API would
            # apply SGLang's own default of 128 tokens.
            budget = completion_budget(pool.config.default_max_tokens, room)
            if budget is not None:
                options = replace(options, max_new_tokens=budget)
        elif room is not None and options.max_new_tokens > room:
            options = replace(options, max_new_tokens=room)  # SGLang clips too; say so rather than fail
        if prompt.stop_token_ids and not options.ignore_eos:
            extra = [t for t in prompt.stop_token_ids if t not in options.stop_token_ids]
            options = replace(options, stop_token_ids=(*options.stop_token_ids, *extra))
        for sample in range(n):
            index = prompt_index * n + sample
            request = GenerateInput(
                rid=engine_rid(tag, key, index),  # fixed length: never a prefix of another rid
                input_ids=prompt.token_ids,
                sampling=options,
                stream=engine_stream,
                return_logprob=return_logprob,
                top_logprobs_num=top_logprobs,
                logprob_start_len=0 if return_logprob and prompt_logprobs else -1,
                original_text=prompt.text,
                image_data=prompt.image_data,
                packed_input_ids=prompt.packed,
            )
            reasoning = output.reasoning_parser(prompt) if output.reasoning_parser is not None else None
            tools = output.tool_parser() if output.tool_parser is not None else None
            decoder = IncrementalDetokenizer(
                pool.tokenizer,
                skip_special_tokens=skip_special_tokens(output.skip_special_tokens, (tools, reasoning)),
                spaces_between_special_tokens=output.spaces_between_special_tokens,
                prompt_ids=prompt.token_ids,
            )
            stops = StopStringMatcher(output.stop_strings, output.include_stop_str) if output.stop_strings else None
            output_state = ChoiceOutput(
                index, decoder, stops, reasoning, tools, stop_token_ids=frozenset(options.stop_token_ids)
            )
            choices.append(ChoicePlan(request, output_state, prompt_index))
    return RequestPlan(
        id=id_prefix + key,
        key=key,
        created=int(time.time()) if created is None else created,
        model=pool.name,
        prompts=prompts,
        choices=choices,
        n=n,
        stream=stream,
        include_usage=include_usage,
        session_key=session_key,
        tag=tag,
        trace=trace,
    )


def completion_budget(default_max_tokens: int | None, room: int | None) -> int | None:
    """The completion limit of a request that set none: `--default-max-tokens` if the operator gave
    one, within the room the context leaves (`room`, None when the context length is unknown)."""
    if default_max_tokens is not None and default_max_tokens > 0:
        return default_max_tokens if room is None else min(default_max_tokens, room)
    return room


def check_vocab(pool: ServingPool, token_ids: Sequence[int], param: str = "prompt") -> None:
    """A token-id prompt must stay inside the model's vocabulary."""
    vocab = pool.tokenizer.vocab_size
    bad = next((t for t in token_ids if t >= vocab), None)
    if bad is not None:
        raise errors.invalid_request(f"Token id {bad} is out of vocabulary (size {vocab}).", param=param)
