"""A tiny, deterministic HF-style model directory: a ChatML byte-level BPE plus Qwen2-like configs.

Tests, the mock engine and the peer gateways (smg, sglang-router, Dynamo) all need a tokenizer
directory. Training one at first use avoids a download and any licence question, and it is
small enough (vocab ≤ 1024) that tests read like the real thing.

Generation is deterministic: the corpus is a fixed word list drawn with a seeded RNG, and BPE
training on the same corpus yields byte-identical `tokenizer.json`, so the directory can be
cached across runs and compared in tests.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_TOKEN_ID = 0  # <|endoftext|>
IM_START_TOKEN_ID = 1
EOS_TOKEN_ID = 2  # <|im_end|>
VOCAB_SIZE = 1024  # the trainer's target; the trained vocab may stop short of it
MODEL_MAX_LENGTH = 32768

# Qwen2's ChatML template, trimmed to what the tests use; renders identically in transformers,
# sglang-router and smg.
CHAT_TEMPLATE = (
    r"{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' }}"
    r"{%- if message['content'] is string %}{{- message['content'] }}{%- else %}"
    r"{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] }}"
    r"{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\n' }}{%- endfor %}"
    r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

# Bump when the generated files change, so cached directories from older code are replaced.
_STAMP_NAME = "trio-direct-tiny-model.json"
_STAMP = {"generator": "trio_direct.mock.tiny_model", "version": 1}
_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    _STAMP_NAME,
)

_SEED = 20260917
_SENTENCES = 320
_WORDS = {
    "det": "the a this that every one some another my our your their".split(),
    "adj": (
        "quick lazy small large bright quiet warm cold green blue red old new happy "
        "careful simple early late gentle strong"
    ).split(),
    "noun": (
        "fox dog cat bird river mountain city garden engine router model token server "
        "request answer question story window table friend teacher student morning evening "
        "light cache message"
    ).split(),
    "verb": (
        "jumps runs waits reads writes sends finds keeps opens builds carries watches answers follows moves holds"
    ).split(),
    "adv": "slowly quickly quietly often never always soon again together carefully".split(),
    "prep": "over under near behind after before across through with without into".split(),
    "name": "Alice Bob Carol Dave Erin Frank Grace".split(),
}
_FIXED_LINES = (
    "You are helpful.",
    "Hello world",
    "system user assistant",
    "What is the capital of France? The capital of France is Paris.",
    "Count to ten: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
)


def default_tiny_model_dir() -> Path:
    """Where the shared copy lives: `$XDG_CACHE_HOME/trio-direct/tiny-chatml` (or `~/.cache/…`)."""
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "trio-direct" / "tiny-chatml"


def ensure_tiny_model(directory: Path) -> Path:
    """Make `directory` hold the tiny model and return it; reuse it when already complete.

    The files are written into a temporary sibling and renamed into place, so concurrent
    callers (pytest-xdist workers, several mock engines) never see a half-written directory;
    the loser of a race discards its copy.
    """
    directory = Path(directory)
    if _is_complete(directory):
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        _write_model(staging)
        for _ in range(3):
            try:
                os.rename(staging, directory)  # atomic; replaces only an empty directory
                return directory
            except OSError:
                if _is_complete(directory):
                    return directory  # another caller published first
                _discard_outdated(directory)
        raise RuntimeError(f"could not publish the tiny model at {directory}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _is_complete(directory: Path) -> bool:
    try:
        stamp = json.loads((directory / _STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return stamp == _STAMP and all((directory / name).is_file() for name in _FILES)


def _discard_outdated(directory: Path) -> None:
    """Move aside a directory an older version of this module wrote; refuse anything else."""
    if not directory.exists():
        return
    if not (directory / _STAMP_NAME).is_file():
        raise FileExistsError(f"{directory} exists and is not a tiny-model directory")
    trash = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
    try:
        os.rename(directory, trash / directory.name)
    except FileNotFoundError:
        pass  # someone else moved it first
    finally:
        shutil.rmtree(trash, ignore_errors=True)


def _corpus() -> list[str]:
    rng = random.Random(_SEED)
    w = _WORDS

    def pick(kind: str) -> str:
        return rng.choice(w[kind])

    shapes = (
        lambda: (
            f"{pick('det').capitalize()} {pick('adj')} {pick('noun')} {pick('verb')} "
            f"{pick('prep')} {pick('det')} {pick('adj')} {pick('noun')}."
        ),
        lambda: f"{pick('name')} {pick('verb')} {pick('adv')} {pick('prep')} the {pick('noun')}.",
        lambda: f"Why does {pick('det')} {pick('noun')} {pick('verb').removesuffix('s')} {pick('adv')}?",
        lambda: (
            f"{pick('name')} and {pick('name')} saw {rng.randint(2, 99)} {pick('adj')} {pick('noun')}s, {pick('adv')}."
        ),
    )
    return list(_FIXED_LINES) + [rng.choice(shapes)() for _ in range(_SENTENCES)]


def _train_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def _write_model(directory: Path) -> None:
    tokenizer = _train_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos, pad = SPECIAL_TOKENS[EOS_TOKEN_ID], SPECIAL_TOKENS[PAD_TOKEN_ID]
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True))
    _write_json(
        directory / "tokenizer_config.json",
        {
            "added_tokens_decoder": {
                str(i): {
                    "content": token,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": True,
                }
                for i, token in enumerate(SPECIAL_TOKENS)
            },
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "bos_token": None,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": eos,
            "errors": "replace",
            "model_max_length": MODEL_MAX_LENGTH,
            "pad_token": pad,
            "split_special_tokens": False,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _write_json(
        directory / "config.json",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": vocab_size,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "hidden_act": "silu",
            "max_position_embeddings": MODEL_MAX_LENGTH,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "bos_token_id": PAD_TOKEN_ID,  # as in Qwen2: <|endoftext|>, though the template adds none
            "eos_token_id": EOS_TOKEN_ID,
            "torch_dtype": "bfloat16",
        },
    )
    _write_json(
        directory / "generation_config.json",
        {
            "bos_token_id": PAD_TOKEN_ID,
            "eos_token_id": EOS_TOKEN_ID,
            "pad_token_id": PAD_TOKEN_ID,
        },
    )
    _write_json(
        directory / "special_tokens_map.json",
        {
            "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
            "eos_token": eos,
            "pad_token": pad,
        },
    )
    _write_json(directory / _STAMP_NAME, _STAMP)


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
