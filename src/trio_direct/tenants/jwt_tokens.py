"""JWT bearer tokens as credentials: the signature checked against a JWKS, the tenant from a claim.

``--jwt-jwks-url`` names the identity provider's key set (its ``jwks_uri``). A token is accepted
when its header's ``kid`` names a key of the set, its signature verifies with that key and that
key's algorithm only (a token cannot choose a weaker one, nor ``none``), it has an ``exp`` in the
future, its ``nbf`` (if any) is past, and its ``iss`` and ``aud`` are ``--jwt-issuer`` and
``--jwt-audience`` when those are set. PyJWT does the cryptography.

The key set is fetched once at start and cached; a token whose ``kid`` the cache does not know
makes it fetch the set again (a provider that rotates its keys publishes the new one before it
signs with it). Those fetches draw on a small budget, `REFRESH_BURST` at once and one more every
`REFRESH_MIN_S` seconds, so that a new key is seen at once while tokens with made-up ``kid`` s
cannot turn the frontend into a client flooding the provider. The cache is also refreshed every
`MAX_AGE_S` seconds, so that a key the provider withdrew stops being accepted. The fetch is an
async HTTP call (httpx on trio): it never blocks the event loop, and concurrent requests with the
same unknown ``kid`` share one fetch.

PyJWT and httpx are imported when a `JwksCache` is made (at start-up, with ``--jwt-jwks-url``),
not with this module: a frontend without JWTs does not pay their ~100 ms import at every start.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    import jwt

__all__ = ["JwksCache", "JwtVerifier", "TokenRejected", "fetch_jwks", "looks_like_jwt"]

log = logging.getLogger(__name__)

REFRESH_MIN_S = 10.0
REFRESH_BURST = 5
MAX_AGE_S = 300.0
FETCH_TIMEOUT_S = 5.0
#: Clock skew tolerated on exp and nbf.
LEEWAY_S = 5.0


class TokenRejected(Exception):
    """The token is not acceptable; the message says why (for the log, not the client)."""


def looks_like_jwt(token: bytes) -> bool:
    return token.count(b".") == 2 and token[:2] == b"ey"


async def fetch_jwks(url: str) -> dict[str, Any]:
    """GET the key set (a JSON Web Key Set document)."""
    import httpx

    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S) as client:
        response = await client.get(url, headers={"accept": "application/json"})
        response.raise_for_status()
        document = response.json()
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document (no 'keys' list)")
    return document


class JwksCache:
    """The keys of a JWKS by ``kid``, fetched again on an unknown ``kid`` (rate-limited) and when stale."""

    def __init__(
        self,
        url: str,
        *,
        fetch: Callable[[str], Awaitable[dict[str, Any]]] = fetch_jwks,
        refresh_min_s: float = REFRESH_MIN_S,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        import httpx  # noqa: F401  (imported here, at start-up, not on the event loop at the first fetch)
        import jwt  # noqa: F401

        self.url = url
        self._fetch = fetch
        self._refresh_min_s = refresh_min_s
        self._max_age_s = max_age_s
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = -float("inf")
        self._lock = trio.Lock()
        #: Fetches an unknown kid may still cause now (refilled one per `refresh_min_s`).
        self._credit = float(REFRESH_BURST)
        self._credited_at = time.monotonic()

    async def key(self, kid: str) -> jwt.PyJWK | None:
        now = time.monotonic()
        key = self._keys.get(kid)
        stale = now - self._fetched_at >= self._max_age_s
        if key is not None and not stale:
            return key
        if stale or self._spend(now):
            await self.refresh(since=self._fetched_at)
        return self._keys.get(kid)

    def _spend(self, now: float) -> bool:
        """Whether an unknown kid may cause a fetch now (the budget of the module docstring)."""
        rate = 1.0 / self._refresh_min_s if self._refresh_min_s > 0 else float("inf")
        self._credit = min(float(REFRESH_BURST), self._credit + (now - self._credited_at) * rate)
        self._credited_at = now
        if self._credit < 1:
            return False
        self._credit -= 1
        return True

    async def refresh(self, since: float | None = None) -> None:
        """Fetch the set again (unless another task did since `since`); a failure keeps the old keys."""
        import httpx
        import jwt

        async with self._lock:
            if since is not None and self._fetched_at != since:
                return  # fetched while this task waited for the lock
            self._fetched_at = time.monotonic()
            try:
                document = await self._fetch(self.url)
            except (httpx.HTTPError, ValueError) as error:
                log.warning(
                    "cannot fetch the JWKS at %s: %s; keeping %d known key(s)", self.url, error, len(self._keys)
                )
                return
            keys = {}
            for entry in document["keys"]:
                if not isinstance(entry, dict) or "kid" not in entry or entry.get("use", "sig") != "sig":
                    continue
                try:
                    keys[str(entry["kid"])] = jwt.PyJWK(entry)
                except jwt.PyJWTError as error:
                    log.warning("JWKS key %r is unusable: %s", entry.get("kid"), error)
            self._keys = keys


class JwtVerifier:
    """Checks a bearer JWT and returns the tenant name its claim carries."""

    def __init__(
        self,
        keys: JwksCache,
        *,
        issuer: str | None = None,
        audience: str | None = None,
        tenant_claim: str = "sub",
    ) -> None:
        self.keys = keys
        self.issuer = issuer
        self.audience = audience
        self.tenant_claim = tenant_claim

    async def tenant_name(self, token: bytes) -> str:
        """The token's tenant, or `TokenRejected`."""
        import jwt

        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as error:
            raise TokenRejected(f"malformed token: {error}") from None
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise TokenRejected("the token names no key (no 'kid')")
        key = await self.keys.key(kid)
        if key is None:
            raise TokenRejected(f"unknown key {kid!r}")
        options: Any = {"require": ["exp"], "verify_aud": self.audience is not None}
        if self.issuer is not None:
            options["require"].append("iss")
        try:
            claims = jwt.decode(
                token,
                key=key.key,
                algorithms=[key.algorithm_name],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options=options,
            )
        except jwt.PyJWTError as error:
            raise TokenRejected(str(error)) from None
        name = claims.get(self.tenant_claim)
        if not isinstance(name, str) or not name:
            raise TokenRejected(f"no {self.tenant_claim!r} claim naming the tenant")
        return name
