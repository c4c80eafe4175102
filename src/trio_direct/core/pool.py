"""What the request core and the surfaces need of a served model's pool (`core.model_pool.ModelPool`
is one): the core's dispatch sees `ServingPool`, the surfaces and the HTTP layer `PoolView`, so
neither depends on how a pool is built or run."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from trio_direct.config import ServeConfig
from trio_direct.engine.errors import EngineError
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.fleet import Fleet, Worker
from trio_direct.routing.policy import Route
from trio_direct.text.tokenizer import ModelTokenizer

__all__ = ["PoolView", "ServingPool"]


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


class PoolView(ServingPool, Protocol):
    """One served model as the API surfaces see it: its name, engines, text pipeline and limits."""

    fleet: Fleet
    #: The `--chat-template` file's text; None = the model's own templates.
    chat_template_override: str | None
    #: A gpt-oss model: prompts are written in harmony.
    harmony: bool
    #: The model directory's `config.json`.
    model_config: Mapping[str, Any]

    @property
    def supports_images(self) -> bool: ...

    @property
    def tool_call_parser(self) -> str | None: ...

    @property
    def reasoning_parser(self) -> str | None: ...

    def token_text(self, token_id: int) -> str:
        """One token's text (cached), for logprobs."""

    def explain_route(self, token_ids: Sequence[int] | None = None) -> dict:
        """Where a request with `token_ids` would go now, and why (`GET /debug/routing`)."""
