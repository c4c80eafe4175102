"""How much a tenant may call: concurrent requests, requests per minute, tokens per minute.

A request is checked once, when it arrives (`TenantLimiter.begin`): it takes one of its tenant's
concurrent slots, its tenant's tokens of the current minute must not be spent already, and it counts
one request against the minute. A request past any of them is refused (`RateLimited`: 429 with
``Retry-After``, the minute's reset or 1 s for a slot); it is never cut short later. Its tokens
are charged as they are known (`Grant.charge`): the prompt once planned, the completion as it
streams (a few times a second, not per token) and at its end. A stream that passes the limit runs
to its end; the tenant's next request is refused until the minute resets.

Every response of a tenant with limits says where it stands, as OpenAI's API does:
``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests``
and the same three for ``-tokens`` (`Grant.headers`); the reset is a duration such as ``6m0s``,
``1s`` or ``20ms``.

The counts live in a `Counters` (`tenants.counters`): in this process, or in a shared store so
that the limits hold across every frontend. The limiter depends on nothing else.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from trio_direct.tenants.counters import Counters, answer
from trio_direct.tenants.directory import Tenant

__all__ = ["Grant", "Quota", "RateLimited", "TenantLimiter", "format_reset", "rate_limit_headers"]

WINDOW_S = 60.0
#: A slot's lease: a frontend that dies holding slots frees them after this long. A stream renews
#: its lease as it charges its tokens.
SLOT_LEASE_S = 600.0
#: How often a stream's completion tokens are charged while it runs.
CHARGE_INTERVAL_S = 0.5


@dataclass(frozen=True, slots=True)
class Quota:
    """One limit as a response reports it."""

    limit: int
    remaining: int
    reset_s: float


def format_reset(seconds: float) -> bytes:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``20ms``, ``1s``, ``6m0s``."""
    if seconds < 1:
        return b"%dms" % max(0, math.ceil(seconds * 1000))
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return b"%dm%ds" % (minutes, rest) if minutes else b"%ds" % rest


def rate_limit_headers(requests: Quota | None, tokens: Quota | None) -> list[tuple[bytes, bytes]]:
    headers = []
    for name, quota in ((b"requests", requests), (b"tokens", tokens)):
        if quota is not None:
            headers += [
                (b"x-ratelimit-limit-" + name, b"%d" % quota.limit),
                (b"x-ratelimit-remaining-" + name, b"%d" % quota.remaining),
                (b"x-ratelimit-reset-" + name, format_reset(quota.reset_s)),
            ]
    return headers


class RateLimited(Exception):
    """The request is past one of its tenant's limits: answer 429 with `retry_after` and `headers`."""

    def __init__(self, message: str, retry_after: float, headers: list[tuple[bytes, bytes]], limit: str) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.headers = headers
        #: Which limit: "concurrent_requests", "requests_per_minute" or "tokens_per_minute".
        self.limit = limit

    def retry_after_header(self) -> tuple[bytes, bytes]:
        return (b"retry-after", b"%d" % max(1, math.ceil(self.retry_after)))


@dataclass(eq=False, slots=True)
class Grant:
    """One admitted request's account with its tenant's limits, from `begin` to `end`."""

    tenant: Tenant
    holder: str
    limiter: TenantLimiter | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    slot_key: str | None = None
    #: Tokens charged so far.
    charged: int = 0
    #: When the tokens were last charged (`time.monotonic()`), and the slot's lease renewed.
    charged_at: float = 0.0
    renewed_at: float = 0.0

    @property
    def metered(self) -> bool:
        """Whether its tokens count against a limit (else `charge` does nothing)."""
        return self.limiter is not None and self.tenant.limits.tokens_per_minute is not None

    @property
    def tracked(self) -> bool:
        """Whether a running stream must report to it: its tokens are metered, or its slot's lease
        must be renewed."""
        return self.limiter is not None and (self.slot_key is not None or self.metered)

    def charge_due(self, now: float) -> bool:
        if self.metered and now - self.charged_at >= CHARGE_INTERVAL_S:
            return True
        return self.slot_key is not None and now - self.renewed_at >= SLOT_LEASE_S / 2

    async def charge(self, total_tokens: int) -> None:
        """The request has used `total_tokens` so far (prompt + completion): charge what is new."""
        limiter = self.limiter
        if limiter is None:
            return
        now = time.monotonic()
        self.charged_at = now
        new = total_tokens - self.charged
        if new > 0 and self.tenant.limits.tokens_per_minute is not None:
            self.charged = total_tokens
            await answer(limiter.counters.add_to_window(limiter.key(self.tenant, "tokens"), new, WINDOW_S))
        if self.slot_key is not None and now - self.renewed_at >= SLOT_LEASE_S / 2:
            self.renewed_at = now
            limit = self.tenant.limits.concurrent_requests or 1
            await answer(limiter.counters.acquire_slot(self.slot_key, self.holder, limit, SLOT_LEASE_S))

    async def end(self) -> None:
        """The request ended: its slot is free."""
        if self.limiter is not None and self.slot_key is not None:
            key, self.slot_key = self.slot_key, None
            await answer(self.limiter.counters.release_slot(key, self.holder))


class TenantLimiter:
    """Checks and counts each request against its tenant's limits in `counters`."""

    def __init__(self, counters: Counters, *, prefix: str = "trio-direct:tenant:") -> None:
        self.counters = counters
        self._prefix = prefix

    def key(self, tenant: Tenant, what: str) -> str:
        return f"{self._prefix}{tenant.name}:{what}"

    async def begin(self, tenant: Tenant, holder: str) -> Grant:
        """Admit a request of `tenant` (`holder`: a name unique to the request) or raise `RateLimited`."""
        limits = tenant.limits
        if not limits.any:
            return Grant(tenant, holder)
        counters = self.counters
        grant = Grant(tenant, holder, self, renewed_at=time.monotonic())
        requests = tokens = None
        try:
            if limits.concurrent_requests is not None:
                key = self.key(tenant, "concurrent")
                acquired, _ = await answer(counters.acquire_slot(key, holder, limits.concurrent_requests, SLOT_LEASE_S))
                if not acquired:
                    raise RateLimited(
                        f"Tenant {tenant.name!r} is at its limit of {limits.concurrent_requests} concurrent "
                        "requests; retry when one ends.",
                        1.0,
                        [],
                        "concurrent_requests",
                    )
                grant.slot_key = key
            if limits.tokens_per_minute is not None:
                used, reset = await answer(counters.add_to_window(self.key(tenant, "tokens"), 0, WINDOW_S))
                tokens = Quota(limits.tokens_per_minute, max(0, limits.tokens_per_minute - used), reset)
            if limits.requests_per_minute is not None:
                count, reset = await answer(counters.add_to_window(self.key(tenant, "requests"), 1, WINDOW_S))
                requests = Quota(limits.requests_per_minute, max(0, limits.requests_per_minute - count), reset)
                if count > limits.requests_per_minute:
                    raise RateLimited(
                        f"Tenant {tenant.name!r} reached its limit of {limits.requests_per_minute} requests per "
                        f"minute; retry in {math.ceil(reset)}s.",
                        reset,
                        rate_limit_headers(requests, tokens),
                        "requests_per_minute",
                    )
            if tokens is not None and tokens.remaining <= 0:
                raise RateLimited(
                    f"Tenant {tenant.name!r} reached its limit of {tokens.limit} tokens per minute; retry in "
                    f"{math.ceil(tokens.reset_s)}s.",
                    tokens.reset_s,
                    rate_limit_headers(requests, tokens),
                    "tokens_per_minute",
                )
        except BaseException:
            await grant.end()
            raise
        grant.headers = rate_limit_headers(requests, tokens)
        return grant
