"""The admin API's engine changes, shared through the state store by every frontend.

``POST /admin/engines`` and ``DELETE /admin/engines/{id}`` received by one process are recorded in
the state store (one record per engine address: added or removed, with its URL, model and role),
then applied to that process's fleet. Every frontend on the same store (the other ``--workers`` of
a host, the other replicas) reads the records every ``--fleet-sync-interval`` seconds and applies
those it has not applied yet (`plan_sync`, sans-IO), so that an engine added through any frontend
is routed to by all of them, and one removed through any drains everywhere. Engine ids are each
frontend's own; the records name engines by address.

A store that is down makes admin changes fail with 503 (nothing is changed anywhere) and pauses
the following; the fleet keeps serving as it is.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

import msgspec
import trio

from trio_direct.fleet.discovery import Address, EngineSpec, address_of
from trio_direct.fleet.membership import Member, Membership
from trio_direct.state.store import StateStore, StoreUnavailable

__all__ = ["AdminRecord", "SharedAdmin", "plan_sync"]

log = logging.getLogger(__name__)

#: The item list holding the records (kept for ever: the fleet's configuration).
ADMIN_ENGINES_KEY = "fleet:admin-engines"


class AdminRecord(msgspec.Struct, kw_only=True):
    """The admin API's last word on one engine address."""

    url: str
    state: Literal["added", "removed"]
    model: str | None = None
    role: str | None = None
    at: float = 0.0

    @property
    def spec(self) -> EngineSpec:
        return EngineSpec(self.url, self.model, self.role)  # type: ignore[arg-type]


_decode = msgspec.json.Decoder(AdminRecord).decode


def record_id(address: Address) -> str:
    return f"{address[0]}:{address[1]}"


@dataclass(frozen=True, slots=True)
class SyncStep:
    """What one frontend must do to follow a record: add the engine, or remove its member."""

    action: Literal["add", "remove"]
    record: AdminRecord
    member: Member | None = None


def plan_sync(records: list[AdminRecord], membership: Membership) -> list[SyncStep]:
    """The steps that bring `membership` in line with the shared records (sans-IO)."""
    steps = []
    for record in records:
        address = address_of(record.url)
        state = membership.admin_state(address)
        if record.state == "added" and state != "added":
            steps.append(SyncStep("add", record))
        elif record.state == "removed" and state != "removed":
            member = membership.member_at(address)
            if member is not None and not member.leaving:
                steps.append(SyncStep("remove", record, member))
    return steps


class SharedAdmin:
    """Records admin changes in the store and follows the other frontends' (see the module doc)."""

    def __init__(self, store: StateStore, membership: Membership, interval: float) -> None:
        self.store = store
        self.membership = membership
        self.interval = interval

    async def _record(self, spec: EngineSpec, state: Literal["added", "removed"]) -> None:
        record = AdminRecord(url=spec.url, state=state, model=spec.model, role=spec.role, at=time.time())
        await self.store.add_items(
            ADMIN_ENGINES_KEY, [(record_id(spec.address), msgspec.json.encode(record))], ttl=None
        )

    async def add(self, spec: EngineSpec) -> tuple[Member, bool]:
        """Add an engine everywhere (`StoreUnavailable`: nowhere)."""
        await self._record(spec, "added")
        return self.membership.add(spec)

    async def remove(self, engine_id: str) -> Member | None:
        """Remove an engine everywhere (`StoreUnavailable`: nowhere); None for an unknown id."""
        member = self.membership.member(engine_id)
        if member is None:
            return None
        if not member.leaving:
            await self._record(EngineSpec(member.url, member.spec.model, member.spec.role), "removed")
        return self.membership.remove(engine_id)

    async def sync_once(self) -> int:
        """Apply the records this frontend has not applied; how many steps it took."""
        raw = await self.store.items(ADMIN_ENGINES_KEY)
        records = []
        for item_id, value in raw:
            try:
                records.append(_decode(value))
            except (msgspec.DecodeError, ValueError):
                log.warning("ignoring a malformed admin record %r in the state store", item_id)
        steps = plan_sync(records, self.membership)
        for step in steps:
            if step.action == "add":
                log.info("engine %s added through another frontend's admin API: adding it here", step.record.url)
                self.membership.add(step.record.spec)
            elif step.member is not None:
                log.info("engine %s removed through another frontend's admin API: draining it here", step.record.url)
                self.membership.remove(step.member.id)
        return len(steps)

    async def run(self) -> None:
        """Follow the records until cancelled (a store that is down is retried next interval)."""
        reported = False
        while True:
            try:
                await self.sync_once()
                reported = False
            except StoreUnavailable as error:
                if not reported:
                    log.warning("cannot read the admin API's engines from the state store: %s", error)
                    reported = True
            await trio.sleep(self.interval)
