"""What the request core needs of a served model's pool (`core.model_pool.ModelPool` is one)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trio_direct.config import ServeConfig
from trio_direct.engine.errors import EngineError
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.fleet import Worker
from trio_direct.routing.policy import Route
from trio_direct.text.tokenizer import ModelTokenizer

__all__ = ["ServingPool"]


class ServingPool(Protocol):
    """One model's settings, tokenizer and routing, as planning, admission and dispatch use them."""

    config: ServeConfig
    tokenizer: ModelTokenizer
    #: The frontend's `core.watch.StreamWatch` (SSE keep-alives, hung engines), or None.
    watch: Any

    @property
    def name(self) -> str: ...

    @property
    def context_length(self) -> int | None: ...

    @property
    def is_embedding(self) -> bool:
        """The model is an embedding model: it serves `Embed`, never `Generate`."""

    def choose_route(
        self, token_ids: Sequence[int] = (), request_id: str | None = None, session_key: str | None = None
    ) -> Route[Worker]:
        """Where a request goes; raises `NoWorkerAvailable` when nothing healthy can serve it."""

    def first_token(self, request_id: str) -> None: ...

    def release(self, request_id: str) -> None: ...

    def engine_unreachable(self, client: EngineClient, error: EngineError) -> None: ...

    def headroom(self) -> int:
        """Requests the engines take before every one is busy (`--engine-busy-threshold`; 0: all busy)."""

    def on_load_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every round of engine load polls."""
