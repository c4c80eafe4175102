"""The living fleet against real (in-process) mock engines: engines join once probed and admitted,
several sources share one engine, leaving drains (in-flight requests finish, or past the drain
timeout end with an error and an Abort), the admin API's removals stick, and engines that only a
holding DNS source keeps leave when their health checks fail."""

from __future__ import annotations

import pytest
import trio
from support import wait_until

from trio_direct.core.engine_call import open_engine_call
from trio_direct.engine.errors import EngineUnavailable
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.fleet.discovery import EngineIds, EngineSpec, SourceState
from trio_direct.fleet.fleet import Engine, FleetError
from trio_direct.fleet.membership import Membership


class RecordingHost:
    """A `PoolHost` that admits every engine (unless told to refuse) and notes what happens."""

    def __init__(self) -> None:
        self.joined: list[Engine] = []
        self.withdrawn: list[str] = []
        self.forgotten: list[str] = []
        self.refuse: str | None = None

    async def join(self, member, probed):
        if self.refuse is not None:
            raise FleetError(self.refuse)
        engine = Engine(member.id, probed.card, probed.client)
        self.joined.append(engine)
        return probed.card.served_model_name, engine

    def withdraw(self, engine: Engine) -> None:
        self.withdrawn.append(engine.id)

    def forget(self, engine: Engine) -> None:
        self.forgotten.append(engine.id)


@pytest.fixture
async def fleet(pool, nursery):
    host = RecordingHost()
    membership = Membership(
        host, pool, ids=EngineIds(), probe_interval=0.05, probe_timeout=2.0, drain_timeout=0.5, abort_timeout=2.0
    )
    await nursery.start(membership.run)
    return host, membership


def url(running) -> str:
    return f"grpc://127.0.0.1:{running.port}"


def long_request(rid: str) -> GenerateInput:
    return GenerateInput(rid, [5, 6, 7], SamplingOptions(max_new_tokens=20_000, ignore_eos=True))


async def test_an_engine_joins_once_up_and_leaves_when_no_source_wants_it(fleet, start_mock, pool, unused_port):
    host, membership = fleet
    spec = EngineSpec(f"127.0.0.1:{unused_port}")
    member = membership.want("file:a", spec)
    membership.want("dns:b", spec)  # the same engine, named twice
    await wait_until(lambda: "cannot connect" in member.reason)
    assert member.state == "joining" and [m.id for m in membership.waiting()] == ["e0"]

    await start_mock(port=unused_port, served_model_name="tiny")
    await wait_until(lambda: member.state == "serving")
    assert [e.id for e in host.joined] == ["e0"] and member.pool == "tiny"
    assert sorted(member.sources) == ["dns:b", "file:a"] and membership.waiting() == []

    membership.unwant("file:a", spec.address)
    assert member.state == "serving" and not host.withdrawn  # the other source still wants it
    membership.unwant("dns:b", spec.address)
    await wait_until(lambda: member.drained.is_set())
    assert host.withdrawn == host.forgotten == ["e0"]
    assert membership.members() == []
    assert pool.get("127.0.0.1", unused_port) is not host.joined[0].client.channel  # its channel was retired
    assert host.joined[0].client.channel.retired


async def test_an_engine_its_pool_refuses_stays_out_with_the_reason_and_is_probed_again(fleet, start_mock):
    host, membership = fleet
    running = await start_mock()
    host.refuse = "block size (page_size) 16 differs"
    member = membership.want("admin", EngineSpec(url(running)))
    await wait_until(lambda: member.state == "refused")
    assert "cannot join: block size (page_size) 16 differs" in member.reason
    host.refuse = None  # say the operator restarted it right: the next probe gets it in
    await wait_until(lambda: member.state == "serving")


async def test_a_leaving_engine_finishes_its_requests_first(fleet, start_mock):
    host, membership = fleet
    membership.drain_timeout = 30.0
    running = await start_mock(speedup=1.0)
    member = membership.want("admin", EngineSpec(url(running)))
    await wait_until(lambda: member.state == "serving")
    client = host.joined[0].client
    request = GenerateInput("a" * 36, [5, 6, 7], SamplingOptions(max_new_tokens=40, ignore_eos=True))
    received = []
    async with open_engine_call(client, request) as call:
        received.extend(await call.next_batch())
        membership.remove(member.id)
        await trio.sleep(0.05)
        assert host.withdrawn == ["e0"] and not host.forgotten  # out of routing, still connected
        while batch := await call.next_batch():
            received.extend(batch)
    assert received[-1].finish_reason == "length" and sum(len(c.token_ids) for c in received) == 40
    await wait_until(lambda: member.drained.is_set())
    assert host.forgotten == ["e0"]
    accounts = running.engine.accounting
    assert (accounts.finished, accounts.aborted, accounts.live) == (1, 0, set())


async def test_past_the_drain_timeout_open_requests_end_with_an_error_and_an_abort(fleet, start_mock):
    host, membership = fleet
    running = await start_mock(speedup=1.0)
    member = membership.want("admin", EngineSpec(url(running)))
    await wait_until(lambda: member.state == "serving")
    client = host.joined[0].client
    failures = []

    async def read_until_cut(rid: str) -> None:
        try:
            async with open_engine_call(client, long_request(rid), abort_timeout=2.0) as call:
                while await call.next_batch():
                    pass
        except EngineUnavailable as error:
            failures.append(error.message)

    async with trio.open_nursery() as nursery:
        for rid in ("b" * 36, "c" * 36):
            nursery.start_soon(read_until_cut, rid)
        await wait_until(lambda: len(running.engine.accounting.live) == 2)
        membership.remove(member.id)
    assert failures == ["engine drained", "engine drained"]
    await wait_until(lambda: member.drained.is_set())
    accounts = running.engine.accounting
    assert accounts.live == set() and accounts.aborted + accounts.cancelled == 2
    assert sorted(rid for rid, _ in accounts.abort_rpcs) == ["b" * 36, "c" * 36]  # every request aborted
    assert host.forgotten == ["e0"]


async def test_an_engine_the_admin_api_removed_stays_out_until_added_again(fleet, start_mock):
    _, membership = fleet
    running = await start_mock()
    spec = EngineSpec(url(running))
    member = membership.want("dns:x", spec)
    await wait_until(lambda: member.state == "serving")
    membership.remove(member.id)
    await wait_until(lambda: member.drained.is_set())
    assert membership.want("dns:x", spec) is None  # the next DNS answer does not bring it back
    assert membership.excluded == [spec.url] and membership.members() == []
    again, created = membership.add(spec)
    assert created and again.id == "e1" and sorted(again.sources) == ["admin", "dns:x"]
    await wait_until(lambda: again.state == "serving")
    assert membership.excluded == []


async def test_an_engine_that_comes_back_while_draining_waits_for_the_drain(fleet, start_mock):
    host, membership = fleet
    membership.drain_timeout = 30.0
    running = await start_mock(speedup=1.0)
    spec = EngineSpec(url(running))
    first = membership.want("file:f", spec)
    await wait_until(lambda: first.state == "serving")
    request = GenerateInput("d" * 36, [5, 6, 7], SamplingOptions(max_new_tokens=30, ignore_eos=True))
    async with open_engine_call(host.joined[0].client, request) as call:
        await call.next_batch()
        membership.unwant("file:f", spec.address)
        second = membership.want("file:f", EngineSpec(spec.url, model="renamed"))
        await trio.sleep(0.1)
        assert second.state == "joining" and len(host.joined) == 1  # not probed while the first drains
        while await call.next_batch():
            pass
    await wait_until(lambda: second.state == "serving")
    assert first.drained.is_set() and [e.id for e in host.joined] == ["e0", "e1"]


async def test_an_engine_only_holding_dns_keeps_leaves_when_its_health_checks_fail(fleet, start_mock):
    _, membership = fleet
    running = await start_mock()
    dns, file = SourceState("dns:x", grace=1), SourceState("file:f", grace=0, keep_when_empty=False)
    membership.add_source(dns)
    membership.add_source(file)
    spec = EngineSpec(url(running))
    membership.observe("dns:x", [spec], now=0)
    member = membership.members()[0]
    await wait_until(lambda: member.state == "serving")
    engine = member.engine

    membership.engine_down(engine)  # the last answer confirmed it: it stays (down, health-checked)
    assert member.state == "serving" and not member.leaving
    membership.observe("dns:x", [], now=1)  # the Service has no ready endpoint any more: holding
    membership.observe("file:f", [spec], now=1)
    membership.engine_down(engine)  # the file names it: it stays
    assert not member.leaving
    membership.observe("file:f", [], now=2)
    assert not member.leaving  # the file let go, but DNS holds it
    membership.engine_down(engine)
    assert member.leaving
    await wait_until(lambda: member.drained.is_set())
    changes = membership.observe("dns:x", [spec], now=3)  # back in DNS: it joins again
    assert [s.url for s in changes.added] == [spec.url]
    await wait_until(lambda: any(m.state == "serving" for m in membership.members()))
    assert [m.id for m in membership.members()] == ["e1"]
