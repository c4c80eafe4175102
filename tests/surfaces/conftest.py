"""A model pool over the tiny model and stand-in engines: enough to plan (not run) requests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from trio_direct.config import ServeConfig
from trio_direct.core.model_pool import ModelPool
from trio_direct.fleet.fleet import Engine, Fleet, FleetModel
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.text.tokenizer import ModelTokenizer


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> ModelTokenizer:
    return ModelTokenizer.from_directory(tiny_model)


@pytest.fixture
def make_pool(tokenizer):
    """`make_pool(images=True, embedding=False, template=None, context_length=4096, **config)`: a
    `ModelPool` to plan with."""

    def make(
        *,
        images: bool = False,
        embedding: bool = False,
        template: str | None = None,
        context_length: int | None = 4096,
        **config,
    ) -> ModelPool:
        card = SimpleNamespace(role="aggregated", dp_size=1, url="grpc://e0:1")
        engine = Engine("e0", card, client=SimpleNamespace(api="native", name="e0"))  # type: ignore[arg-type]
        model = FleetModel(
            served_model_name="m", model_path="m", tokenizer_path="m", block_size=None, context_length=context_length,
            tool_call_parser=None, reasoning_parser=None, is_embedding=embedding, supports_images=images,
        )  # fmt: skip
        settings = replace(ServeConfig(), **config)
        return ModelPool(settings, Fleet([engine], model), RoutingPolicy(), tokenizer=tokenizer,
                         chat_template_override=template)  # fmt: skip

    return make
