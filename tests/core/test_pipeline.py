"""The request pipeline's stages in one process (`core.pipeline`): admit, then dispatch, render, write.

Time is the subject of the admission tests, so they run on trio's `MockClock` (autojump): a 30 s
queue timeout passes in no real time (pytest-trio's `autojump_clock`), and no test depends on the machine's speed.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

from trio_direct.core import pipeline
from trio_direct.core.admission import Admission
from trio_direct.core.errors import ApiError

#: Stands in for the StreamCutter, which these stages pass on without using.
_STUB_CUTTER: Any = SimpleNamespace()


def _plan(choices: int = 2, *, trace=None) -> Any:  # stands in for a RequestPlan
    requests = [SimpleNamespace(priority=None) for _ in range(choices)]
    return SimpleNamespace(
        priority=None, trace=trace, stream=True, choices=[SimpleNamespace(request=r) for r in requests]
    )


def test_the_priority_reaches_the_plan_and_every_engine_request():
    plan = _plan(3)
    pipeline.apply_priority(plan, 7)
    assert plan.priority == 7 and [c.request.priority for c in plan.choices] == [7, 7, 7]
    unset = _plan()
    pipeline.apply_priority(unset, None)
    assert unset.priority is None and all(c.request.priority is None for c in unset.choices)


async def test_a_request_without_a_ticket_goes_at_once():
    await pipeline.admit_turn(None, None, None, 3)  # routes that do not count against admission


async def test_a_queued_request_waits_for_a_slot_then_goes(autojump_clock):
    admission = Admission(max_active=1, max_queued=1, timeout=30)
    running, waiter = admission.arrive(), admission.arrive()
    assert running is not None and waiter is not None
    admitted_at = []

    async def wait_for_turn() -> None:
        await pipeline.admit_turn(admission, waiter, None, None)
        admitted_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_turn)
        await trio.sleep(20)  # virtual time: the waiter is still in line
        assert admitted_at == []
        admission.leave(running)
    assert admitted_at == [pytest.approx(20)]


async def test_a_request_that_waited_out_the_queue_timeout_is_refused_and_never_dispatched(autojump_clock, monkeypatch):
    admission = Admission(max_active=1, max_queued=1, timeout=30)
    admission.arrive()  # the slot stays taken
    waiter = admission.arrive()
    stages: list[str] = []

    async def dispatched(*args) -> None:
        stages.append("dispatch")

    monkeypatch.setattr(pipeline, "_dispatch_render_write", dispatched)
    start = trio.current_time()
    with pytest.raises(ApiError) as refused:
        await pipeline.serve_planned(
            SimpleNamespace(),
            _plan(),
            SimpleNamespace(),
            SimpleNamespace(started=0.0),
            priority=None,
            admit=lambda priority, trace: pipeline.admit_turn(admission, waiter, None, priority, trace),
            cutter=_STUB_CUTTER,
        )
    assert refused.value.status == 503
    assert trio.current_time() - start == pytest.approx(30)
    assert stages == []


async def test_the_stages_run_in_order_charge_admit_then_dispatch_render_write(monkeypatch):
    stages: list[object] = []

    async def dispatched(pool, plan, renderer, writer, cutter, settle) -> None:
        stages.append(("dispatch", plan.priority))

    async def charge() -> None:
        stages.append("charge")

    async def admit(priority, trace) -> None:
        stages.append(("admit", priority))

    monkeypatch.setattr(pipeline, "_dispatch_render_write", dispatched)
    await pipeline.serve_planned(
        SimpleNamespace(),
        _plan(),
        SimpleNamespace(),
        SimpleNamespace(started=0.0),
        priority=5,
        admit=admit,
        cutter=_STUB_CUTTER,
        charge=charge,
    )
    assert stages == ["charge", ("admit", 5), ("dispatch", 5)]
