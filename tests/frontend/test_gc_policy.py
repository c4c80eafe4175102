"""GC policy: full collections on heap growth only, and a request path that leaves no cyclic garbage."""

from __future__ import annotations

import gc
from functools import partial

import httpx
import trio
from support import RawSseClient, start_frontend, start_mock_engine

from trio_direct.frontend.gc_policy import (
    YOUNG_OBJECTS,
    YOUNG_PASSES_PER_OLDER,
    FullCollectionSchedule,
    run_gc_policy,
)
from trio_direct.metrics import REGISTRY


def test_a_full_pass_is_due_only_past_the_growth_over_the_last_live_heap():
    schedule = FullCollectionSchedule(growth=0.25, baseline=1000)
    assert not schedule.due(1250)
    assert schedule.due(1251)
    schedule.collected(1100)  # the pass left 1,100 live blocks: growth counts from there
    assert not schedule.due(1375)
    assert schedule.due(1376)


class _Cycle:
    def __init__(self) -> None:
        self.me = self
        self.payload = [object() for _ in range(8)]


async def test_old_cyclic_garbage_is_collected_once_the_heap_grew_and_cpython_gets_its_schedule_back():
    before = gc.get_threshold()
    runs = REGISTRY.get_sample_value("trio_direct_gc_full_collections_total") or 0.0
    async with trio.open_nursery() as nursery:
        schedule = await nursery.start(partial(run_gc_policy, 0.02, check_every=0.01))
        threshold = gc.get_threshold()
        assert threshold[:2] == (YOUNG_OBJECTS, YOUNG_PASSES_PER_OLDER)
        assert threshold[2] > 10**9  # CPython never starts a full pass by itself
        cycles = [_Cycle() for _ in range(schedule.baseline // 100)]
        gc.collect(1)
        gc.collect(1)  # promoted to the old generation, where only a full pass looks
        del cycles
        with trio.fail_after(10):
            while (REGISTRY.get_sample_value("trio_direct_gc_full_collections_total") or 0.0) == runs:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert not any(isinstance(o, _Cycle) for o in gc.get_objects())
    assert gc.get_threshold() == before


async def test_served_requests_leave_no_reference_cycles_in_trio_direct_objects(nursery):
    # Cycles would reach the old generation under load and wait there for a full pass.
    engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
    base = await start_frontend(nursery, "--engine-url", engine.url, "--gc-full-collection-growth", "0")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body["model"] = (await client.get("/v1/models")).json()["data"][0]["id"]
        await client.post("/v1/chat/completions", json=body)  # warm-up: caches, lazy imports
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for stream in (False, True, False, True):
                response = await client.post("/v1/chat/completions", json=body | {"stream": stream})
                assert response.status_code == 200
            await client.post("/v1/completions", json={"model": body["model"], "prompt": "x", "max_tokens": 4})
            for bad in ({"model": body["model"]}, body | {"model": "nope"}, body | {"max_tokens": 0}):
                assert (await client.post("/v1/chat/completions", json=bad)).status_code in (400, 404)
            assert (await client.post("/v1/completions", content=b"{not json")).status_code == 400
            events = RawSseClient(base).events("/v1/chat/completions", body | {"stream": True, "max_tokens": 500})
            async for _ in events:
                break  # a client that leaves mid-stream
            await events.aclose()
            await trio.sleep(0.3)  # its Abort goes out
            gc.collect()
            ours = [o for o in gc.garbage if type(o).__module__.startswith("trio_direct")]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert ours == []
