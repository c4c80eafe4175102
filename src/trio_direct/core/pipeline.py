"""The request pipeline of a planned generation, in one function: admit -> dispatch -> render -> write.

A surface decodes its request and plans it onto the core (`core.plan`: prompts, sampling, one output
pipeline per choice); `serve_planned` takes it from there, in this order:

1. **admit**: the request's priority is applied, then it waits for its turn (`admit_turn`: a slot of
   ``--max-concurrent-requests``, a place in the queue, and an engine of its pool below the busy
   threshold; `core.admission`). 429 or 503 are raised as `ApiError`.
2. **dispatch**: engines are chosen and called (`core.dispatch`, driven by `core.render`).
3. **render**: the surface's `Renderer` turns each batch of events into its API's bytes.
4. **write**: the bytes go to the `PipelineWriter` (the HTTP layer's `Exchange`: its `send` and
   `json` are the seam a faster HTTP writer plugs into), streamed as they come or as one body.

The HTTP layer only reads the request and writes bytes; it calls `serve_planned` with itself as
the writer (`Exchange.respond`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from trio_direct import metrics
from trio_direct.core.admission import Admission, Gate, Ticket
from trio_direct.core.plan import RequestPlan
from trio_direct.core.pool import ServingPool
from trio_direct.core.render import Renderer, ResponseWriter, StreamCutter, stream_response, unary_response

__all__ = ["PipelineWriter", "admit_turn", "apply_priority", "serve_planned"]


class PipelineWriter(ResponseWriter, Protocol):
    """Where a response goes: a stream's start, sends and end, or one JSON body."""

    #: The request's arrival (`time.perf_counter()`), for time to first token.
    started: float

    async def json(self, status: int, payload: bytes) -> None: ...


def apply_priority(plan: RequestPlan, priority: int | None) -> None:
    """The request's ``priority`` (SGLang's extension field) on the plan and each engine request."""
    if priority is None:
        return
    plan.priority = priority
    for choice in plan.choices:
        choice.request.priority = priority


async def admit_turn(
    admission: Admission | None, ticket: Ticket | None, gate: Gate | None, priority: int | None, trace: Any = None
) -> None:
    """Wait for the request's turn: a slot, and an engine of `gate` (its pool) below the busy
    threshold. Without a ticket (a route that does not count against admission) it goes at once."""
    if ticket is None or admission is None:
        return
    if trace is None:
        await admission.admit(ticket, priority, gate)
        return
    with trace.child("queue", priority=priority or 0):
        await admission.admit(ticket, priority, gate)


async def serve_planned(
    pool: ServingPool,
    plan: RequestPlan,
    renderer: Renderer,
    writer: PipelineWriter,
    *,
    priority: int | None,
    admit: Callable[[int | None, Any], Awaitable[None]],
    cutter: StreamCutter,
    charge: Callable[[], Awaitable[None]] | None = None,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve a planned generation: admit, dispatch, render, write (see the module docstring).

    `admit(priority, trace)` waits for the request's turn (`admit_turn` with the request's ticket);
    `charge`, when given, runs once the plan is known and before the wait (a tenant's prompt
    tokens); `settle` runs once the output is complete, before its end is written.
    """
    # 1. admit
    apply_priority(plan, priority)
    trace = plan.trace
    if trace is not None:
        trace.planned()
    if charge is not None:
        await charge()
    await admit(priority, trace)
    # 2-4. dispatch, render, write
    if trace is None:
        await _dispatch_render_write(pool, plan, renderer, writer, cutter, settle)
    else:
        with trace.child("response", stream=plan.stream):
            await _dispatch_render_write(pool, plan, renderer, writer, cutter, settle)


async def _dispatch_render_write(
    pool: ServingPool,
    plan: RequestPlan,
    renderer: Renderer,
    writer: PipelineWriter,
    cutter: StreamCutter,
    settle: Callable[[], Awaitable[None]] | None,
) -> None:
    if plan.stream:
        # Dispatches, then renders and writes each batch of events as it comes.
        await stream_response(pool, plan, renderer, writer, started=writer.started, cutter=cutter, settle=settle)
        return
    body = await unary_response(pool, plan, renderer, cutter=cutter)  # dispatch, then render once
    metrics.TTFT.labels(plan.model).observe(time.perf_counter() - writer.started)
    if settle is not None:
        await settle()
    await writer.json(200, body)
