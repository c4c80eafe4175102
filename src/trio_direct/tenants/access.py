"""Who is calling: a request's credentials to its tenant, and that tenant for the rest of the request.

The credentials are the ``Authorization: Bearer`` token, or the route's own key header (Anthropic's
``x-api-key``). Checked in this order:

1. ``--api-key``: the anonymous tenant (every model, no limits), as before tenants existed;
2. a key of ``--tenants-file`` (by its SHA-256): that tenant;
3. with ``--jwt-jwks-url``, a JWT (`tenants.jwt_tokens`): the tenant its claim names. With a tenants
   file, it must name a tenant of the file (whose models, share and limits apply); without one, any
   name is a tenant of its own with every model and no limits.

Anything else is a 401. With none of the three configured, the API is open and every request is
the anonymous tenant's.

The directory is replaced whole when the file changes (`replace`): a request holds the `Tenant` it
was admitted as, so a stream opened with a key that a new file no longer lists runs to its end.
`CURRENT` carries the request's tenant to the code that resolves a model (a model the tenant may
not use is answered 404 as if it did not exist) and lists models.
"""

from __future__ import annotations

import hmac
import logging
from contextvars import ContextVar

from trio_direct.tenants.directory import ANONYMOUS, Tenant, TenantDirectory
from trio_direct.tenants.jwt_tokens import JwtVerifier, TokenRejected, looks_like_jwt

__all__ = ["CURRENT", "MetricLabels", "TenantAccess", "may_use", "owner"]

log = logging.getLogger(__name__)

#: The tenant of the request this task serves (the anonymous one outside a request).
CURRENT: ContextVar[Tenant] = ContextVar("trio_direct_tenant", default=ANONYMOUS)


def owner() -> str:
    """Whose stored state (responses, conversations) the current request reads and writes: its
    tenant's name, or "" for the anonymous tenant. Another tenant never finds it, as if it did not
    exist."""
    tenant = CURRENT.get()
    return "" if tenant is ANONYMOUS else tenant.name


def may_use(model: str) -> bool:
    """Whether the current request's tenant may use `model`."""
    return CURRENT.get().may_use(model)


class TenantAccess:
    """The credentials the server accepts and the tenants they stand for."""

    def __init__(
        self,
        directory: TenantDirectory | None = None,
        *,
        api_key: bytes | None = None,
        jwt: JwtVerifier | None = None,
    ) -> None:
        self.directory = directory
        self.api_key = api_key
        self.jwt = jwt

    @property
    def required(self) -> bool:
        """Whether requests must carry credentials at all."""
        return self.directory is not None or self.api_key is not None or self.jwt is not None

    def replace(self, directory: TenantDirectory) -> None:
        self.directory = directory

    async def identify(self, tokens: list[bytes]) -> Tenant | None:
        """The tenant of the first of `tokens` that is a valid credential; None: answer 401."""
        for token in tokens:
            if self.api_key is not None and hmac.compare_digest(token, self.api_key):
                return ANONYMOUS
            directory = self.directory
            if directory is not None:
                tenant = directory.by_key(token)
                if tenant is not None:
                    return tenant
            if self.jwt is not None and looks_like_jwt(token):
                try:
                    name = await self.jwt.tenant_name(token)
                except TokenRejected as error:
                    log.info("bearer token refused: %s", error)
                    continue
                if directory is None:
                    return Tenant(name, listed=False)
                tenant = directory.by_name(name)
                if tenant is not None:
                    return tenant
                log.info("bearer token refused: tenant %r is not in the tenants file", name)
        return None


class MetricLabels:
    """A tenant's metrics label, with a bounded number of distinct values: a tenant of the file is
    labelled by its name (up to `limit` names), the anonymous tenant ``anonymous``, anyone else
    (tenants named only by tokens, names past the bound) ``other``."""

    def __init__(self, limit: int = 100) -> None:
        self.limit = limit
        self._names: set[str] = set()

    def __call__(self, tenant: Tenant) -> str:
        if tenant is ANONYMOUS:
            return ANONYMOUS.name
        name = tenant.name
        if not tenant.listed:
            return "other"
        if name in self._names:
            return name
        if len(self._names) < self.limit:
            self._names.add(name)
            return name
        return "other"
