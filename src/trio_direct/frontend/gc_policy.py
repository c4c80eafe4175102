"""When the cyclic garbage collector may stop every stream: full passes on heap growth, not on promotions.

CPython runs a full (generation-2) collection once the objects promoted to the old generation since
the last one reach a quarter of it. A frontend holding many streams promotes each stream's objects
(they live for seconds) and frees them by reference counting moments later, so that rule fires every
few seconds although almost nothing is garbage, and each full pass walks every live object: 0.3-0.5 s
at 1,000 open streams on a small VM, during which no stream moves (benchmarks/README.md, "Soak").

Under this policy CPython keeps its young passes, whose cost grows with the young objects, made
smaller: a generation-0 pass every `YOUNG_OBJECTS` new objects instead of 700 and a generation-1 pass
every `YOUNG_PASSES_PER_OLDER` generation-0 passes instead of 10 (in the soak, generation-1 passes
took up to 227 ms at 5,000 new objects, 88 ms at 700 and 51 ms at 200; CPU per token was the same
at 700 and 200, within noise).
A full pass runs only when the heap, counted in pymalloc blocks still allocated, grew by
`growth` since the last one (1.0, the default, is Go's GOGC=100: when it doubled). Blocks freed by
reference counting leave that count, promotions do not enter it, and cyclic garbage that reached the
old generation does: it stays bounded to that fraction of the live heap. The request path keeps no
reference cycles (a test holds it to that), so under a steady load the heap levels off and no full
pass runs; a load that grows pays one pass each time the heap doubles.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from contextlib import aclosing
from dataclasses import dataclass

import trio
import trio_util

from trio_direct import metrics

log = logging.getLogger(__name__)

#: New GC-tracked objects per generation-0 pass (CPython: 700).
YOUNG_OBJECTS = 200

#: Generation-0 passes per generation-1 pass (CPython: 10). Fewer keeps generation 1 small, so its
#: passes, which walk it whole, stay short under load.
YOUNG_PASSES_PER_OLDER = 2

#: A generation-2 threshold CPython never reaches: full passes are this policy's call.
_NEVER = 2**31 - 1


@dataclass(slots=True)
class FullCollectionSchedule:
    """The sans-IO part: whether a heap of `allocated` blocks is due a full pass."""

    growth: float
    baseline: int

    def due(self, allocated: int) -> bool:
        return allocated > self.baseline * (1.0 + self.growth)

    def collected(self, allocated: int) -> None:
        """A full pass just ran and left `allocated` blocks: the live heap, the next pass's reference."""
        self.baseline = allocated


async def run_gc_policy(
    growth: float,
    *,
    check_every: float = 1.0,
    task_status: trio.TaskStatus[FullCollectionSchedule] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Apply the policy to this process until cancelled, then give CPython its own schedule back."""
    previous = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, YOUNG_PASSES_PER_OLDER, _NEVER)
    schedule = FullCollectionSchedule(growth, sys.getallocatedblocks())
    task_status.started(schedule)
    try:
        async with aclosing(trio_util.periodic(check_every)) as ticks:  # closed on cancellation, not by the GC
            async for _ in ticks:
                allocated = sys.getallocatedblocks()
                if schedule.due(allocated):
                    grew = allocated / max(1, schedule.baseline) - 1.0
                    started = time.perf_counter()
                    freed = gc.collect()
                    took = time.perf_counter() - started
                    schedule.collected(sys.getallocatedblocks())
                    metrics.GC_FULL_COLLECTIONS.inc()
                    log.info(
                        "full garbage collection after the heap grew %.0f%%: %d unreachable objects, %.0f ms",
                        grew * 100, freed, took * 1e3,
                    )  # fmt: skip
    finally:
        gc.set_threshold(*previous)
