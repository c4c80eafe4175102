"""The living fleet: every engine some source names, from its first probe to its drained end.

Sources (`--engine-url`, DNS, SRV, a file, the admin API) say which engines they want; an engine
that several name is one engine (by host and port), kept while any of them wants it. For each one:

- **Joining.** It is probed (like a start-up engine, every probe interval until it is up), then
  handed to the `PoolHost`, which checks it against its model's pool (model, block size, role),
  connects ahead, subscribes to its KV events and only then makes it routable; a new served model
  opens a new pool. An engine the pool refuses stays out, with its reason (logged once per
  reason, shown by ``GET /admin/engines``), and is probed again: it may be restarted right.
- **Leaving.** When no source wants it any more (or the admin API removes it) it is *drained*: out
  of routing at once; its in-flight requests finish, or past ``--drain-timeout`` their streams are
  failed at the transport (`EngineChannel.fail_streams`: each request then ends as one whose engine
  went away: retried elsewhere before its first token, migrated after it within
  ``--migration-limit``, else an error event; an `Abort` either way); then its channel is retired (connections closed, no call reconnects) and the pool forgets
  it (KV index entries, load, metric series; a pool whose last engine left closes).
- An engine that only DNS names, while every DNS answer since it was last confirmed failed or came
  back empty (the sources are *holding* it), leaves when its health checks fail: a Service scaled
  to zero answers NXDOMAIN, and its dead engines must not be kept for ever.

A join in progress is never cut: a leave waits for it, then drains what joined. An engine that
comes back at an address still draining waits for that drain before it is probed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal, Protocol

import trio

from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable
from trio_direct.engine.transport import ChannelPool
from trio_direct.fleet.card import CardError
from trio_direct.fleet.discovery import Address, EngineIds, EngineSpec, SourceChanges, SourceState
from trio_direct.fleet.engine_apis import AUTO
from trio_direct.fleet.fleet import Engine, FleetError
from trio_direct.fleet.probe import ProbedEngine, probe_engine

__all__ = ["Member", "MemberState", "Membership", "PoolHost"]

log = logging.getLogger(__name__)

#: ``joining``: not up yet (or being placed); ``refused``: up, but its pool does not admit it;
#: ``serving``: in its pool (routable while healthy); ``draining``: leaving, finishing its requests.
MemberState = Literal["joining", "refused", "serving", "draining"]

#: The source name of engines the admin API adds.
ADMIN = "admin"


class PoolHost(Protocol):
    """Where engines serve: the frontend's model pools."""

    async def join(self, member: Member, probed: ProbedEngine) -> tuple[str, Engine]:
        """Put the probed engine in its model's pool (opening one for a new model) and make it
        routable: (the pool's model name, the engine). Raise `FleetError` to refuse it."""

    def withdraw(self, engine: Engine) -> None:
        """No new request may go to `engine` from now on (it stays known while it drains)."""

    def forget(self, engine: Engine) -> None:
        """`engine` drained and is disconnected: drop what is left of it."""


@dataclass(eq=False)
class Member:
    """One engine of the fleet, by address, and where it is in its life."""

    id: str
    spec: EngineSpec
    #: Source name -> how that source names it.
    sources: dict[str, EngineSpec]
    state: MemberState = "joining"
    #: Why it is not serving (its last probe's failure, or why its pool refused it).
    reason: str = ""
    #: Set once it joined its pool: the engine, and the pool's model name.
    engine: Engine | None = None
    pool: str | None = None
    #: Set when it must leave: probing stops, and a join in progress is drained once done.
    leaving: bool = False
    #: Its first probe came to an outcome (serving, refused, or not up): start-up waits for this.
    settled: trio.Event = field(default_factory=trio.Event)
    #: Its join task ended (joined, or stopped because it leaves).
    join_done: trio.Event = field(default_factory=trio.Event)
    drained: trio.Event = field(default_factory=trio.Event)
    #: The drain of the engine that was at this address before, which this one waits for.
    after: trio.Event | None = None
    _probe_scope: trio.CancelScope | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def address(self) -> Address:
        return self.spec.address

    @property
    def model(self) -> str | None:
        """The pool it serves in, once it joined; else the model its source names, if any."""
        return self.pool if self.pool is not None else self.spec.model


class Membership:
    """Every engine the sources want, joined, refused or draining (see the module doc)."""

    def __init__(
        self,
        host: PoolHost,
        channels: ChannelPool,
        *,
        ids: EngineIds,
        api: str = AUTO,
        probe_interval: float = 5.0,
        probe_timeout: float = 10.0,
        drain_timeout: float = 30.0,
        abort_timeout: float = 5.0,
    ) -> None:
        self.host = host
        self.channels = channels
        self.ids = ids
        self.api = api
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.drain_timeout = drain_timeout
        self.abort_timeout = abort_timeout
        #: The engines wanted now (joining, refused or serving), by address.
        self._members: dict[Address, Member] = {}
        self._leaving: list[Member] = []
        #: Address -> the sources that want it and how each names it (kept for excluded ones too).
        self._wanted: dict[Address, dict[str, EngineSpec]] = {}
        #: Addresses the admin API removed: no source brings them back until it adds them again.
        self._excluded: dict[Address, str] = {}
        self._sources: dict[str, SourceState] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the tasks of joining and draining engines until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    # ---- what there is ------------------------------------------------------------------------------

    def members(self) -> list[Member]:
        """Every engine, the ones wanted first (in id order), then the ones draining."""
        return sorted(self._members.values(), key=_id_order) + list(self._leaving)

    def waiting(self) -> list[Member]:
        """Engines wanted but in no pool: not up yet, or refused."""
        return [m for m in self.members() if m.state in ("joining", "refused") and not m.leaving]

    def member(self, engine_id: str) -> Member | None:
        return next((m for m in self.members() if m.id == engine_id), None)

    def member_at(self, address: Address) -> Member | None:
        """The engine wanted at `address` (not one draining there)."""
        return self._members.get(address)

    def admin_state(self, address: Address) -> Literal["added", "removed"] | None:
        """What the admin API last did to `address` here: removed it (sources keep it out), added
        it (it wants it), or nothing."""
        if address in self._excluded:
            return "removed"
        if ADMIN in self._wanted.get(address, {}):
            return "added"
        return None

    @property
    def excluded(self) -> list[str]:
        """URLs of engines the admin API removed, which sources do not bring back."""
        return list(self._excluded.values())

    # ---- sources ------------------------------------------------------------------------------------

    def add_source(self, state: SourceState) -> None:
        self._sources[state.name] = state

    def observe(self, source: str, answer: list[EngineSpec] | None, now: float | None = None) -> SourceChanges:
        """Apply one answer of `source` (None: it failed): engines join and leave by its rules."""
        changes = self._sources[source].observe(answer, trio.current_time() if now is None else now)
        for spec in changes.removed:
            self.unwant(source, spec.address)
        for spec in changes.added:
            self.want(source, spec)
        return changes

    def want(
        self, source: str, spec: EngineSpec, *, engine_id: str | None = None, reason: str | None = None
    ) -> Member | None:
        """`source` wants the engine `spec` names: a new engine starts joining (with `engine_id`,
        if given, else the next id; `reason`: it was probed already and is not up, for that reason).
        None while the admin API keeps it out."""
        address = spec.address
        self._wanted.setdefault(address, {})[source] = spec
        if address in self._excluded:
            return None
        member = self._members.get(address)
        if member is not None:
            if (spec.model, spec.role) != (member.spec.model, member.spec.role) and source not in member.sources:
                log.warning(
                    "engine %s (%s) is named by %s as %s but by %s as %s; the first one applies",
                    member.id, member.url, source, _describe(spec), next(iter(member.sources)), _describe(member.spec),
                )  # fmt: skip
            member.sources[source] = spec
            return member
        assert self._nursery is not None, "Membership.want needs run() running"
        member = Member(engine_id or self.ids.allocate(), spec, dict(self._wanted[address]))
        if reason is not None:
            member.reason = reason
            member.settled.set()
        previous = next((m for m in reversed(self._leaving) if m.address == address), None)
        if previous is not None:
            member.after = previous.drained
        self._members[address] = member
        log.info("engine %s (%s) named by %s: probing it", member.id, member.url, source)
        self._nursery.start_soon(self._join, member)
        return member

    def unwant(self, source: str, address: Address) -> None:
        """`source` no longer wants the engine at `address`: it leaves once no source does."""
        wanted = self._wanted.get(address)
        if wanted is not None:
            wanted.pop(source, None)
            if not wanted:
                del self._wanted[address]
        member = self._members.get(address)
        if member is None or source not in member.sources:
            return
        del member.sources[source]
        if not member.sources:
            self._leave(member, f"no longer named by {source}")

    def adopt(self, source: str, spec: EngineSpec, pool: str, engine: Engine) -> Member:
        """Register an engine that already joined its pool at start-up."""
        member = Member(engine.id, spec, {source: spec}, state="serving", engine=engine, pool=pool)
        member.settled.set()
        member.join_done.set()
        self._wanted.setdefault(spec.address, {})[source] = spec
        self._members[spec.address] = member
        return member

    # ---- the admin API ------------------------------------------------------------------------------

    def add(self, spec: EngineSpec) -> tuple[Member, bool]:
        """The admin API adds an engine (also one it removed before); (its member, whether it is new)."""
        self._excluded.pop(spec.address, None)
        known = self._members.get(spec.address)
        member = self.want(ADMIN, spec)
        assert member is not None
        return member, known is None

    def remove(self, engine_id: str) -> Member | None:
        """The admin API removes an engine: it drains, and no source brings it back until the admin
        API adds it again. None for an unknown id; a draining engine is returned as it is."""
        member = self.member(engine_id)
        if member is None or member.leaving:
            return member
        self._excluded[member.address] = member.url
        wanted = self._wanted.get(member.address)
        if wanted is not None:
            wanted.pop(ADMIN, None)
            if not wanted:
                del self._wanted[member.address]
        self._leave(member, "removed through the admin API")
        return member

    # ---- health -------------------------------------------------------------------------------------

    def engine_down(self, engine: Engine) -> None:
        """Health checks marked `engine` down: it leaves if only DNS holding it keeps it."""
        member = next((m for m in self._members.values() if m.engine is engine), None)
        if member is None:
            return
        states = [self._sources.get(name) for name in member.sources]
        if not all(state is not None and state.keep_when_empty and state.holding for state in states):
            return
        for state in states:
            assert state is not None
            state.forget(member.address)
            self.unwant(state.name, member.address)

    # ---- joining ------------------------------------------------------------------------------------

    async def _join(self, member: Member) -> None:
        try:
            if member.after is not None:
                await member.after.wait()
            while not member.leaving:
                probed = await self._probe(member)
                if member.leaving:
                    return
                if probed is not None and await self._place(member, probed):
                    return
                member.settled.set()
                await self._pause(member)
        finally:
            member.settled.set()
            member.join_done.set()

    async def _probe(self, member: Member) -> ProbedEngine | None:
        """Probe once; None (with `member.reason` set) when it is not up or cannot be used."""
        name = f"engine {member.id} ({member.url})"
        with trio.CancelScope() as scope:
            member._probe_scope = scope
            try:
                with trio.fail_after(self.probe_timeout):
                    return await probe_engine(member.url, self.channels, api=self.api, timeout=self.probe_timeout)
            except (EngineUnavailable, EngineDeadlineExceeded, trio.TooSlowError) as error:
                reason = str(error) or "no answer"
                if reason != member.reason:
                    log.info("%s is not up yet (%s); it joins when it comes up", name, reason)
                member.state, member.reason = "joining", reason
            except (EngineError, CardError, ValueError) as error:
                self._refuse(member, f"{name} answers but cannot be used: {error}")
            finally:
                member._probe_scope = None
        return None

    async def _place(self, member: Member, probed: ProbedEngine) -> bool:
        """Hand the probed engine to its pool; whether it joined. Not cut by a leave: a leave waits."""
        try:
            pool, engine = await self.host.join(member, probed)
        except FleetError as error:
            self._refuse(member, f"engine {member.id} ({member.url}) is up but cannot join: {error}")
            return False
        member.engine, member.pool, member.state, member.reason = engine, pool, "serving", ""
        return True

    async def _pause(self, member: Member) -> None:
        with trio.CancelScope() as scope:
            member._probe_scope = scope
            try:
                await trio.sleep(self.probe_interval)
            finally:
                member._probe_scope = None

    def _refuse(self, member: Member, reason: str) -> None:
        """Loud, but once per reason: the engine is probed again every interval."""
        if reason != member.reason:
            log.error("%s; it stays out of routing", reason)
        member.state, member.reason = "refused", reason

    # ---- leaving ------------------------------------------------------------------------------------

    def _leave(self, member: Member, why: str) -> None:
        del self._members[member.address]
        member.leaving = True
        if member.state == "serving":  # withdrawn by `_drain` at its first step: say so at once
            member.state = "draining"
        if member._probe_scope is not None:
            member._probe_scope.cancel()
        self._leaving.append(member)
        assert self._nursery is not None
        self._nursery.start_soon(self._drain, member, why)

    async def _drain(self, member: Member, why: str) -> None:
        try:
            await member.join_done.wait()
            engine = member.engine
            if engine is None:
                log.info("engine %s (%s) leaves before it joined: %s", member.id, member.url, why)
                return
            member.state = "draining"
            self.host.withdraw(engine)
            channel = self.channels.get(engine.card.host, engine.card.port)
            log.info(
                "engine %s (%s) leaves the fleet (%s): no new requests; draining %d open stream(s)",
                member.id, member.url, why, channel.streams_in_flight,
            )  # fmt: skip
            with trio.move_on_after(self.drain_timeout):
                await channel.wait_idle()
            if not channel.idle:
                ended = channel.fail_streams(EngineUnavailable("engine drained", engine=channel.name))
                log.warning(
                    "engine %s: %d request(s) still running after --drain-timeout %gs end there with an Abort"
                    " (each moves to another engine within --migration-limit, else ends with an error)",
                    member.id, ended, self.drain_timeout,
                )  # fmt: skip
                with trio.move_on_after(self.abort_timeout + 1.0):  # their Aborts go out first
                    await channel.wait_idle()
            self.channels.retire(engine.card.host, engine.card.port)
            self.host.forget(engine)
            log.info("engine %s (%s) drained and disconnected", member.id, member.url)
        finally:
            member.drained.set()
            self._leaving.remove(member)


def _id_order(member: Member) -> tuple[int, str]:
    digits = member.id[1:]
    return (int(digits) if digits.isdigit() else -1, member.id)


def _describe(spec: EngineSpec) -> str:
    parts = [f"model {spec.model!r}" if spec.model else "", f"role {spec.role}" if spec.role else ""]
    return ", ".join(p for p in parts if p) or "any model and role"
