"""Tenants: who may call, how much, and a fair share of the fleet when it is full.

Sans-IO cores: `directory` (the tenants file, keys by SHA-256, models), `limiter` (limits counted in
a `counters.Counters`, and the ``x-ratelimit-*`` headers), `fair_queue` (the admission line's order
between tenants, used by `core.admission`), `access` (credentials to a tenant). Thin I/O:
`jwt_tokens` (JWTs checked against a fetched JWKS) and `service` (the file watch, the pieces wired
from the flags).
"""
