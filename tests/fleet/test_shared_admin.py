"""Following the admin API's shared engine records (sans-IO planning; the scenario with real
processes is tests/scenarios/test_shared_state.py)."""

from __future__ import annotations

from types import SimpleNamespace

from trio_direct.fleet.discovery import EngineIds, EngineSpec
from trio_direct.fleet.membership import Membership
from trio_direct.fleet.shared_admin import AdminRecord, plan_sync


def membership_with(url: str) -> Membership:
    membership = Membership(SimpleNamespace(), SimpleNamespace(), ids=EngineIds(1))  # type: ignore[arg-type]
    membership.adopt("engine-url", EngineSpec(url), "m", SimpleNamespace(id="e0"))  # type: ignore[arg-type]
    return membership


def test_records_not_applied_here_become_steps_and_applied_ones_do_not():
    membership = membership_with("grpc://a:1")
    records = [
        AdminRecord(url="grpc://b:2", state="added", model="m"),
        AdminRecord(url="grpc://A:1", state="removed"),  # the same address, however it is spelled
        AdminRecord(url="grpc://c:3", state="removed"),  # never known here: nothing to drain
    ]
    steps = plan_sync(records, membership)
    assert [(s.action, s.record.url) for s in steps] == [("add", "grpc://b:2"), ("remove", "grpc://A:1")]
    assert steps[0].record.spec == EngineSpec("grpc://b:2", "m", None)
    assert steps[1].member is membership.member("e0")
    membership._excluded[("a", 1)] = "grpc://a:1"  # what `remove` leaves behind: applied
    assert [s.action for s in plan_sync(records[1:], membership)] == []
