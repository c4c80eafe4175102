"""`POST /v1/completions`: OpenAI's legacy text completions (prompts as text or token ids, `echo`,
the legacy logprobs shape), planned on the request core."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trio_direct.core import errors
from trio_direct.core.errors import ApiError
from trio_direct.core.output import ChoiceEvent, ChoiceResult, merge_events
from trio_direct.core.plan import (
    OutputOptions,
    Prompt,
    RequestPlan,
    Usage,
    check_vocab,
    plan_request,
    refuse_too_many_choices,
)
from trio_direct.openai import chat_bodies
from trio_direct.openai.logprobs import TokenText, completion_logprobs
from trio_direct.openai.requests import CompletionRequest, decode_completion_request, prompt_batch
from trio_direct.openai.sampling import logprob_options, sampling_options, stop_strings
from trio_direct.surfaces.prompting import in_thread_if_costly, refuse_if_counted_over, refuse_if_too_long

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["CompletionRenderer", "handle", "plan_completion"]


async def handle(exchange: Exchange) -> None:
    request = decode_completion_request(exchange.body)
    pool = exchange.frontend.pool(request.model)
    exchange.label(pool.name, request.stream)
    plan = await plan_completion(pool, request, session_key=exchange.session_key(request.user))
    renderer = CompletionRenderer(plan, pool.token_text, echo=request.echo, logprobs=request.logprobs is not None)
    await exchange.respond(pool, plan, renderer)


async def plan_completion(pool: PoolView, request: CompletionRequest, *, session_key: str | None = None) -> RequestPlan:
    if request.suffix:
        raise errors.invalid_request("'suffix' is not supported.", param="suffix", code="unsupported_parameter")
    batch = prompt_batch(request)
    refuse_too_many_choices(len(batch), request.n)  # before anything is tokenized
    prompts = []
    for item in batch:
        if isinstance(item, str):
            refuse_if_too_long(pool, len(item), param="prompt")
            prompts.append(await in_thread_if_costly(pool, [item], _tokenize, pool, item))
        else:
            check_vocab(pool, item)
            text = pool.tokenizer.decode(item, skip_special_tokens=False) if request.echo else ""
            prompts.append(Prompt(list(item), text))
    return_logprob, top_logprobs = logprob_options(request)
    output = OutputOptions(
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        stop_strings=stop_strings(request),
        include_stop_str=request.include_stop_str_in_output,
    )
    options = request.stream_options
    return plan_request(
        pool,
        prompts,
        sampling_options(request, eos_token_ids=pool.tokenizer.eos_token_ids),
        id_prefix="cmpl-",
        n=request.n,
        output=output,
        return_logprob=return_logprob,
        top_logprobs=top_logprobs,
        prompt_logprobs=request.echo,  # echo with logprobs shows the prompt's logprobs too, as OpenAI's did
        stream=request.stream,
        include_usage=bool(options and options.include_usage),
        prompt_param="prompt",
        session_key=session_key,
    )


def _tokenize(pool: PoolView, text: str) -> Prompt:
    refuse_if_counted_over(pool, text, param="prompt")
    packed = pool.tokenizer.encode_packed(text)  # packed here (a worker thread for a long prompt), not per request
    return Prompt(packed.ids, text, packed=packed)


class CompletionRenderer:
    """`text_completion` events, or one `text_completion` body."""

    __slots__ = ("_plan", "_token_text", "_echo", "_logprobs", "_opening", "_text_offsets")

    def __init__(self, plan: RequestPlan, token_text: TokenText, *, echo: bool = False, logprobs: bool = False) -> None:
        self._plan = plan
        self._token_text = token_text
        self._echo = echo
        self._logprobs = logprobs
        self._opening = b""
        #: Each choice's text offset so far, for the legacy logprobs' `text_offset`.
        self._text_offsets: dict[int, int] = {}

    def _prompt_text(self, index: int) -> str:
        plan = self._plan
        return plan.prompts[index // plan.n].text if self._echo else ""

    def prepare(self) -> None:
        plan = self._plan
        if self._echo:
            self._opening = b"".join(
                chat_bodies.completion_chunk(
                    plan.id, plan.created, plan.model, choice.output.index, self._prompt_text(choice.output.index)
                )
                for choice in plan.choices
            )
        for choice in plan.choices:
            choice.output.prepare()

    def opening(self) -> bytes:
        return self._opening

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        plan = self._plan
        out = []
        for event in merge_events(batch):
            rows = event.logprobs
            if event.finish_reason is None and not event.text and not rows:
                continue
            logprobs = None
            if self._logprobs and self._echo and event.prompt_logprobs:
                rows = [*event.prompt_logprobs, *(rows or ())]  # the prompt's rows lead, as its echoed text did
            if rows:
                offset = self._text_offsets.get(event.index, 0)
                logprobs, self._text_offsets[event.index] = completion_logprobs(rows, self._token_text, offset)
            out.append(
                chat_bodies.completion_chunk(
                    plan.id, plan.created, plan.model, event.index, event.text, event.finish_reason, logprobs=logprobs
                )
            )
        return b"".join(out)

    def closing(self, usage: Usage) -> bytes:
        plan = self._plan
        if plan.include_usage:
            return chat_bodies.usage_chunk(plan.id, plan.created, plan.model, usage, chat=False) + chat_bodies.DONE
        return chat_bodies.DONE

    def failure(self, error: ApiError) -> bytes:
        return chat_bodies.error_chunk(error) + chat_bodies.DONE

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        plan = self._plan
        choices = []
        for result in results:
            prefix = self._prompt_text(result.index)
            logprobs = None
            if self._logprobs:
                if self._echo and result.prompt_logprobs is not None:
                    rows = [*result.prompt_logprobs, *result.logprobs]
                    logprobs = completion_logprobs(rows, self._token_text, 0)[0]
                else:
                    logprobs = completion_logprobs(result.logprobs, self._token_text, len(prefix))[0]
            choices.append(
                chat_bodies.CompletionChoice(
                    index=result.index, text=prefix + result.text, logprobs=logprobs, finish_reason=result.finish_reason
                )
            )
        return chat_bodies.completion(plan.id, plan.created, plan.model, choices, usage)
