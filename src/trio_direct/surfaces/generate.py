"""`POST /generate`: SGLang's native HTTP generate, for clients of SGLang's own server.

Planned on the request core like every other surface (routing, prefill/decode pairs, cancellation
into `Abort`s, stop strings, metrics). The answer is SGLang's: `{"text", "output_ids",
"meta_info"}` (a list of them for a batch or `n` > 1), `meta_info` holding `id` (the client's
`rid`, else the engine request's id), `finish_reason` in SGLang's shape, the token counts,
`e2e_latency` once finished and, with `return_logprob`, `output_token_logprobs` (and
`output_top_logprobs`) as `[logprob, token_id, text or null]` rows. A stream sends `data: {...}`
events whose `text` and `output_ids` are cumulative, as SGLang's server does by default, with an
`index` for a batch, then `data: [DONE]`. The client's `rid` never reaches an engine: a client id
could be a prefix of another request's, and SGLang aborts by prefix.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

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
from trio_direct.engine.types import SamplingOptions, TokenLogprob
from trio_direct.openai import chat_bodies
from trio_direct.openai.logprobs import TokenText
from trio_direct.surfaces.generate_request import (
    GenerateRequest,
    decode_generate_request,
    generate_prompts,
    image_list,
    is_batch,
    stop_strings,
)
from trio_direct.surfaces.images import check_image_url, image_data_for
from trio_direct.surfaces.prompting import in_thread_if_costly, refuse_if_counted_over, refuse_if_too_long

if TYPE_CHECKING:
    from trio_direct.core.frontend import Frontend
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["GenerateRenderer", "handle", "plan_generate"]

_encoder = msgspec.json.Encoder()


async def handle(exchange: Exchange) -> None:
    request = decode_generate_request(exchange.body)
    pool = _pool_for(exchange.frontend, request.model)
    exchange.label(pool.name, request.stream)
    plan = await plan_generate(pool, request, session_key=exchange.session_key())
    renderer = GenerateRenderer(plan, request, pool.token_text, started=exchange.started)
    await exchange.respond(pool, plan, renderer)


def _pool_for(frontend: Frontend, model: str | None) -> PoolView:
    """SGLang's server serves one model, so `model` may be left out when this frontend does too."""
    if model is not None:
        return frontend.pool(model)
    pools = frontend.pools()
    if len(pools) != 1:
        raise errors.invalid_request("This server serves several models: give 'model'.", param="model")
    return frontend.pool(pools[0].name)  # through `pool`: the tenant's models apply


async def plan_generate(pool: PoolView, request: GenerateRequest, *, session_key: str | None = None) -> RequestPlan:
    param = "text" if request.text is not None else "input_ids"
    prompts = []
    items = generate_prompts(request)
    refuse_too_many_choices(len(items), request.sampling_params.n, param=param)  # before anything is tokenized
    for index, item in enumerate(items):
        where = f"{param}[{index}]" if is_batch(request) else param
        if isinstance(item, str):
            refuse_if_too_long(pool, len(item), param=where)
            prompts.append(await in_thread_if_costly(pool, [item], _tokenize, pool, item, where))
        else:
            check_vocab(pool, item, param=where)
            prompts.append(Prompt(list(item), ""))
    images = image_list(request)
    if images:
        params = [
            "image_data" if isinstance(request.image_data, str) else f"image_data[{i}]" for i in range(len(images))
        ]
        for url, where in zip(images, params, strict=True):
            check_image_url(url, where)
        prompts[0].image_data = await image_data_for(pool, images, params)
    sp = request.sampling_params
    stop_token_ids = list(sp.stop_token_ids or ())
    if not sp.ignore_eos:  # as for chat: an engine without its tokenizer knows fewer EOS ids
        stop_token_ids.extend(sorted(set(pool.tokenizer.eos_token_ids).difference(stop_token_ids)))
    stops = stop_strings(sp)
    sampling = SamplingOptions(
        temperature=sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k,
        min_p=sp.min_p,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        repetition_penalty=sp.repetition_penalty,
        max_new_tokens=sp.max_new_tokens,
        min_new_tokens=sp.min_new_tokens or None,
        stop=stops,
        stop_token_ids=tuple(stop_token_ids),
        ignore_eos=True if sp.ignore_eos else None,
        seed=sp.sampling_seed,
        json_schema=sp.json_schema,
        regex=sp.regex,
        ebnf=sp.ebnf,
        structural_tag=sp.structural_tag,
        skip_special_tokens=sp.skip_special_tokens,
        spaces_between_special_tokens=sp.spaces_between_special_tokens,
    )
    output = OutputOptions(
        skip_special_tokens=sp.skip_special_tokens,
        spaces_between_special_tokens=sp.spaces_between_special_tokens,
        stop_strings=stops,
        include_stop_str=sp.no_stop_trim,
    )
    return plan_request(
        pool,
        prompts,
        sampling,
        id_prefix="",
        n=sp.n,
        output=output,
        return_logprob=request.return_logprob,
        top_logprobs=request.top_logprobs_num,
        stream=request.stream,
        prompt_param=param,
        session_key=session_key,
    )


def _tokenize(pool: PoolView, text: str, param: str) -> Prompt:
    refuse_if_counted_over(pool, text, param=param)
    packed = pool.tokenizer.encode_packed(text)  # packed here (a worker thread for a long prompt), not per request
    return Prompt(packed.ids, text, packed=packed)


def finish_reason_json(reason: str | None, matched: int | str | None, completion_tokens: int) -> dict[str, Any] | None:
    """SGLang's `finish_reason`: `{"type": "stop", "matched": id or text}`, `{"type": "length",
    "length": n}`, or null while running."""
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": completion_tokens}
    if reason == "abort":
        return {"type": "abort", "message": None}
    return {"type": "stop", "matched": matched}


class GenerateRenderer:
    """SGLang's `/generate` answers: cumulative `data:` events, or one body (a list for a batch)."""

    __slots__ = ("_ids", "_list", "_plan", "_request", "_rows", "_started", "_texts", "_token_text")

    def __init__(self, plan: RequestPlan, request: GenerateRequest, token_text: TokenText, *, started: float) -> None:
        self._plan = plan
        self._request = request
        self._token_text = token_text
        #: The request's arrival (`time.perf_counter()`), for `e2e_latency`.
        self._started = started
        #: A batch or several samples: a list of answers, and an `index` on each streamed one.
        self._list = is_batch(request) or plan.n > 1
        self._texts: dict[int, str] = {}
        self._ids: dict[int, list[int]] = {}
        self._rows: dict[int, list[TokenLogprob]] = {}

    def client_id(self, index: int) -> str:
        """`meta_info.id`: the client's `rid` (`rid_<sample>` with `n` > 1), else the engine request's."""
        plan, rid = self._plan, self._request.rid
        if rid is None:
            return plan.choices[index].request.rid
        base = rid[index // plan.n] if isinstance(rid, list) else rid
        return base if plan.n == 1 else f"{base}_{index % plan.n}"

    def prepare(self) -> None:
        for choice in self._plan.choices:
            choice.output.prepare()

    def opening(self) -> bytes:
        return b""

    def events(self, batch: list[ChoiceEvent]) -> bytes:
        out = []
        for event in merge_events(batch):
            index = event.index
            self._texts[index] = self._texts.get(index, "") + event.text
            self._ids.setdefault(index, []).extend(event.token_ids)
            if event.logprobs:
                self._rows.setdefault(index, []).extend(event.logprobs)
            if not event.text and not event.token_ids and event.finish_reason is None:
                continue
            answer = self._answer(
                index, self._texts[index], self._ids[index], self._rows.get(index, ()),
                event.finish_reason, event.matched_stop,
            )  # fmt: skip
            if self._list:
                answer["index"] = index
            out.append(b"data: " + _encoder.encode(answer) + b"\n\n")
        return b"".join(out)

    def closing(self, usage: Usage) -> bytes:
        return chat_bodies.DONE

    def failure(self, error: ApiError) -> bytes:
        return chat_bodies.error_chunk(error) + chat_bodies.DONE

    def unary(self, results: list[ChoiceResult], usage: Usage) -> bytes:
        answers = [
            self._answer(r.index, r.text, r.token_ids, r.logprobs, r.finish_reason, r.matched_stop) for r in results
        ]
        return _encoder.encode(answers if self._list else answers[0])

    def _answer(
        self,
        index: int,
        text: str,
        ids: list[int],
        rows: Sequence[TokenLogprob],
        finish: str | None,
        matched: int | str | None,
    ) -> dict[str, Any]:
        choice = self._plan.choices[index]
        output = choice.output
        prompt = self._plan.prompts[choice.prompt_index]
        meta: dict[str, Any] = {
            "id": self.client_id(index),
            "finish_reason": finish_reason_json(finish, matched, output.completion_tokens),
            "prompt_tokens": max(len(prompt.token_ids), output.prompt_tokens),
            "completion_tokens": output.completion_tokens,
            "cached_tokens": output.usage_cached_tokens,
        }
        if finish is not None:
            meta["e2e_latency"] = time.perf_counter() - self._started
        request = self._request
        if request.return_logprob:
            text_of = self._token_text if request.return_text_in_logprobs else None
            meta["output_token_logprobs"] = [
                [row.logprob, row.token_id, text_of(row.token_id) if text_of else None] for row in rows
            ]
            if request.top_logprobs_num > 0:
                meta["output_top_logprobs"] = [
                    [[logprob, token, text_of(token) if text_of else None] for token, logprob in row.top]
                    for row in rows
                ]
        return {"text": text, "output_ids": list(ids), "meta_info": meta}
