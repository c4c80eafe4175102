"""The admin API (``--admin-api-key``): the fleet's engines, listed, added and removed at runtime.

- ``GET /admin/engines``: every engine: id, URL, sources, model, role, state (``joining``,
  ``refused``, ``serving``, ``draining``), health, in-flight requests, KV index size, and why it is
  not serving; plus ``excluded``, the URLs removed here that no source brings back.
- ``POST /admin/engines`` ``{"url": ..., "model"?: ..., "role"?: ...}``: the engine joins like a
  discovered one (probed, checked against its model's pool, then routable); 201 with its entry
  (``joining``), 200 when it was known already.
- ``DELETE /admin/engines/{id}``: the engine drains and leaves; sources do not bring it back until it
  is added here again. 200 with its entry (``draining``).

Changes are recorded in the state store and followed by every frontend sharing it (every worker,
every replica: `fleet.shared_admin`); while the store is down they fail with 503 and change nothing.

The HTTP layer checks the key (``Authorization: Bearer KEY``, in constant time) and answers 404 for
these paths when no key is set; errors are in OpenAI's envelope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from trio_direct.core import errors
from trio_direct.fleet.engine_list import EngineListError, parse_engine_spec
from trio_direct.state.store import StoreUnavailable
from trio_direct.surfaces.response_store import unavailable

if TYPE_CHECKING:
    from trio_direct.fleet.membership import Membership
    from trio_direct.http.exchange import Exchange

__all__ = ["add_engine", "list_engines", "remove_engine"]


def _membership(exchange: Exchange) -> Membership:
    membership = exchange.frontend.membership
    if membership is None:
        raise errors.service_unavailable("The fleet is not running.")
    return membership


async def list_engines(exchange: Exchange) -> None:
    frontend = exchange.frontend
    body = {"object": "list", "data": frontend.engine_report(), "excluded": _membership(exchange).excluded}
    await exchange.json(200, msgspec.json.encode(body))


async def add_engine(exchange: Exchange) -> None:
    membership = _membership(exchange)
    try:
        fields = msgspec.json.decode(exchange.body)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
        raise errors.invalid_request(
            'The body must be JSON: {"url": "grpc://HOST:PORT", "model"?: ..., "role"?: ...}.'
        ) from None
    except UnicodeDecodeError:  # msgspec decodes strings as UTF-8 and lets this through
        raise errors.invalid_request("The request body is not valid UTF-8.") from None
    if not isinstance(fields, dict):
        raise errors.invalid_request('The body must be a JSON object: {"url": "grpc://HOST:PORT"}.')
    try:
        spec = parse_engine_spec(fields)
    except EngineListError as error:
        param = next((key for key in ("url", "model", "role") if key in str(error)), None)
        raise errors.invalid_request(f"Cannot add this engine: {error}.", param=param) from None
    shared = exchange.frontend.shared_admin
    try:
        member, created = await shared.add(spec) if shared is not None else membership.add(spec)
    except StoreUnavailable as error:
        raise unavailable(error) from None
    report = next(entry for entry in exchange.frontend.engine_report() if entry["id"] == member.id)
    await exchange.json(201 if created else 200, msgspec.json.encode(report))


async def remove_engine(exchange: Exchange) -> None:
    engine_id = exchange.params["id"]
    membership = _membership(exchange)
    shared = exchange.frontend.shared_admin
    try:
        member = await shared.remove(engine_id) if shared is not None else membership.remove(engine_id)
    except StoreUnavailable as error:
        raise unavailable(error) from None
    if member is None:
        raise errors.not_found(f"No engine {engine_id!r} (GET /admin/engines lists them).")
    report = next((e for e in exchange.frontend.engine_report() if e["id"] == member.id), None)
    await exchange.json(200, msgspec.json.encode(report or {"id": member.id, "url": member.url, "state": "gone"}))
