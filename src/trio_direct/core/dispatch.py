"""Dispatch: route a planned request, run its engine calls in the request's nursery, hand back events.

`dispatch(pool, plan)` is the request's whole life on the engines, in one ``async with``:

1. Route (`ModelPool.choose_route`): an aggregated engine, or a prefill + decode pair, chosen now so
   that routing load is only counted for a request that will release it (the ``finally`` here).
2. Assign each choice its engine; a disaggregated choice gets its prefill twin (same rid, same
   bootstrap triple: the prefill engine's bootstrap host and port, a fresh random room).
3. Start every engine call (`run_choices`) and wait until each request is on the wire.
4. Yield the event batches; the caller renders them.

Leaving the block (all done, client gone, shutdown, a failure) cancels the request's nursery; each
engine call then ends through `open_engine_call`, whose ``finally`` sends its `Abort` when the engine
had not ended the request. An engine that cannot be reached before a choice's first output is taken
out of routing and the choice retried on another aggregated engine (`Dispatcher.reroute`); a
disaggregated choice then gets a fresh prefill + decode pair instead (its old pair's rendezvous is
gone), counted against ``--migration-limit`` like a migration. An engine that fails
after a choice's first output hands the choice to another engine (`Dispatcher.migrate`, at most
``--migration-limit`` times; `core.migration`): an aggregated one, or a fresh prefill + decode pair.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Protocol

import trio

from trio_direct import metrics
from trio_direct.core import errors
from trio_direct.core.choices import (
    BUDGET_SPENT,
    ChoiceFailed,
    ChoiceReader,
    ChoiceRun,
    Continuation,
    EngineLeg,
    stream_choice,
)  # fmt: skip
from trio_direct.core.deferred import DeferredError
from trio_direct.core.disaggregation import new_room, remote_decode_leg, run_disaggregated_choice
from trio_direct.core.errors import ApiError
from trio_direct.core.exception_groups import unwrap_single_exception
from trio_direct.core.migration import continuation_request, migration_refusal
from trio_direct.core.output import ChoiceEvent
from trio_direct.core.plan import RequestPlan
from trio_direct.core.pool import ServingPool
from trio_direct.core.request_context import CURRENT, engine_rid, new_request_key
from trio_direct.engine.errors import (
    EngineError,
    EngineInvalidArgument,
    EngineResourceExhausted,
    EngineUnavailable,
    StreamWakeup,
)  # fmt: skip
from trio_direct.engine.types import Bootstrap, EngineClient, GenerateInput
from trio_direct.fleet.card import DEFAULT_BOOTSTRAP_PORT
from trio_direct.fleet.engine_apis import engine_api
from trio_direct.fleet.fleet import Worker
from trio_direct.routing.policy import Route
from trio_direct.routing.simple import NoWorkerAvailable

__all__ = ["EventBatches", "abort_error", "client_error", "dispatch"]

log = logging.getLogger(__name__)


class EventBatches(Protocol):
    """The choices' events, a batch at a time: everything that queued up while the reader was busy."""

    def __aiter__(self) -> EventBatches: ...

    async def __anext__(self) -> list[ChoiceEvent]:
        """The next batch; raises a choice's `EngineError` after every event that came before it,
        and `StreamWakeup` when woken with nothing new (after which it reads on)."""

    def wake(self) -> bool:
        """Interrupt a wait for the next batch with `StreamWakeup` (False: nothing to wake)."""


def client_error(error: EngineError) -> ApiError:
    """What a client hears of an engine failure: a status and a message without engine internals."""
    log.warning("engine request failed: %s", error)
    if isinstance(error, EngineInvalidArgument):
        return errors.invalid_request(f"The engine rejected the request: {error.message}")
    if isinstance(error, EngineResourceExhausted):
        return errors.rate_limited("The engine is at capacity; retry later.")
    if isinstance(error, EngineUnavailable):
        return errors.service_unavailable("The engine serving the request is unavailable.")
    return errors.engine_failure("The engine failed to complete the request.")


def abort_error(event: ChoiceEvent) -> ApiError:
    """A choice the engine ended with finish reason "abort"."""
    log.warning("engine aborted choice %d: %s", event.index, event.abort_message)
    return errors.engine_failure(f"The engine aborted the request: {event.abort_message or 'no reason given'}")


class Dispatcher:
    """One request's routing as its choices run: the `RunControl` every choice reader asks."""

    __slots__ = ("_pool", "_plan", "_first_output_seen", "_route_keys", "watch", "trace")

    def __init__(self, pool: ServingPool, plan: RequestPlan) -> None:
        self._pool = pool
        self._plan = plan
        self._first_output_seen = False
        #: Routing ids of continuations (each counts as load until the request ends).
        self._route_keys: list[str] = []
        self.watch = getattr(pool, "watch", None)
        self.trace = plan.trace

    def first_output(self, run: ChoiceRun) -> None:
        if run.route_key is not None:
            self._pool.first_token(run.route_key)
        elif not self._first_output_seen:
            self._first_output_seen = True
            self._pool.first_token(self._plan.key)

    def unreachable(self, client: EngineClient, error: EngineError) -> None:
        self._pool.engine_unreachable(client, error)

    def release(self) -> None:
        """The request ended: its load (and its continuations') leaves its engines."""
        pool = self._pool
        pool.release(self._plan.key)
        for key in self._route_keys:
            pool.release(key)

    def reroute(self, run: ChoiceRun) -> bool:
        """Another aggregated engine for `run` (the failed one is already out of routing)."""
        plan, pool = self._plan, self._pool
        pool.release(plan.key)
        try:
            route = pool.choose_route(plan.prompts[run.plan.prompt_index].token_ids, plan.key, plan.session_key)
        except NoWorkerAvailable:
            return False
        if route.prefill is not None or route.decode.engine.client is run.client:
            return False
        log.info("request %s: engine unreachable, retrying on %s", plan.key, route.decode.engine.id)
        run.client = route.decode.engine.client
        run.plan.request.routed_dp_rank = route.decode.dp_rank
        return True

    def migrate(
        self, run: ChoiceRun, error: EngineError, failed: EngineClient, *, can_pair: bool = True
    ) -> Continuation | None:
        """Point `run` at another engine to continue after `failed` broke it mid-stream (see
        `core.migration`); the failed call has already ended. None when it cannot continue.
        `can_pair`: whether the choice's reader can start a prefill leg (else aggregated engines only)."""
        plan = self._plan
        output = run.plan.output
        refusal = migration_refusal(run.plan.request, error)
        if refusal is not None:
            log.warning("choice %d failed after %d tokens (%s); not migrated: %s",
                        output.index, len(output.generated), error, refusal)  # fmt: skip
            metrics.MIGRATIONS.labels("refused").inc()
            return None
        prompt = plan.prompts[run.plan.prompt_index].token_ids
        key = new_request_key()
        request = continuation_request(
            run.plan.request, prompt, output.continue_elsewhere(), engine_rid(plan.tag, key, output.index)
        )
        if request is None:
            log.info("choice %d: engine failed after its last token (%s); ending it", output.index, error)
            metrics.MIGRATIONS.labels("migrated").inc()
            return BUDGET_SPENT
        route = self._route_elsewhere(request, key, failed)
        if route is not None and route.prefill is not None and not can_pair:
            self._pool.release(key)
            self._route_keys.remove(key)
            route = None
        if route is None:
            log.warning("choice %d failed after %d tokens (%s); no other engine to continue on",
                        output.index, len(output.generated), error)  # fmt: skip
            metrics.MIGRATIONS.labels("refused").inc()
            return None
        request.routed_dp_rank = route.decode.dp_rank
        prefill = None
        if route.prefill is not None and engine_api(route.prefill.engine.client.api).handoff == "bootstrap":
            prefill = _pair_with_prefill(request, route)
        # On vLLM's API a continuation runs whole on its decode engine: a KV consumer given no
        # transfer parameters computes the prompt itself, rather than wait out a fresh prefill.
        run.plan.request, run.client, run.prefill, run.route_key = request, route.decode.engine.client, prefill, key
        metrics.ROUTED.labels(route.decode.engine.id, route.decode.engine.card.role).inc()
        metrics.MIGRATIONS.labels("migrated").inc()
        where = (
            route.decode.engine.id if route.prefill is None else f"{route.prefill.engine.id} + {route.decode.engine.id}"
        )
        log.warning(
            "choice %d: engine %s failed after %d tokens (%s); continuing on %s as %s",
            output.index, failed.name, len(output.generated), error, where, request.rid,
        )  # fmt: skip
        if self.trace is not None:
            self.trace.event("migration", engine=failed.name, tokens=len(output.generated), to=where)
        return Continuation(prefill)

    def _route_elsewhere(self, request: GenerateInput, key: str, failed: EngineClient) -> Route[Worker] | None:
        """A route for the continuation that avoids `failed` (marked down when unreachable; an engine
        that failed otherwise, or whose health checks are off, is skipped by asking again)."""
        plan, pool = self._plan, self._pool
        for _ in range(2):
            try:
                route = pool.choose_route(request.input_ids, key, plan.session_key)
            except NoWorkerAvailable:
                return None
            if route.decode.engine.client is not failed:
                self._route_keys.append(key)
                return route
            pool.release(key)
        return None


def assign(pool: ServingPool, plan: RequestPlan, route: Route[Worker]) -> list[ChoiceRun]:
    """Point every choice at the route's engines (and pair it with its prefill leg)."""
    worker = route.decode
    metrics.ROUTED.labels(worker.engine.id, worker.engine.card.role).inc()
    context = CURRENT.get()
    if context is not None:
        pair = route.prefill.engine.id + " + " if route.prefill is not None else ""
        context.engine = pair + worker.engine.id
    if route.prefill is not None:
        metrics.ROUTED.labels(route.prefill.engine.id, "prefill").inc()
    runs = []
    migrations = pool.config.migration_limit
    for choice in plan.choices:
        choice.request.routed_dp_rank = worker.dp_rank
        if route.prefill is None:
            runs.append(ChoiceRun(choice, worker.engine.client, retries=pool.config.max_retries, migrations=migrations))
        else:
            leg = _pair_with_prefill(choice.request, route)
            runs.append(ChoiceRun(choice, worker.engine.client, leg, migrations=migrations))
    if route.prefill is None:
        log.debug("request %s: %d choice(s) on %s rank %s", plan.key, len(runs), worker.engine.id, worker.dp_rank)
    else:
        log.info(
            "request %s: %d choice(s), prefill on %s rank %s, decode on %s rank %s",
            plan.key, len(runs), route.prefill.engine.id, route.prefill.dp_rank, worker.engine.id, worker.dp_rank,
        )  # fmt: skip
    return runs


def _pair_with_prefill(decode_request: GenerateInput, route: Route[Worker]) -> EngineLeg:
    """Give the decode request and its prefill twin the same rid and bootstrap triple; on vLLM's API,
    a prefill twin that asks the KV connector for a remote decode (`remote_decode_leg`)."""
    prefill_worker = route.prefill
    assert prefill_worker is not None
    # The decode leg streams even for a non-streamed answer: a cancelled request's Abort waits for
    # its first token (the KV transfer's end), and only a stream says when that came.
    decode_request.stream = True
    if engine_api(prefill_worker.engine.client.api).handoff == "connector":
        return EngineLeg(prefill_worker.engine.client, remote_decode_leg(decode_request, prefill_worker.dp_rank))
    card = prefill_worker.engine.card
    room = new_room(prefill_worker.engine.client, route.decode.engine.client)
    port = card.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    decode_request.bootstrap = Bootstrap(card.bootstrap_host or card.host, port, room)
    prefill_request = replace(decode_request, routed_dp_rank=prefill_worker.dp_rank)
    return EngineLeg(prefill_worker.engine.client, prefill_request)


@asynccontextmanager
async def dispatch(pool: ServingPool, plan: RequestPlan) -> AsyncIterator[EventBatches]:
    """Route `plan` and start its engine calls; yields once every request is on the wire.

    Raises `ApiError` 503 when no engine can serve it. Engine failures surface from the batches
    as `EngineError` (see `client_error`), after every event that came before them.
    """
    try:
        route = pool.choose_route(plan.prompts[0].token_ids, plan.key, plan.session_key)
    except NoWorkerAvailable:
        raise errors.service_unavailable("No engine is available to serve the request.") from None
    control = Dispatcher(pool, plan)
    try:
        runs = assign(pool, plan, route)
        async with run_choices(
            runs,
            control,
            abort_timeout=pool.config.abort_timeout,
            decode_abort_deadline=pool.config.decode_abort_deadline,
        ) as batches:
            yield batches
    finally:
        control.release()


@asynccontextmanager
async def run_choices(
    runs: list[ChoiceRun], control: Dispatcher, *, abort_timeout: float, decode_abort_deadline: float = 30.0
) -> AsyncIterator[EventBatches]:
    """Start every choice's engine call(s) at once; yields their event batches once every request
    is on the wire (or could not be sent: the failure then comes from the batches).

    The nursery here is the request's: leaving the block (client gone, error, all done) cancels
    whatever still runs, and each engine call's own ``finally`` sends its Abort. A request with a
    single aggregated choice needs no nursery: its engine call is read in the caller's task.
    """
    if len(runs) == 1 and runs[0].prefill is None:
        async with ChoiceReader(runs[0], control, abort_timeout) as reader:
            await reader.wait_written()
            yield _OneChoiceEvents(reader)
        return
    send, receive = trio.open_memory_channel(math.inf)
    all_written = trio.Event()
    waiting = len(runs)
    readers: list[ChoiceReader] = []

    def written() -> None:
        nonlocal waiting
        waiting -= 1
        if waiting == 0:
            all_written.set()

    # Choice tasks report failures in-band and never raise: what leaves is the reader's own.
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            for run in runs:
                if run.prefill is None:
                    nursery.start_soon(
                        partial(_run_choice, run, control, abort_timeout, send.clone(), written, readers)
                    )
                else:
                    nursery.start_soon(
                        partial(
                            run_disaggregated_choice,
                            run,
                            control,
                            abort_timeout=abort_timeout,
                            decode_abort_deadline=decode_abort_deadline,
                            send=send.clone(),
                            written=written,
                            readers=readers,
                        )
                    )
            send.close()
            try:
                await all_written.wait()
                yield ChoiceEvents(receive, readers)
            finally:
                nursery.cancel_scope.cancel()


async def _run_choice(
    run: ChoiceRun,
    control: Dispatcher,
    abort_timeout: float,
    send: trio.MemorySendChannel,
    written: Callable[[], None],
    readers: list[ChoiceReader],
) -> None:
    async with send:
        await stream_choice(run, control, abort_timeout, send, written=written, readers=readers)


class ChoiceEvents:
    """Batches of events as they come from the choice tasks; raises a choice's engine failure where
    it happened. A failure behind events of the same batch is raised on the next call, so the events
    before it still go out."""

    __slots__ = ("_receive", "_failure", "_readers")

    def __init__(self, receive: trio.MemoryReceiveChannel, readers: list[ChoiceReader] | None = None) -> None:
        self._receive = receive
        self._failure = DeferredError()
        self._readers = readers if readers is not None else []

    def __aiter__(self) -> ChoiceEvents:
        return self

    def wake(self) -> bool:
        """Have the next read raise `StreamWakeup` (through one choice's reader) unless output comes first."""
        return any(reader.wake() for reader in self._readers)

    async def __anext__(self) -> list[ChoiceEvent]:
        self._failure.raise_held()
        try:
            batch = [await self._receive.receive()]
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        while True:  # what else already arrived goes out in the same write
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        for position, item in enumerate(batch):
            if type(item) is ChoiceFailed:
                if item.error is None:  # a wake-up: moot when events came with it
                    return self._without_wakeups(batch, position)
                if position == 0:
                    raise item.error
                self._failure.hold(item.error)
                return batch[:position]
        return batch

    def _without_wakeups(self, batch: list, position: int) -> list[ChoiceEvent]:
        rest = batch[position + 1 :]
        events = batch[:position]
        for item in rest:
            if type(item) is ChoiceFailed:
                if item.error is None:
                    continue
                if not events:
                    raise item.error
                self._failure.hold(item.error)
                break
            events.append(item)
        if not events:
            raise StreamWakeup
        return events


class _OneChoiceEvents:
    """`ChoiceEvents` of a request with one aggregated choice, read in the request's own task.

    No choice task and no channel between the engine call and the writer: one task switch less per
    batch of tokens, and fewer objects per open stream.
    """

    __slots__ = ("_reader",)

    def __init__(self, reader: ChoiceReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _OneChoiceEvents:
        return self

    def wake(self) -> bool:
        return self._reader.wake()

    def ended(self) -> bool:
        """True once the choice ended: the next read raises StopAsyncIteration without waiting."""
        return self._reader.ended

    async def __anext__(self) -> list[ChoiceEvent]:
        event = await self._reader.next_event()
        if event is None:
            raise StopAsyncIteration
        return [event]
