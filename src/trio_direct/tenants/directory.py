"""Who may call: the tenants of ``--tenants-file``, their keys, models, share and limits (sans-IO).

```yaml
tenants:
  - name: alpha
    api_keys_sha256: ["<lower-case hex SHA-256 of the UTF-8 key>"]
    models: ["*"]            # or served model names
    priority: 0              # priority class: a higher class is admitted first when the fleet is full
    weight: 1                # share of the slots within its class, against the other tenants' weights
    limits: {concurrent_requests: 4, requests_per_minute: 600, tokens_per_minute: 100000}
```

Keys are stored as SHA-256 digests, never in clear: the file can be read by whoever deploys it
without handing out the keys. A tenant lists several so that a key can be rotated (add the new one,
move the clients, remove the old one). A request's key is hashed and looked up by its digest, then
confirmed with `hmac.compare_digest`: what a lookup's timing could reveal is how a guess's *digest*
compares to a stored digest, which says nothing about any key.

A missing limit (or 0) means no limit. Anything wrong (an unknown field, a key that is not 64 hex
digits, in either case; a key given to two tenants, a name used twice) is a `TenantFileError`
naming the entry: the watcher then keeps the last good directory, so a half-written file never
locks every client out.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

__all__ = [
    "ANONYMOUS",
    "Limits",
    "Tenant",
    "TenantDirectory",
    "TenantFileError",
    "key_digest",
    "parse_tenants",
]

_TENANT_FIELDS = frozenset({"name", "api_keys_sha256", "models", "priority", "weight", "limits"})
_LIMIT_FIELDS = ("concurrent_requests", "requests_per_minute", "tokens_per_minute")
_HEX_DIGEST = re.compile(r"[0-9a-fA-F]{64}")
#: A tenant name goes into metrics labels, log lines, trace attributes and counter keys.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Metrics labels of the callers the file does not name (`tenants.access.MetricLabels`).
RESERVED_NAMES = frozenset({"anonymous", "other"})


class TenantFileError(ValueError):
    """A tenants file that cannot be used as it is."""


def key_digest(key: bytes) -> bytes:
    """The SHA-256 digest of an API key as sent (its UTF-8 bytes)."""
    return hashlib.sha256(key).digest()


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's limits; None: no limit on that dimension."""

    concurrent_requests: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return any(
            value is not None for value in (self.concurrent_requests, self.requests_per_minute, self.tokens_per_minute)
        )


@dataclass(frozen=True, slots=True)
class Tenant:
    """One caller of the API: its name, which models it may use, its share and its limits."""

    name: str
    #: The models it may use; None: every model.
    models: frozenset[str] | None = None
    #: Priority class: a waiter of a higher class is admitted before any of a lower one.
    priority: int = 0
    #: Share of the admissions within its priority class, relative to the other tenants'.
    weight: float = 1.0
    limits: Limits = field(default_factory=Limits)
    #: The SHA-256 digests of its API keys.
    key_digests: tuple[bytes, ...] = ()
    #: Named in the tenants file (its name may label metrics); False for a JWT's tenant the file
    #: does not know, and for the anonymous tenant.
    listed: bool = True

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


#: Who calls when there are no tenants (no key at all, or the single ``--api-key``): every model,
#: no limits, weight 1.
ANONYMOUS = Tenant("anonymous", listed=False)


class TenantDirectory:
    """The tenants of one version of the file, and the lookup of a key's tenant."""

    def __init__(self, tenants: Iterable[Tenant] = ()) -> None:
        self.tenants: dict[str, Tenant] = {}
        self._by_digest: dict[bytes, Tenant] = {}
        for tenant in tenants:
            if tenant.name in self.tenants:
                raise TenantFileError(f"tenant {tenant.name!r} is listed twice")
            self.tenants[tenant.name] = tenant
            for digest in tenant.key_digests:
                other = self._by_digest.get(digest)
                if other is not None:
                    raise TenantFileError(f"a key of tenant {tenant.name!r} is also a key of {other.name!r}")
                self._by_digest[digest] = tenant

    def __len__(self) -> int:
        return len(self.tenants)

    def by_key(self, key: bytes) -> Tenant | None:
        """The tenant `key` belongs to, or None (see the module docstring on timing)."""
        digest = key_digest(key)
        tenant = self._by_digest.get(digest)
        if tenant is None:
            return None
        return tenant if any(hmac.compare_digest(digest, known) for known in tenant.key_digests) else None

    def by_name(self, name: str) -> Tenant | None:
        return self.tenants.get(name)


def parse_tenants(text: str) -> TenantDirectory:
    """The directory a tenants file describes (YAML or JSON); `TenantFileError` says what is wrong."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TenantFileError(f"not YAML: {' '.join(str(error).split())}") from None
    if not isinstance(document, dict) or "tenants" not in document:
        raise TenantFileError('expected a mapping with a "tenants" list')
    entries = document["tenants"]
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise TenantFileError('"tenants" must be a list')
    tenants = []
    for position, entry in enumerate(entries):
        try:
            tenants.append(parse_tenant(entry))
        except TenantFileError as error:
            raise TenantFileError(f"tenant {position}: {error}") from None
    return TenantDirectory(tenants)


def parse_tenant(entry: Any) -> Tenant:
    if not isinstance(entry, Mapping):
        raise TenantFileError("expected a mapping")
    unknown = set(entry) - _TENANT_FIELDS
    if unknown:
        raise TenantFileError(f"unknown field(s) {sorted(map(str, unknown))}; known: {sorted(_TENANT_FIELDS)}")
    name = entry.get("name")
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise TenantFileError("'name' must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if name in RESERVED_NAMES:
        raise TenantFileError(f"{name!r} is reserved (metrics label callers outside the file with it)")
    keys = entry.get("api_keys_sha256", [])
    if not isinstance(keys, list) or not all(isinstance(key, str) and _HEX_DIGEST.fullmatch(key) for key in keys):
        raise TenantFileError(f"{name}: 'api_keys_sha256' must be a list of hex SHA-256 digests (64 digits)")
    models = entry.get("models", ["*"])
    if not isinstance(models, list) or not all(isinstance(model, str) for model in models):
        raise TenantFileError(f"{name}: 'models' must be a list of served model names, or [\"*\"]")
    priority = entry.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TenantFileError(f"{name}: 'priority' must be an integer")
    weight = entry.get("weight", 1)
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0 < weight < 1e6:
        raise TenantFileError(f"{name}: 'weight' must be a number above 0")
    return Tenant(
        name=name,
        models=None if "*" in models else frozenset(models),
        priority=priority,
        weight=float(weight),
        limits=_parse_limits(name, entry.get("limits") or {}),
        key_digests=tuple(bytes.fromhex(key) for key in keys),
    )


def _parse_limits(name: str, limits: Any) -> Limits:
    if not isinstance(limits, Mapping):
        raise TenantFileError(f"{name}: 'limits' must be a mapping")
    unknown = set(limits) - set(_LIMIT_FIELDS)
    if unknown:
        raise TenantFileError(f"{name}: unknown limit(s) {sorted(map(str, unknown))}; known: {list(_LIMIT_FIELDS)}")
    values: dict[str, int | None] = {}
    for key in _LIMIT_FIELDS:
        value = limits.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise TenantFileError(f"{name}: limit {key!r} must be a whole number >= 0 (0 or absent: no limit)")
        values[key] = value or None
    return Limits(**values)
