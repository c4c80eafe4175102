"""JWT bearer tokens checked against keys served from a JWKS endpoint on loopback."""

from __future__ import annotations

import jwt
import pytest
from jwks_server import JwksServer, SigningKey

from trio_direct.tenants.jwt_tokens import REFRESH_BURST, JwksCache, JwtVerifier, TokenRejected


@pytest.fixture
def jwks():
    server = JwksServer()
    yield server
    server.stop()


def verifier(jwks: JwksServer, **cache) -> JwtVerifier:
    return JwtVerifier(
        JwksCache(jwks.url, **cache), issuer="https://issuer.test", audience="trio-direct", tenant_claim="tenant"
    )


async def test_a_good_token_names_its_tenant_and_bad_ones_are_refused_each_for_its_reason(jwks):
    good, rsa = SigningKey("k1"), SigningKey("k-rsa", "RSA")
    jwks.keys = [good, rsa]
    check = verifier(jwks, refresh_min_s=0)
    assert await check.tenant_name(good.token(tenant="alpha").encode()) == "alpha"
    assert await check.tenant_name(rsa.token(tenant="beta").encode()) == "beta"
    impostor = SigningKey("k1")  # the same kid, another private key
    refused = {
        "expired": good.token(tenant="alpha", lifetime=-60),
        "not yet valid": good.token(tenant="alpha", not_before=120),
        "wrong audience": good.token(tenant="alpha", aud="someone-else"),
        "wrong issuer": good.token(tenant="alpha", iss="https://evil.test"),
        "wrong key": impostor.token(tenant="alpha"),
        "unknown kid": SigningKey("k9").token(tenant="alpha"),
        "no tenant claim": good.token(sub="alpha"),
        "no expiry": jwt.encode(
            {"tenant": "alpha", "iss": "https://issuer.test", "aud": "trio-direct"},
            good.private,
            "ES256",
            headers={"kid": "k1"},
        ),
    }
    for reason, token in refused.items():
        with pytest.raises(TokenRejected):
            await check.tenant_name(token.encode())
            pytest.fail(f"a token with {reason} was accepted")


async def test_a_token_cannot_pick_its_algorithm(jwks):
    key = SigningKey("k1")
    jwks.keys = [key]
    unsigned = jwt.encode({"tenant": "alpha", "exp": 2**31}, None, algorithm="none", headers={"kid": "k1"})  # type: ignore[arg-type]  # PyJWT takes no key for "none"; its types demand one
    with pytest.raises(TokenRejected):
        await verifier(jwks).tenant_name(unsigned.encode())


async def test_a_new_kid_is_accepted_once_the_jwks_has_it_and_unknown_kids_do_not_flood_the_provider(jwks):
    old, new = SigningKey("2026-01"), SigningKey("2026-02")
    jwks.keys = [old]
    check = verifier(jwks, refresh_min_s=60)
    await check.keys.refresh()
    assert jwks.fetches == 1
    assert await check.tenant_name(old.token(tenant="alpha").encode()) == "alpha"
    assert jwks.fetches == 1  # cached
    with pytest.raises(TokenRejected, match="unknown key"):
        await check.tenant_name(new.token(tenant="alpha").encode())
    assert jwks.fetches == 2  # an unknown kid: asked again
    jwks.keys = [old, new]  # the provider rotates: publishes the new key first
    assert await check.tenant_name(new.token(tenant="alpha").encode()) == "alpha"  # seen at once
    assert jwks.fetches == 3
    for n in range(20):  # made-up kids: a few fetches, then none until the budget refills
        with pytest.raises(TokenRejected):
            await check.tenant_name(old.token(kid=f"made-up-{n}", tenant="x").encode())
    assert jwks.fetches == 3 + (REFRESH_BURST - 2)


async def test_an_unreachable_jwks_keeps_the_keys_it_had(jwks):
    key = SigningKey("k1")
    jwks.keys = [key]
    check = verifier(jwks, refresh_min_s=0, max_age_s=0)
    await check.keys.refresh()
    jwks.stop()
    check.keys.url = jwks.url  # nothing listens there any more
    assert await check.tenant_name(key.token(tenant="alpha").encode()) == "alpha"
    jwks.stop = lambda: None
