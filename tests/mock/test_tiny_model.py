"""The generated tiny model behaves like a real HF ChatML model directory."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from trio_direct.mock.tiny_model import (
    EOS_TOKEN_ID,
    default_tiny_model_dir,
    ensure_tiny_model,
)

EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
)
FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-chatml")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _render(model_dir: Path, messages: list[dict], add_generation_prompt: bool = True) -> str:
    # The environment HF transformers renders chat templates with.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(_json(model_dir / "tokenizer_config.json")["chat_template"])
    return template.render(messages=messages, add_generation_prompt=add_generation_prompt)


def test_directory_has_the_hf_files(model_dir: Path) -> None:
    assert {p.name for p in model_dir.iterdir()} >= FILES


def test_special_tokens_are_ids_0_1_2(tokenizer: Tokenizer) -> None:
    ids = [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")]
    assert ids == [0, 1, 2]
    assert 300 < tokenizer.get_vocab_size() <= 1024


@pytest.mark.parametrize(
    "text",
    [
        "Hello world",
        "The quick fox jumps over 12 lazy dogs.\n\n",
        "  spaced  out ",
        "héllo wörld 🌍",
    ],
)
def test_text_round_trips(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_chat_template_renders_chatml(model_dir: Path, tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hello world"},
    ]
    prompt = _render(model_dir, messages)
    assert prompt == EXPECTED_PROMPT

    ids = tokenizer.encode(prompt).ids
    assert ids[0] == 1  # <|im_start|> is one token, not its characters
    assert ids.count(EOS_TOKEN_ID) == 2
    assert tokenizer.decode(ids, skip_special_tokens=False) == prompt


def test_chat_template_accepts_content_parts(model_dir: Path) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hello world"}]}]
    assert _render(model_dir, messages, add_generation_prompt=False) == ("<|im_start|>user\nHello world<|im_end|>\n")


def test_configs_agree_with_the_tokenizer(model_dir: Path, tokenizer: Tokenizer) -> None:
    config = _json(model_dir / "config.json")
    tokenizer_config = _json(model_dir / "tokenizer_config.json")
    assert config["model_type"] == "qwen2"
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert _json(model_dir / "generation_config.json")["eos_token_id"] == EOS_TOKEN_ID
    assert tokenizer.token_to_id(tokenizer_config["eos_token"]) == EOS_TOKEN_ID
    assert tokenizer.token_to_id(tokenizer_config["pad_token"]) == 0
    assert tokenizer_config["bos_token"] is None
    assert _json(model_dir / "special_tokens_map.json")["eos_token"] == "<|im_end|>"


def test_generation_is_deterministic(tmp_path: Path, model_dir: Path) -> None:
    again = ensure_tiny_model(tmp_path / "again")
    for name in FILES:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name


def test_existing_directory_is_reused(model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    inode = model_dir.stat().st_ino
    assert ensure_tiny_model(model_dir) == model_dir
    assert model_dir.stat().st_ino == inode
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_concurrent_callers_get_one_complete_directory(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: ensure_tiny_model(target), range(4)))
    assert results == [target] * 4
    assert {p.name for p in target.iterdir()} >= FILES
    assert [p.name for p in tmp_path.iterdir()] == ["shared"]  # no staging leftovers
    Tokenizer.from_file(str(target / "tokenizer.json"))


def test_outdated_directory_is_replaced(tmp_path: Path) -> None:
    target = ensure_tiny_model(tmp_path / "m")
    stamp = next(p for p in target.iterdir() if p.name not in FILES)
    stamp.write_text(json.dumps({"generator": "trio_direct.mock.tiny_model", "version": 0}))
    (target / "tokenizer.json").write_text("{}")
    ensure_tiny_model(target)
    assert Tokenizer.from_file(str(target / "tokenizer.json")).token_to_id("<|im_end|>") == 2


def test_empty_directory_is_filled(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert {p.name for p in ensure_tiny_model(tmp_path / "m").iterdir()} >= FILES


def test_foreign_directory_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        ensure_tiny_model(target)
    assert (target / "notes.txt").read_text() == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


def test_default_dir_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_tiny_model_dir() == tmp_path / "xdg" / "trio-direct" / "tiny-chatml"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "trio-direct" / "tiny-chatml"
    assert default_tiny_model_dir() == expected
    assert not os.path.exists(expected)  # computing the path creates nothing
