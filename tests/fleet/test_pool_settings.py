"""`--served-model-name` and `--model-path`, plain or per model."""

from __future__ import annotations

import pytest

from trio_direct.fleet.fleet import FleetError
from trio_direct.fleet.pool_settings import PoolSettings


def test_without_flags_each_model_keeps_its_name_and_tokenizer():
    settings = PoolSettings.parse([], [])
    assert settings.pool_name("qwen3") == "qwen3"
    overrides = settings.overrides("qwen3", ["llama"])
    assert (overrides.served_model_name, overrides.model_path) == ("qwen3", None)


def test_a_plain_served_name_puts_every_engine_in_one_pool():
    settings = PoolSettings.parse(["chat"], ["/models/qwen3"], kv_cache_block_size=16)
    assert settings.pool_name("qwen3") == settings.pool_name("anything") == "chat"
    overrides = settings.overrides("chat")
    assert (overrides.served_model_name, overrides.model_path, overrides.kv_cache_block_size) == (
        "chat", "/models/qwen3", 16,
    )  # fmt: skip


def test_named_entries_rename_models_and_give_each_its_tokenizer():
    settings = PoolSettings.parse(["Qwen/Qwen3-8B=qwen", "meta/llama=llama"], ["qwen=/m/qwen", "llama=/m/llama"])
    assert settings.pool_name("Qwen/Qwen3-8B") == "qwen" and settings.pool_name("other") == "other"
    assert settings.overrides("qwen", ["llama"]).model_path == "/m/qwen"
    assert settings.overrides("llama", ["qwen"]).model_path == "/m/llama"
    assert settings.overrides("other", ["qwen"]).model_path is None  # its engines' tokenizer path


def test_a_plain_model_path_is_refused_for_a_second_model():
    settings = PoolSettings.parse([], ["/models/qwen3"])
    assert settings.overrides("qwen3", []).model_path == "/models/qwen3"
    with pytest.raises(FleetError, match=r"--model-path /models/qwen3 is the tokenizer of model 'qwen3'.*llama=\.\.\."):
        settings.overrides("llama", ["qwen3"])


@pytest.mark.parametrize(
    ("served", "paths", "message"),
    [
        (["a", "b=c"], [], "either one NAME"),
        ([], ["/p", "a=/q"], "either one PATH"),
        (["a", "b"], [], "2 plain values"),
        (["=b"], [], "write NAME=VALUE"),
        ([], ["a=/p", "a=/q"], "a is given twice"),
    ],
)
def test_contradictions_are_refused_naming_the_flag(served, paths, message):
    with pytest.raises(ValueError, match=message):
        PoolSettings.parse(served, paths)
