"""Tenants from their file, and their limits counted in the in-process counters (sans-IO, a fake clock)."""

from __future__ import annotations

import hashlib
import time

import pytest
import trio
import trio.lowlevel

from trio_direct.tenants.counters import LocalCounters
from trio_direct.tenants.directory import TenantFileError, parse_tenants
from trio_direct.tenants.limiter import SLOT_LEASE_S, RateLimited, TenantLimiter, format_reset


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


FILE = f"""
tenants:
  - name: alpha
    api_keys_sha256: ["{sha("key-a1")}", "{sha("key-a2")}"]
    models: ["*"]
    priority: 0
    weight: 1
    limits: {{concurrent_requests: 2, requests_per_minute: 3, tokens_per_minute: 100}}
  - name: beta
    api_keys_sha256: ["{sha("key-b")}"]
    models: ["small"]
    priority: 1
    weight: 2.5
"""


def test_the_file_names_each_tenant_its_keys_models_class_and_limits():
    directory = parse_tenants(FILE)
    alpha, beta = directory.by_key(b"key-a1"), directory.by_key(b"key-b")
    assert alpha is not None and beta is not None
    assert directory.by_key(b"key-a2") is alpha  # several keys: rotation
    upper = parse_tenants(f"tenants: [{{name: a, api_keys_sha256: ['{sha('k').upper()}']}}]")
    assert upper.by_key(b"k") is not None  # upper-case hex is the same digest
    assert directory.by_key(b"key-a3") is None and directory.by_key(sha("key-a1").encode()) is None
    assert alpha.may_use("anything") and beta.may_use("small") and not beta.may_use("large")
    assert (beta.priority, beta.weight, beta.limits.any) == (1, 2.5, False)
    assert (alpha.limits.concurrent_requests, alpha.limits.requests_per_minute, alpha.limits.tokens_per_minute) == (
        2,
        3,
        100,
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("tenants: [{name: a, api_keys_sha256: [abc]}]", "64"),
        ("tenants: [{name: a, api_keys_sha256: ['" + "g" * 64 + "']}]", "hex"),
        ("tenants: [{name: a, limits: {tokens_per_hour: 5}}]", "tokens_per_hour"),
        ("tenants: [{name: a, colour: red}]", "colour"),
        ("tenants: [{name: a}, {name: a}]", "twice"),
        (
            f"tenants: [{{name: a, api_keys_sha256: ['{sha('k')}']}}, {{name: b, api_keys_sha256: ['{sha('k')}']}}]",
            "also a key of 'a'",
        ),
        ("tenants: [{name: 'a b'}]", "name"),
        ("tenants: [{name: anonymous}]", "reserved"),
        ("tenants: [{name: a, weight: 0}]", "weight"),
        ("tenants: [{name: a, limits: {requests_per_minute: -1}}]", "requests_per_minute"),
        ("[1, 2]", "tenants"),
        ("tenants: {", "not YAML"),
    ],
)
def test_a_malformed_file_says_what_is_wrong(text, complaint):
    with pytest.raises(TenantFileError, match=complaint):
        parse_tenants(text)


class Clock:
    def __init__(self) -> None:
        self.now = 999_980.0  # 20 s into a minute (60 * 16_666 = 999_960)

    def __call__(self) -> float:
        return self.now


async def test_requests_per_minute_are_counted_in_the_minute_and_the_reset_is_announced():
    clock = Clock()
    limiter = TenantLimiter(LocalCounters(clock))
    alpha = parse_tenants(FILE).by_key(b"key-a1")
    assert alpha is not None
    grants = []
    for n in range(3):
        grant = await limiter.begin(alpha, f"r{n}")
        headers = dict(grant.headers)
        assert headers[b"x-ratelimit-limit-requests"] == b"3"
        assert headers[b"x-ratelimit-remaining-requests"] == b"%d" % (2 - n)
        assert headers[b"x-ratelimit-reset-requests"] == b"40s"
        assert headers[b"x-ratelimit-limit-tokens"] == b"100"
        await grant.end()
        grants.append(grant)
    with pytest.raises(RateLimited) as refused:
        await limiter.begin(alpha, "r3")
    assert refused.value.limit == "requests_per_minute" and refused.value.retry_after_header() == (
        b"retry-after",
        b"40",
    )
    clock.now += 40  # the next minute
    grant = await limiter.begin(alpha, "r4")
    assert dict(grant.headers)[b"x-ratelimit-remaining-requests"] == b"2"


async def test_concurrent_requests_hold_slots_until_they_end():
    counters = LocalCounters(Clock())
    limiter = TenantLimiter(counters)
    alpha = parse_tenants(FILE).by_key(b"key-a1")
    assert alpha is not None
    first, second = await limiter.begin(alpha, "r1"), await limiter.begin(alpha, "r2")
    with pytest.raises(RateLimited) as refused:
        await limiter.begin(alpha, "r3")
    assert refused.value.limit == "concurrent_requests"
    await first.end()
    third = await limiter.begin(alpha, "r3")
    await second.end()
    await third.end()
    assert counters.held(limiter.key(alpha, "concurrent")) == 0


async def test_a_request_that_passes_the_tokens_is_not_cut_and_the_next_is_refused_until_the_reset():
    clock = Clock()
    limiter = TenantLimiter(LocalCounters(clock))
    alpha = parse_tenants(FILE).by_key(b"key-a1")
    assert alpha is not None
    grant = await limiter.begin(alpha, "r1")
    assert grant.metered
    await grant.charge(30)  # the prompt
    await grant.charge(80)  # streaming on...
    await grant.charge(150)  # ...past the limit: charging never raises, the stream runs on
    await grant.end()
    with pytest.raises(RateLimited) as refused:
        await limiter.begin(alpha, "r2")
    assert refused.value.limit == "tokens_per_minute"
    assert dict(refused.value.headers)[b"x-ratelimit-remaining-tokens"] == b"0"
    clock.now += 40
    await limiter.begin(alpha, "r3")


async def test_a_tenant_without_limits_costs_no_counting():
    counters = LocalCounters(Clock())
    beta = parse_tenants(FILE).by_key(b"key-b")
    assert beta is not None
    grant = await TenantLimiter(counters).begin(beta, "r1")
    assert grant.headers == [] and not grant.metered
    await grant.charge(10**9)
    assert not counters._windows and not counters._slots


def test_slot_leases_expire_for_a_frontend_that_died_holding_them():
    clock = Clock()
    counters = LocalCounters(clock)
    assert counters.acquire_slot("k", "dead", 1, 30) == (True, 1)
    assert counters.acquire_slot("k", "alive", 1, 30) == (False, 1)
    assert counters.acquire_slot("k", "dead", 1, 30) == (True, 1)  # renewing is taking it again
    clock.now += 31
    assert counters.acquire_slot("k", "alive", 1, 30) == (True, 1)


def test_reset_durations_read_as_openai_writes_them():
    seconds = (0.02, 0.9991, 1, 59.2, 60, 360, 361.5)
    assert [format_reset(s) for s in seconds] == [b"20ms", b"1000ms", b"1s", b"1m0s", b"1m0s", b"6m0s", b"6m2s"]


class AsyncCounters(LocalCounters):
    """The same counts behind coroutines, as a store reached over the network answers."""

    async def add_to_window(self, key: str, amount: int, window_s: float) -> tuple[int, float]:  # type: ignore[override]
        await trio.lowlevel.checkpoint()
        return super().add_to_window(key, amount, window_s)

    async def acquire_slot(self, key: str, holder: str, limit: int, lease_s: float) -> tuple[bool, int]:  # type: ignore[override]
        await trio.lowlevel.checkpoint()
        return super().acquire_slot(key, holder, limit, lease_s)

    async def release_slot(self, key: str, holder: str) -> None:  # type: ignore[override]
        await trio.lowlevel.checkpoint()
        super().release_slot(key, holder)


async def test_the_limiter_takes_counters_that_answer_with_coroutines():
    counters = AsyncCounters(Clock())
    limiter = TenantLimiter(counters)
    alpha = parse_tenants(FILE).by_key(b"key-a1")
    assert alpha is not None
    first, second = await limiter.begin(alpha, "r1"), await limiter.begin(alpha, "r2")
    with pytest.raises(RateLimited):
        await limiter.begin(alpha, "r3")  # two concurrent at most
    await first.charge(120)
    await first.end()
    await second.end()
    with pytest.raises(RateLimited) as refused:
        await limiter.begin(alpha, "r4")
    assert refused.value.limit == "tokens_per_minute"
    assert counters.held(limiter.key(alpha, "concurrent")) == 0


async def test_a_long_stream_renews_its_slots_lease():
    clock = Clock()
    counters = LocalCounters(clock)
    limiter = TenantLimiter(counters)
    tenant = parse_tenants("tenants: [{name: a, limits: {concurrent_requests: 1}}]").by_name("a")
    assert tenant is not None
    grant = await limiter.begin(tenant, "long")
    assert grant.tracked and not grant.metered
    assert not grant.charge_due(time.monotonic())
    renew_at = time.monotonic() + SLOT_LEASE_S / 2
    assert grant.charge_due(renew_at)
    clock.now += SLOT_LEASE_S - 1
    grant.renewed_at -= SLOT_LEASE_S / 2  # as if half a lease went by
    await grant.charge(0)
    clock.now += SLOT_LEASE_S - 1  # the first lease has run out; the renewed one has not
    with pytest.raises(RateLimited):
        await limiter.begin(tenant, "other")
