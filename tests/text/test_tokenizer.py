"""ModelTokenizer reads an HF model directory the way transformers does."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trio_direct.mock.tiny_model import CHAT_TEMPLATE, EOS_TOKEN_ID
from trio_direct.text.tokenizer import ModelTokenizer, TokenizerLoadError

DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"


def _copy_model(source: Path, target: Path, **config_changes: object) -> Path:
    shutil.copytree(source, target)
    config_file = target / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(config_changes)
    config_file.write_text(json.dumps(config))
    return target


def test_tiny_model_metadata(tiny: ModelTokenizer) -> None:
    assert tiny.eos_token == "<|im_end|>"
    assert tiny.eos_token_ids == {EOS_TOKEN_ID}
    assert tiny.bos_token is None and tiny.bos_token_id is None
    assert tiny.pad_token == "<|endoftext|>"
    assert tiny.special_token_ids == {0, 1, 2}
    assert tiny.chat_template == CHAT_TEMPLATE
    assert tiny.model_max_length == 32768
    assert tiny.vocab_size == tiny.tokenizer.get_vocab_size(with_added_tokens=True)
    assert tiny.id_to_token(EOS_TOKEN_ID) == "<|im_end|>"
    assert tiny.id_to_token(10**6) is None


def test_encode_decode_round_trip(tiny: ModelTokenizer) -> None:
    text = "<|im_start|>user\nHello world<|im_end|>\n"
    ids = tiny.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and EOS_TOKEN_ID in ids  # special-token text maps to the special ids
    assert tiny.decode(ids, skip_special_tokens=False) == text
    assert tiny.decode(ids, skip_special_tokens=True) == "user\nHello world\n"


def test_added_token_dicts_and_generation_config_eos(deepseek: ModelTokenizer, deepseek_dir: Path) -> None:
    assert deepseek.bos_token == DEEPSEEK_BOS
    assert deepseek.eos_token == DEEPSEEK_EOS
    assert deepseek.unk_token is None
    # tokenizer_config's eos (id 1) united with generation_config's [1, 2]
    assert deepseek.eos_token_ids == {1, 2}
    assert {0, 1, 2} <= deepseek.special_token_ids
    assert deepseek.model_max_length is None  # HF's 1e30 "unlimited" sentinel
    assert deepseek.vocab_size == 129280
    config = json.loads((deepseek_dir / "tokenizer_config.json").read_text())
    assert deepseek.chat_template == config["chat_template"]
    assert deepseek.template_special_tokens == {
        "bos_token": DEEPSEEK_BOS,
        "eos_token": DEEPSEEK_EOS,
        "pad_token": DEEPSEEK_EOS,
    }


def test_add_bos_token_prepends_bos_once(deepseek: ModelTokenizer) -> None:
    bos = deepseek.bos_token_id
    assert bos == 0
    ids = deepseek.encode("Hello", add_special_tokens=True)
    assert ids[0] == bos and ids.count(bos) == 1
    assert deepseek.encode(DEEPSEEK_BOS + "Hello", add_special_tokens=True).count(bos) == 1
    assert bos not in deepseek.encode("Hello", add_special_tokens=False)


def test_single_token_id(tiny: ModelTokenizer, deepseek: ModelTokenizer) -> None:
    assert tiny.single_token_id("<|im_end|>") == EOS_TOKEN_ID
    assert tiny.single_token_id("\n") == tiny.encode("\n", add_special_tokens=False)[0]
    assert tiny.single_token_id("Hello world, said the fox") is None
    assert tiny.single_token_id("") is None
    assert deepseek.single_token_id(DEEPSEEK_EOS) == 1
    assert deepseek.single_token_id("中文字符 mixed") is None


def test_named_templates_from_tokenizer_config(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(
        tiny_dir,
        tmp_path / "m",
        chat_template=[
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools"},
        ],
    )
    tok = ModelTokenizer.from_directory(model)
    assert tok.chat_templates == {"default": "plain", "tool_use": "tools"}
    assert tok.chat_template == "plain"


def test_template_files_take_precedence(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_dir, tmp_path / "m")
    (model / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert ModelTokenizer.from_directory(model).chat_template == "from json"
    (model / "chat_template.jinja").write_text("from jinja")
    (model / "additional_chat_templates").mkdir()
    (model / "additional_chat_templates" / "rag.jinja").write_text("rag")
    tok = ModelTokenizer.from_directory(model)
    assert tok.chat_templates == {"default": "from jinja", "rag": "rag"}


def test_tokenizer_json_alone_is_enough(tiny_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    shutil.copyfile(tiny_dir / "tokenizer.json", tmp_path / "m" / "tokenizer.json")
    tok = ModelTokenizer.from_directory(tmp_path / "m")
    assert tok.chat_template is None and tok.eos_token is None and tok.eos_token_ids == set()
    assert tok.decode(tok.encode("Hello world")) == "Hello world"


def test_generation_config_falls_back_to_config_json(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_dir, tmp_path / "m", eos_token=None)
    (model / "generation_config.json").unlink()
    assert ModelTokenizer.from_directory(model).eos_token_ids == {EOS_TOKEN_ID}


def test_truncation_in_tokenizer_json_is_ignored(tiny_dir: Path, tmp_path: Path) -> None:
    model = _copy_model(tiny_dir, tmp_path / "m")
    raw = Tokenizer.from_file(str(model / "tokenizer.json"))
    raw.enable_truncation(max_length=3)
    raw.save(str(model / "tokenizer.json"))
    text = "The quick fox jumps over the lazy dog again and again."
    tok = ModelTokenizer.from_directory(model)
    assert len(tok.encode(text)) > 3
    assert tok.decode(tok.encode(text)) == text


def test_missing_or_broken_files_raise(tmp_path: Path, tiny_dir: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="no tokenizer.json"):
        ModelTokenizer.from_directory(tmp_path)
    model = _copy_model(tiny_dir, tmp_path / "m")
    (model / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="tokenizer_config.json"):
        ModelTokenizer.from_directory(model)


def test_concurrent_encoding_from_threads(deepseek: ModelTokenizer) -> None:
    texts = [f"request {i}: 中文 😀 {'words ' * i}" for i in range(64)]
    expected = [deepseek.encode(t) for t in texts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(deepseek.encode, texts)) == expected


def test_long_texts_encode_like_short_ones(deepseek: ModelTokenizer) -> None:
    # Long inputs take the GIL-releasing path; the ids must not change.
    text = "The quick brown fox 快速的棕色狐狸 jumps 😀 over the lazy dog. " * 200
    assert len(text) > 4096
    assert (
        deepseek.encode(text, add_special_tokens=False) == deepseek.tokenizer.encode(text, add_special_tokens=False).ids
    )
    assert deepseek.encode(text)[0] == deepseek.bos_token_id


def test_a_text_far_over_a_limit_is_counted_in_chunks_and_stopped_early(tiny_model):
    from trio_direct.text.tokenizer import COUNTED_CHARS_PER_TOKEN

    tokenizer = ModelTokenizer.from_directory(tiny_model)
    text = "x " * 400_000
    exact = len(tokenizer.encode(text, add_special_tokens=False))
    over = tokenizer.exceeds(text, 10_000)
    assert over is not None and 10_000 <= over <= exact  # a lower bound, past the limit
    assert tokenizer.exceeds(text, exact + 1000) is None  # under the limit: nothing to refuse
    short = "x " * 1000
    assert tokenizer.exceeds(short, len(short) // COUNTED_CHARS_PER_TOKEN) is None  # short: just encoded


def test_the_length_bound_never_exceeds_the_true_count(tiny_model):
    tokenizer = ModelTokenizer.from_directory(tiny_model)
    for text in ("x " * 5000, "lorem ipsum dolor " * 3000, "<|im_end|>" * 500, "é" * 4000, "a" * 20000):
        assert tokenizer.min_tokens(len(text)) <= len(tokenizer.encode(text, add_special_tokens=False))
