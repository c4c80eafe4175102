"""A request's credentials to its tenant: the single --api-key, the file's keys, JWTs with and
without a file; and the metrics labels that stay bounded whoever calls."""

from __future__ import annotations

import hashlib

import pytest
from jwks_server import JwksServer, SigningKey

from trio_direct.tenants.access import MetricLabels, TenantAccess
from trio_direct.tenants.directory import ANONYMOUS, Tenant, parse_tenants
from trio_direct.tenants.jwt_tokens import JwksCache, JwtVerifier


@pytest.fixture
def jwks():
    server = JwksServer()
    yield server
    server.stop()


def directory():
    digest = hashlib.sha256(b"key-alpha").hexdigest()
    return parse_tenants(f"tenants: [{{name: alpha, api_keys_sha256: ['{digest}']}}, {{name: beta}}]")


async def test_each_credential_names_its_tenant_and_anything_else_none(jwks):
    key = SigningKey("k1")
    jwks.keys = [key]
    verifier = JwtVerifier(JwksCache(jwks.url), tenant_claim="tenant")
    access = TenantAccess(directory(), api_key=b"legacy", jwt=verifier)
    assert access.required
    assert await access.identify([b"legacy"]) is ANONYMOUS
    alpha = await access.identify([b"key-alpha"])
    assert alpha is not None and alpha.name == "alpha"
    beta = await access.identify([key.token(tenant="beta").encode()])  # a JWT naming a tenant of the file
    assert beta is not None and beta.name == "beta" and beta.listed
    assert await access.identify([key.token(tenant="gamma").encode()]) is None  # not in the file
    assert await access.identify([b"wrong", b"key-alpha"]) is alpha  # Authorization, then x-api-key
    assert await access.identify([]) is None
    assert await access.identify([b"eyJ.not.a-token"]) is None

    without_file = TenantAccess(jwt=verifier)
    gamma = await without_file.identify([key.token(tenant="gamma").encode()])
    assert gamma is not None and gamma.name == "gamma" and not gamma.listed and gamma.may_use("any-model")
    assert not TenantAccess().required


def test_metrics_labels_stay_bounded():
    labels = MetricLabels(limit=3)
    assert labels(ANONYMOUS) == "anonymous"
    assert labels(Tenant("from-a-token", listed=False)) == "other"
    assert [labels(Tenant(f"t{n}")) for n in range(5)] == ["t0", "t1", "t2", "other", "other"]
    assert labels(Tenant("t1")) == "t1"
