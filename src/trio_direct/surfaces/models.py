"""`GET /v1/models` and `GET /v1/models/{model}`: the models this frontend serves (to the caller's
tenant: those it may not use are not listed, and are not found)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from trio_direct.openai import chat_bodies
from trio_direct.tenants.access import may_use

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView
    from trio_direct.http.exchange import Exchange

__all__ = ["list_models", "retrieve_model"]


async def list_models(exchange: Exchange) -> None:
    frontend = exchange.frontend
    created = int(time.time())
    cards = [_card(pool, created) for pool in frontend.pools() if may_use(pool.name)]
    await exchange.json(200, chat_bodies.models_list(cards))


async def retrieve_model(exchange: Exchange) -> None:
    pool = exchange.frontend.pool(exchange.params["model"])
    card = _card(pool, int(time.time()))
    await exchange.json(200, chat_bodies.model_body(card))


def _card(pool: PoolView, created: int) -> chat_bodies.ModelCard:
    """vLLM's model card: the context length, and the engines' model path as `root`."""
    return chat_bodies.model_card(
        pool.name, created, max_model_len=pool.context_length, root=pool.fleet.model.model_path
    )
