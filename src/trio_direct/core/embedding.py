"""Embeddings on the engines: plan one `Embed` call per input, route each, run them in the request's
nursery, and end every call in its vector or an `Abort`.

Neither gRPC API batches inputs in one `Embed`, so a request of N inputs is N unary calls, at most
`MAX_CALLS_IN_FLIGHT` at a time. Each input is routed on its own, so round-robin spreads a batch
over the engines; in kv mode the choice is by load alone (no token ids are given): an embedding has
no decode, and a cached prefix saves it little. A call the engine has not answered when the request
ends (the client left, a sibling failed, shutdown) resets its stream and is aborted by rid, the same
rule as for generation (`core.engine_call`): SGLang's server aborts a cancelled call itself, the
`Abort` also reaches one that was still queued.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import trio

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.core.dispatch import client_error
from trio_direct.core.engine_call import abort_on_engine
from trio_direct.core.errors import ApiError
from trio_direct.core.plan import Prompt, new_request_key
from trio_direct.core.pool import ServingPool
from trio_direct.engine.errors import (
    EngineDeadlineExceeded,
    EngineError,
    EngineStalled,
    EngineUnavailable,
)
from trio_direct.engine.types import EmbedInput, EmbedOutput, EngineClient
from trio_direct.logs import REQUEST_ID
from trio_direct.routing.simple import NoWorkerAvailable

__all__ = ["MAX_CALLS_IN_FLIGHT", "EmbeddingPlan", "embed_on_engine", "plan_embeddings", "run_embeddings"]

log = logging.getLogger(__name__)

#: `Embed` calls one request keeps open at once: a batch of thousands queues here, not on the engine.
MAX_CALLS_IN_FLIGHT = 64

#: Errors after which the engine may still be running the request, so an Abort is still owed.
_ENGINE_MAY_STILL_RUN = (EngineUnavailable, EngineDeadlineExceeded)


@dataclass(slots=True)
class EmbeddingPlan:
    """A planned embeddings request: one engine request per input, in input order."""

    #: 32 hex characters; input i's rid is this plus 4 hex digits (never a prefix of another).
    key: str
    model: str
    inputs: list[EmbedInput]
    session_key: str | None = None


def plan_embeddings(
    pool: ServingPool,
    prompts: Sequence[Prompt],
    *,
    param: str = "input",
    listed: bool = False,
    session_key: str | None = None,
) -> EmbeddingPlan:
    """One `EmbedInput` per prompt; `ApiError` 400 for a generation model, an empty input or one
    longer than the engines accept. `listed`: the inputs came as a list (errors name `input[i]`)."""
    if not pool.is_embedding:
        raise errors.generation_model_cannot_embed(pool.name)
    limit = pool.context_length
    for index, prompt in enumerate(prompts):
        where = f"{param}[{index}]" if listed else param
        if not prompt.token_ids:
            raise errors.invalid_request(f"Invalid value for '{where}': the input is empty.", param=where)
        if limit is not None and len(prompt.token_ids) >= limit:
            raise errors.context_length_exceeded(len(prompt.token_ids), limit, None, param=where)
    key = new_request_key()
    REQUEST_ID.set("embd-" + key)
    inputs = [
        EmbedInput(rid=f"{key}{index:04x}", input_ids=prompt.token_ids, original_text=prompt.text)
        for index, prompt in enumerate(prompts)
    ]
    return EmbeddingPlan(key, pool.name, inputs, session_key)


async def run_embeddings(pool: ServingPool, plan: EmbeddingPlan) -> list[EmbedOutput]:
    """Every input's vector, in input order; the first failure ends the others (each aborted) and
    is raised as `ApiError` (engine failures mapped as for generation: `client_error`)."""
    results: list[EmbedOutput | None] = [None] * len(plan.inputs)
    failure: list[ApiError] = []
    limiter = trio.CapacityLimiter(MAX_CALLS_IN_FLIGHT)

    async def embed_one(index: int, request: EmbedInput, cancel: trio.CancelScope) -> None:
        try:
            async with limiter:
                results[index] = await _routed_embed(pool, plan, request)
        except ApiError as error:  # the first failure ends the request; siblings are cancelled
            if not failure:
                failure.append(error)
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for index, request in enumerate(plan.inputs):
            nursery.start_soon(embed_one, index, request, nursery.cancel_scope)
    if failure:
        raise failure[0]
    outputs = [output for output in results if output is not None]
    assert len(outputs) == len(results), "every input has its vector when nothing failed"
    return outputs


async def _routed_embed(pool: ServingPool, plan: EmbeddingPlan, request: EmbedInput) -> EmbedOutput:
    """One input on the engine routing picks; an unreachable engine is taken out of routing and the
    input retried on another (`--max-retries`). A hung engine is found by the frontend's stream
    watch as for generation (`_WatchedEmbed`): the call is aborted, the engine marked down and the
    input retried."""
    retries = pool.config.max_retries
    while True:
        try:
            route = pool.choose_route((), request.rid, plan.session_key)
        except NoWorkerAvailable:
            raise errors.service_unavailable("No engine is available to serve the request.") from None
        try:
            if route.prefill is not None:
                raise errors.invalid_request(
                    "The model is served by prefill/decode engines, which serve no embeddings.",
                    param="model",
                    code="model_not_supported",
                )
            worker = route.decode
            client = worker.engine.client
            request.routed_dp_rank = worker.dp_rank
            metrics.ROUTED.labels(worker.engine.id, worker.engine.card.role).inc()
            try:
                return await _watched_embed(pool, client, request)
            except (EngineUnavailable, EngineStalled) as error:
                pool.engine_unreachable(client, error)
                if retries <= 0:
                    raise client_error(error) from None
                retries -= 1
                metrics.RETRIES.inc()
                log.info("embedding %s: %s; retrying on another engine", request.rid, error)
            except EngineError as error:
                raise client_error(error) from None
        finally:
            pool.release(request.rid)


class _WatchedEmbed:
    """An `Embed` call as the stream watch (`core.watch.StreamWatch`) sees an engine call: an `Embed`
    is one forward pass with nothing to watch in between, so it is failed as hung when its engine has
    answered nothing, on it or any other call, for `--stream-idle-timeout` (busy is not hung)."""

    __slots__ = ("client", "error", "opened_at", "scope")

    #: What the watch reads of a call's request: no prefill/decode rendezvous to wait for, and
    #: watched from its start as a stream is (one forward pass is short, unlike a whole generation).
    request = SimpleNamespace(bootstrap=None, stream=True)
    first_chunk_at = None

    def __init__(self, client: EngineClient, scope: trio.CancelScope) -> None:
        self.client = client
        self.scope = scope
        self.opened_at = trio.current_time()
        self.error: EngineStalled | None = None

    def stall(self, error: EngineStalled) -> bool:
        self.error = error
        self.scope.cancel()
        return True


async def _watched_embed(pool: ServingPool, client: EngineClient, request: EmbedInput) -> EmbedOutput:
    """`embed_on_engine` under the stream watch; `EngineStalled` when the watch found the engine hung."""
    watch = pool.watch
    with trio.CancelScope() as scope:
        call = _WatchedEmbed(client, scope)
        if watch is not None:
            watch.call_opened(call)
        try:
            output = await embed_on_engine(client, request, abort_timeout=pool.config.abort_timeout)
        finally:
            if watch is not None:
                watch.call_closed(call)
        client.last_output_at = trio.current_time()  # an answer: the engine is not hung
        return output
    assert call.error is not None, "only the watch cancels the call's scope"
    raise call.error


async def embed_on_engine(client: EngineClient, request: EmbedInput, *, abort_timeout: float) -> EmbedOutput:
    """`client.embed(request)`; leaving before the engine answered (cancelled, or an error after
    which it may still run the request) sends `Abort(rid)`, shielded and bounded."""
    ended = False
    try:
        output = await client.embed(request)
        ended = True
        return output
    except EngineError as error:
        ended = not isinstance(error, _ENGINE_MAY_STILL_RUN)
        raise
    finally:
        if not ended:
            await abort_on_engine(client, request.rid, abort_timeout)
