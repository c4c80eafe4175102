"""The process's serving state: its settings, the served models' pools, the fleet's membership and shutdown.

The pools change at runtime: a pool opens when the first engine of a new model joins and closes when
its last engine left (`trio_direct.frontend.runtime.FleetPools`); `membership` is every engine of
every source. The HTTP layer and the surfaces read it; `trio_direct.frontend` builds and runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trio_direct.config import ServeConfig
from trio_direct.core import errors
from trio_direct.core.model_pool import ModelPool
from trio_direct.core.render import StreamCutter
from trio_direct.fleet.membership import Member, Membership
from trio_direct.fleet.shared_admin import SharedAdmin
from trio_direct.state.memory import MemoryStore
from trio_direct.state.store import (
    StateStore,
    StoreSettings,
)
from trio_direct.tenants import access as tenant_access

log = logging.getLogger(__name__)


class Frontend:
    """The process's serving state: settings, the served models' pools, and shutdown.

    The pools change at runtime: a pool opens when the first engine of a new model joins and closes
    when its last engine left (`FleetPools`); `membership` is every engine of every source.
    """

    def __init__(
        self,
        config: ServeConfig,
        pools: Sequence[ModelPool] = (),
        membership: Membership | None = None,
        state: StateStore | None = None,
    ) -> None:
        self.config = config
        self._pools = {pool.name: pool for pool in pools}
        self.membership = membership
        #: Ends every open response at the drain deadline, each with its surface's error event.
        self.cutter = StreamCutter()
        #: Set once a shutdown began: readiness (`/health`) answers 503 so load balancers move on.
        self.draining = False
        #: The admin API's engine changes, recorded in `state` and followed from it (set by `run_frontend`).
        self.shared_admin: SharedAdmin | None = None
        #: What this frontend shares with every other on the same `--state-store`: stored responses,
        #: conversations, the admin API's engines (`state.store`).
        self.state: StateStore = state if state is not None else MemoryStore(store_settings(config))

    def pools(self) -> list[ModelPool]:
        return list(self._pools.values())

    def pool(self, model: str) -> ModelPool:
        """The pool serving `model`; an OpenAI 404 for a model nobody serves, or one the current
        request's tenant may not use."""
        pool = self._pools.get(model)
        if pool is None or not tenant_access.may_use(model):  # a model a tenant may not use: as if absent
            if not self._pools:  # nothing is served yet (or any more): worth retrying, not a wrong name
                raise errors.service_unavailable("No engine is serving yet; retry shortly.")
            raise errors.model_not_found(model)
        return pool

    def pool_or_only(self, model: str | None) -> ModelPool:
        """`pool(model)`; without a model, the one model served (a 400 naming them when several are)."""
        if model is not None:
            return self.pool(model)
        if len(self._pools) == 1:
            return self.pool(next(iter(self._pools)))  # the tenant's permission still applies
        if not self._pools:
            raise errors.service_unavailable("No engine is serving yet; retry shortly.")
        names = ", ".join(sorted(self._pools))
        raise errors.invalid_request(
            f"'model' is required: this server serves several models ({names}).", param="model"
        )

    def find_pool(self, model: str) -> ModelPool | None:
        return self._pools.get(model)

    def add_pool(self, pool: ModelPool) -> None:
        self._pools[pool.name] = pool

    def remove_pool(self, pool: ModelPool) -> None:
        if self._pools.get(pool.name) is pool:
            del self._pools[pool.name]

    def healthy(self) -> bool:
        """Ready: not draining, and some model has an engine that can take requests."""
        return not self.draining and any(pool.healthy() for pool in self._pools.values())

    def waiting_engines(self) -> list[tuple[str, str, str]]:
        """(model or "", id, URL) of engines in no pool yet: not up, or refused (for `/metrics`)."""
        if self.membership is None:
            return []
        return [(m.model or "", m.id, m.url) for m in self.membership.waiting()]

    def engine_report(self) -> list[dict]:
        """Every engine as `GET /admin/engines` shows it."""
        if self.membership is None:
            return []
        return [self._report(member) for member in self.membership.members()]

    def _report(self, member: Member) -> dict:
        engine = member.engine
        pool = self._pools.get(member.pool) if member.pool is not None else None
        in_flight, kv_blocks = 0, None
        if engine is not None:
            client_channel = getattr(engine.client, "channel", None)
            in_flight = client_channel.streams_in_flight if client_channel is not None else 0
            if pool is not None and pool.routing.kv is not None and pool.routing.kv.index is not None:
                kv_blocks = pool.routing.kv.held_blocks(engine.id, engine.card)
        return {
            "id": member.id,
            "url": member.url,
            "sources": sorted(member.sources),
            "model": member.model,
            "role": engine.card.role if engine is not None else member.spec.role,
            "state": member.state,
            "healthy": bool(engine is not None and engine.healthy and member.state == "serving"),
            "in_flight": in_flight,
            "kv_index_blocks": kv_blocks,
            "reason": member.reason or None,
        }


def store_settings(config: ServeConfig) -> StoreSettings:
    """The state store's settings from the `--state-store-*` flags (and, for `memory`, the bounds
    of `--responses-store-max-items` and `--responses-store-max-bytes`)."""
    return StoreSettings(
        ttl=config.state_store_ttl,
        max_entry_bytes=config.state_store_max_entry_bytes,
        timeout=config.state_store_timeout,
        memory_max_bytes=config.responses_store_max_bytes,
        memory_max_entries=config.responses_store_max_items,
    )
