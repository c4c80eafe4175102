"""A model's tokenizer as the frontend needs it, loaded from an HF model directory without network.

The frontend tokenizes prompts and detokenizes engine output itself (as smg does), so it must read
the same files HF transformers reads and agree with it on special tokens, EOS ids and the chat
template. Everything is resolved once at load time; the object is immutable afterwards and safe to
share between requests and worker threads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenizers import Tokenizer

from trio_direct.engine.packed_ids import PackedIds, pack_ids, pack_u32le, u32_array, u32le_bytes
from trio_direct.text.byte_level import byte_level_pieces
from trio_direct.text.fast_bpe import FastBPE, FastEncoderPlan, plan_fast_encoder
from trio_direct.text.prefix_cache import DEFAULT_MAX_BYTES, PromptLookup, PromptPrefixCache

__all__ = ["ModelTokenizer", "PromptEncoding", "TokenizerLoadError"]

logger = logging.getLogger(__name__)

# HF writes this sentinel (int(1e30)) for "no limit" into `model_max_length`.
_UNLIMITED_MAX_LENGTH = 10**18
# Texts this long (~0.5 ms to encode) are encoded without holding the GIL; see `encode`.
_GIL_RELEASE_CHARS = 4096
# Above this many special tokens, only those a template writes or the config names are cuts.
_MAX_CUT_CANDIDATES = 64
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class TokenizerLoadError(ValueError):
    """The model directory lacks a usable tokenizer, or one of its files is malformed."""


@dataclass(frozen=True, slots=True, eq=False)
class ModelTokenizer:
    """An HF `tokenizers.Tokenizer` plus the metadata transformers keeps beside it.

    `chat_templates` maps template names to sources; a single template is stored as "default"
    (see `chat_template.select_chat_template`). Compared and hashed by identity. `prompt_cache`
    (None when the tokenizer cannot be cut exactly, or when disabled) serves `encode_prompt`; it
    is the one mutable part, and locks itself.
    """

    tokenizer: Tokenizer
    chat_templates: Mapping[str, str] = field(default_factory=dict)
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    additional_special_tokens: tuple[str, ...] = ()
    eos_token_ids: frozenset[int] = frozenset()
    special_token_ids: frozenset[int] = frozenset()
    add_bos_token: bool = False
    model_max_length: int | None = None
    prompt_cache: PromptPrefixCache | None = None
    #: The longest text one token can stand for, in characters (an upper bound: `longest_token`).
    max_token_chars: int = 0
    #: tiktoken, for the texts where it provably gives HF's ids (`text.fast_bpe`); None: HF only.
    fast_encoder: FastBPE | None = None
    #: Which encoder serves this tokenizer and why (logged once at load; in /get_server_info).
    encoder_info: str = "huggingface"

    @classmethod
    def from_directory(cls, path: str | Path, *, prompt_cache_bytes: int = DEFAULT_MAX_BYTES) -> ModelTokenizer:
        """Load `tokenizer.json` and the optional HF side files from a model directory.

        Reads `tokenizer_config.json`, `generation_config.json` (or `config.json` when that is
        missing, as transformers derives one from it), and the newer `chat_template.jinja` /
        `chat_template.json` / `additional_chat_templates/*.jinja` files, which take precedence
        over `tokenizer_config.json`'s `chat_template`. `prompt_cache_bytes` bounds the cache of
        rendered prompt prefixes behind `encode_prompt` (0: no cache).
        """
        directory = Path(path)
        tokenizer_file = directory / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerLoadError(f"{directory} has no tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerLoadError(f"cannot load {tokenizer_file}: {exc}") from exc
        # transformers never truncates or pads unless asked; a tokenizer.json may carry either.
        tokenizer.no_truncation()
        tokenizer.no_padding()
        plan = _plan_encoder(tokenizer, tokenizer_file)
        fast = plan.fast
        logger.info(
            "tokenizer %s: %s encodes (%s; checked in %.0f ms)", directory, plan.name, plan.reason, plan.seconds * 1e3
        )
        # Built and checked now (a few ms), not by the first stream (`text.byte_level`).
        byte_level_pieces(tokenizer)

        config = _read_json(directory / "tokenizer_config.json")
        generation = _read_json(directory / "generation_config.json")
        if not (directory / "generation_config.json").is_file():
            generation = _read_json(directory / "config.json")

        tokens = {key: _token_content(config.get(key)) for key in _SPECIAL_TOKEN_KEYS}
        additional = tuple(
            t for t in (_token_content(x) for x in config.get("additional_special_tokens") or ()) if t is not None
        )

        def token_id(token: str | None) -> int | None:
            return None if token is None else tokenizer.token_to_id(token)

        eos_ids = set(_int_list(generation.get("eos_token_id")))
        if (eos_id := token_id(tokens["eos_token"])) is not None:
            eos_ids.add(eos_id)

        special_ids = {i for i, added in tokenizer.get_added_tokens_decoder().items() if added.special}
        for key, entry in (config.get("added_tokens_decoder") or {}).items():
            # Only trust entries that agree with tokenizer.json; the ids there are authoritative.
            if isinstance(entry, Mapping) and entry.get("special") and token_id(entry.get("content")) == _as_int(key):
                special_ids.add(int(key))
        for token in (*tokens.values(), *additional):
            if (i := token_id(token)) is not None:
                special_ids.add(i)

        max_length = config.get("model_max_length")
        if not isinstance(max_length, int) or max_length >= _UNLIMITED_MAX_LENGTH:
            max_length = None

        templates = _chat_templates(directory, config)
        prompt_cache = None
        if prompt_cache_bytes > 0:
            # Cut at the added tokens the model's templates write and at its named special tokens
            # (EOS ends the turns of most templates, an operator's --chat-template's included); at
            # every special token when there are few (models with reserved ranges have thousands).
            added = tokenizer.get_added_tokens_decoder().values()
            named = {*(t for t in tokens.values() if t is not None), *additional}
            if sum(token.special for token in added) <= _MAX_CUT_CANDIDATES:
                named |= {token.content for token in added if token.special}
            candidates = {
                token.content
                for token in added
                if token.content in named or any(token.content in source for source in templates.values())
            }
            prompt_cache = PromptPrefixCache.for_tokenizer(
                tokenizer,
                partial(_encode_ids, tokenizer, add_special_tokens=False, fast=fast),
                candidates=candidates,
                max_bytes=prompt_cache_bytes,
                # tiktoken cuts its input at added tokens first: a prompt's new segments encode apart.
                encode_parts=None if fast is None else fast.encode_u32le,
            )

        return cls(
            tokenizer=tokenizer,
            chat_templates=MappingProxyType(templates),
            bos_token=tokens["bos_token"],
            eos_token=tokens["eos_token"],
            pad_token=tokens["pad_token"],
            unk_token=tokens["unk_token"],
            additional_special_tokens=additional,
            eos_token_ids=frozenset(eos_ids),
            special_token_ids=frozenset(special_ids),
            add_bos_token=bool(config.get("add_bos_token", False)),
            model_max_length=max_length,
            prompt_cache=prompt_cache,
            max_token_chars=longest_token(tokenizer),
            fast_encoder=fast,
            encoder_info=f"{plan.name}: {plan.reason}",
        )

    @property
    def chat_template(self) -> str | None:
        """The template used when a request names none and passes no tools."""
        return self.chat_templates.get("default")

    @property
    def vocab_size(self) -> int:
        """Size of the id space, added tokens included (ids are below this)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def exceeds(self, text: str, limit: int, *, add_special_tokens: bool = False) -> int | None:
        """At least how many tokens `text` has when that is `limit` or more, else None: counted a
        chunk at a time and stopped as soon as the count passes `limit`, so a text far over the
        context costs the memory of one chunk's encoding, not of the whole text's.

        Only texts longer than `limit` * `COUNTED_CHARS_PER_TOKEN` characters are counted (shorter
        ones are simply encoded: their encoding is small). Chunks end at whitespace; each cut can
        split one token in two, so the count may run a token per chunk over the truth, and the
        text counts as over only past ``limit`` plus that allowance.
        """
        if not self.counts_in_chunks(text, limit):
            return None
        counted = 0
        chunks = 0
        for group in _chunk_groups(text):
            encodings = self.tokenizer.encode_batch_fast(group, add_special_tokens=False)
            counted += sum(len(encoding.ids) for encoding in encodings)
            chunks += len(group)
            if counted - chunks >= limit:
                return counted - chunks
        del add_special_tokens  # a post-processor adds a few tokens at most; the count is a lower bound
        return None

    def counts_in_chunks(self, text: str, limit: int) -> bool:
        """Whether `exceeds(text, limit)` counts `text` (longer than `limit` *
        `COUNTED_CHARS_PER_TOKEN` characters) rather than answering None at once."""
        return len(text) > limit * COUNTED_CHARS_PER_TOKEN

    def min_tokens(self, chars: int) -> int:
        """A lower bound on the tokens of a text of `chars` characters, without tokenizing it."""
        return chars // self.max_token_chars if self.max_token_chars else 0

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.tokenizer.token_to_id(self.bos_token)

    @property
    def template_special_tokens(self) -> dict[str, Any]:
        """The special-token variables HF passes to chat templates; unset ones stay undefined."""
        out: dict[str, Any] = {
            key: value
            for key, value in (
                ("bos_token", self.bos_token),
                ("eos_token", self.eos_token),
                ("pad_token", self.pad_token),
                ("unk_token", self.unk_token),
            )
            if value is not None
        }
        if self.additional_special_tokens:
            out["additional_special_tokens"] = list(self.additional_special_tokens)
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids for `text`; special-token text (e.g. `<|im_end|>`) always maps to its id.

        `add_special_tokens` runs the post-processor (BOS/EOS templates). When the config sets
        `add_bos_token` and the post-processor did not add BOS, it is prepended, as transformers
        does for Llama-style tokenizers. Rendered chat prompts use `add_special_tokens=False`:
        the template already wrote BOS.
        """
        ids = _encode_ids(self.tokenizer, text, add_special_tokens=add_special_tokens, fast=self.fast_encoder)
        if add_special_tokens and self.add_bos_token:
            bos = self.bos_token_id
            if bos is not None and (not ids or ids[0] != bos):
                ids.insert(0, bos)
        return ids

    def encode_packed(self, text: str, add_special_tokens: bool = True) -> PackedIds:
        """`encode(text, add_special_tokens)`'s ids packed for the wire, made where the prompt is
        tokenized (a worker thread for a long one) rather than on the event loop per request. With
        tiktoken the ids never become Python ints: an `array("I")` (4 bytes an id) and the payload,
        both from tiktoken's buffer (`FastBPE.encode_u32le`, `engine.packed_ids.pack_u32le`)."""
        fast = self.fast_encoder
        data = None
        if fast is not None and (not add_special_tokens or fast.prefix_ids is not None):
            data = fast.encode_u32le(text)
        if fast is None or data is None:
            ids = self.encode(text, add_special_tokens=add_special_tokens)
            return PackedIds.of(ids, pack_ids(ids))
        if add_special_tokens:
            prefix = list(fast.prefix_ids or ())
            first = prefix[0] if prefix else (u32_array(data[:4])[0] if data else None)
            bos = self.bos_token_id if self.add_bos_token else None
            if bos is not None and first != bos:
                prefix.insert(0, bos)
            data = u32le_bytes(prefix) + data + u32le_bytes(fast.suffix_ids)
        return PackedIds.of(u32_array(data), pack_u32le(data))

    def encode_cost_ns(self, text: str) -> int:
        """An estimate of the CPU time encoding `text` whole takes (ns): its characters at the rate
        of the encoder that will encode it, tiktoken's where it covers the text, else Hugging Face's
        (measured on a small VM: a faster machine only makes it conservative)."""
        fast = self.fast_encoder
        per_char = _TIKTOKEN_NS_PER_CHAR if fast is not None and fast.covers(text) else _HF_NS_PER_CHAR
        return len(text) * per_char

    def encode_prompt(self, text: str) -> list[int]:
        """`encode(text, add_special_tokens=False)` for a rendered chat prompt: the same ids, but the
        part of `text` that earlier prompts shared (a conversation's history) comes from the
        prompt prefix cache, and only the rest is tokenized (see `text.prefix_cache`)."""
        cache = self.prompt_cache
        if cache is None:
            return self.encode(text, add_special_tokens=False)
        return cache.encode(text)

    def encode_prompt_packed(self, text: str) -> PackedIds:
        """`encode_prompt(text)` with the ids packed for the wire (`engine.packed_ids`), made here,
        where the prompt is tokenized (on a worker thread when it is long), rather than on the event
        loop per request; the prefix cache supplies a conversation's history already packed."""
        return self.prompt_encoding(text).finish()

    def prompt_encoding(self, text: str) -> PromptEncoding:
        """`encode_prompt_packed(text)` in two steps: the prompt prefix cache's lookup now, and
        `finish()`, whose cost `PromptEncoding.cost_ns` estimates from what the lookup left to do."""
        cache = self.prompt_cache
        return PromptEncoding(self, text, None if cache is None else cache.lookup(text))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text for `ids`. Ids outside the vocabulary decode to nothing, as in `tokenizers`."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (not the decoded text) for `token_id`, or None if unknown."""
        return self.tokenizer.id_to_token(token_id)

    def single_token_id(self, text: str) -> int | None:
        """The id `text` encodes to when it is exactly one token that decodes back to `text`.

        smg moves such stop strings into `stop_token_ids` so the engine stops by itself; longer
        stops are matched client-side. The round-trip check keeps a stop that only *encodes*
        to one token (a normalizer changed it) on the exact client-side path.
        """
        if not text:
            return None
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            return None
        if self.tokenizer.decode(ids, skip_special_tokens=False) != text:
            return None
        return ids[0]


#: Texts over this many characters per token of the limit are counted in chunks before they are
#: encoded whole (`ModelTokenizer.exceeds`): no vocabulary averages that many characters a token.
COUNTED_CHARS_PER_TOKEN = 8
#: Characters per counted chunk, and chunks per encoding call (one call's memory at most).
_CHUNK_CHARS = 64 * 1024
_CHUNKS_PER_CALL = 8


def _chunk_groups(text: str):
    """`text` cut near every `_CHUNK_CHARS` characters at whitespace, in groups for one encoding call."""
    group: list[str] = []
    start, end = 0, len(text)
    while start < end:
        stop = min(start + _CHUNK_CHARS, end)
        if stop < end:
            space = text.rfind(" ", start + _CHUNK_CHARS // 2, stop)
            if space > start:
                stop = space
        group.append(text[start:stop])
        start = stop
        if len(group) == _CHUNKS_PER_CALL:
            yield group
            group = []
    if group:
        yield group


def longest_token(tokenizer: Tokenizer) -> int:
    """An upper bound on the characters one token stands for: twice its longest vocabulary entry.

    Entries are measured as stored (byte-level BPE keeps one character per byte; sentencepiece a
    ``▁`` per space), added tokens by their content; doubled for the normalisers and decoders that
    expand what they stand for. ``len(text) // longest_token`` is then a lower bound on the text's
    token count that costs no tokenization: what lets a prompt far over the context be refused
    before the work (and the memory) of encoding it.
    """
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return 2 * max((len(token) for token in vocab), default=1)


def _plan_encoder(tokenizer: Tokenizer, tokenizer_file: Path) -> FastEncoderPlan:
    """Whether tiktoken may encode for `tokenizer` (`text.fast_bpe`), checked against its own file."""
    try:
        state = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return FastEncoderPlan(None, f"cannot re-read {tokenizer_file.name}: {exc}")
    bare = Tokenizer(tokenizer.model)  # the same BPE model, without normalizer, pre-tokenizer or added tokens

    def model_tokenize(words: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in bare.encode_batch_fast(words, add_special_tokens=False)]

    return plan_fast_encoder(state, model_tokenize)


#: What `PromptEncoding.finish` costs, measured on a 2-vCPU VM (Python 3.11, the benchmarks' prose),
#: per character it encodes with tiktoken, with Hugging Face tokenizers, and per id it takes from
#: the prompt prefix cache (each becomes a Python int): ~18k, ~2k and ~35k a millisecond.
_TIKTOKEN_NS_PER_CHAR = 60
_HF_NS_PER_CHAR = 500
_CACHED_NS_PER_ID = 30


@dataclass(slots=True, eq=False)
class PromptEncoding:
    """A rendered prompt whose prefix was looked up in the prompt prefix cache (`lookup`; None
    without a cache), and what is left: `finish()` returns the ids, packed for the wire.

    The event loop or a worker thread may finish it. A thread costs its hand-off (~0.1 ms of CPU on
    a small VM, more when the loop is busy and both want the GIL), so a conversation whose history
    is cached, where little is left to encode, is cheaper finished on the loop; `cost_ns` tells.
    """

    tokenizer: ModelTokenizer
    text: str
    lookup: PromptLookup | None

    @property
    def cost_ns(self) -> int:
        """An estimate of `finish()`'s CPU time, from the characters it encodes (at the rate of the
        encoder that will, tiktoken's or Hugging Face's) and the ids it takes from the cache."""
        lookup, text = self.lookup, self.text
        new = text if lookup is None or not lookup.start else text[lookup.start :]
        cached = 0 if lookup is None else lookup.cached_ids * _CACHED_NS_PER_ID
        return self.tokenizer.encode_cost_ns(new) + cached

    def finish(self) -> PackedIds:
        """The prompt's ids, packed for the wire: the cached prefix's from the cache, the rest
        encoded here (on whichever thread calls it), its new segments cached."""
        lookup, cache = self.lookup, self.tokenizer.prompt_cache
        if lookup is None or cache is None:
            return self.tokenizer.encode_packed(self.text, add_special_tokens=False)
        ids, payload = cache.finish(lookup)
        return PackedIds.of(ids, payload)


def _encode_ids(tokenizer: Tokenizer, text: str, *, add_special_tokens: bool, fast: FastBPE | None = None) -> list[int]:
    if fast is not None:
        # tiktoken releases the GIL while it encodes, as HF's batch call below does.
        ids = fast.encode(text, add_special_tokens=add_special_tokens)
        if ids is not None:
            return ids
    if len(text) < _GIL_RELEASE_CHARS:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    # `Tokenizer.encode` holds the GIL for its whole run (~10 ms for 8k tokens), which would stall
    # the event loop even from a worker thread; the batch calls release it, and the `_fast` one
    # skips the character offsets nobody here reads (~10 % less CPU).
    return tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return value


def _token_content(value: object) -> str | None:
    """A special token given as a plain string or as an AddedToken dict (`{"content": ...}`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def _int_list(value: object) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates, in transformers' precedence: side files over tokenizer_config."""
    templates = _named_templates(config.get("chat_template"))
    json_file = directory / "chat_template.json"
    if json_file.is_file():
        templates = _named_templates(_read_json(json_file).get("chat_template")) or templates
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        templates = {"default": jinja_file.read_text(encoding="utf-8")}
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates.setdefault(file.stem, file.read_text(encoding="utf-8"))
    return templates


def _named_templates(value: object) -> dict[str, str]:
    """`chat_template` as HF stores it: one string, or a list of `{"name", "template"}`."""
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {
            item["name"]: item["template"]
            for item in value
            if isinstance(item, Mapping) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)
        }
    return {}
