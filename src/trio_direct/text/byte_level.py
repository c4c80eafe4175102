"""What each id of a byte-level tokenizer decodes to, as bytes: the streams' detokenizing without
`tokenizers`' per-step decode (sans-IO).

For tokenizers whose decoder is `ByteLevel` alone (GPT-2's construction: Llama 3, Qwen, DeepSeek,
gpt-oss), `decode(ids)` is, by `tokenizers`' own definition, the UTF-8 decoding, with U+FFFD for
invalid sequences, of the concatenated bytes of the ids' tokens (special ones left out when
skipped, ids without a token too). `ByteLevelPieces` holds those bytes per id; `byte_level_pieces`
builds it once per tokenizer and hands it out only when, checked at load, `decode` agrees with it
on every id alone and on sequences that cross added tokens and split characters. The incremental
detokenizer (`text.detokenizer`) streams from it.
"""

from __future__ import annotations

import random
import re
import weakref
from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import ByteLevel

__all__ = ["CHAR_BYTES", "ByteLevelPieces", "byte_level_pieces"]


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's bytes-to-characters map, inverted: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: byte for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = 256 + extra
            extra += 1
    return {chr(char): byte for byte, char in chars.items()}


CHAR_BYTES = _byte_level_alphabet()
_NOT_BYTE_LEVEL = re.compile("[^" + re.escape("".join(CHAR_BYTES)) + "]")
#: Random id sequences checked against `decode` at load (see `byte_level_pieces`).
_PROBES = 400


class ByteLevelPieces:
    """What each id decodes to under a `ByteLevel` decoder: its bytes, and their text when they
    are valid UTF-8 alone (else None). Looked up per id as streams need them, and kept.

    `tokenizers` decodes a token (the added vocabulary's, else the model's; none for an id without
    one) through ByteLevel as the bytes its characters stand for, or as its own UTF-8 when one of
    them stands for none; `decode` skips special tokens (by content) when told to.
    """

    __slots__ = ("_tokenizer", "_special", "shown", "skipped")

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
        #: By id, with special tokens shown and skipped: filled by `piece`.
        self.shown: dict[int, tuple[bytes, str | None]] = {}
        self.skipped: dict[int, tuple[bytes, str | None]] = {}

    def piece(self, token_id: int, skip: bool) -> tuple[bytes, str | None]:
        token = self._tokenizer.id_to_token(token_id)
        if token is None or (skip and token in self._special):
            data = b""
        elif _NOT_BYTE_LEVEL.search(token) is None:
            data = bytes([CHAR_BYTES[char] for char in token])
        else:
            data = token.encode()
        try:
            text: str | None = data.decode()
        except UnicodeDecodeError:
            text = None
        found = (data, text)
        (self.skipped if skip else self.shown)[token_id] = found
        return found

    def bytes_of(self, ids: Sequence[int], skip: bool) -> bytes:
        table = self.skipped if skip else self.shown
        return b"".join([(table.get(i) or self.piece(i, skip))[0] for i in ids])

    def text(self, ids: Sequence[int], skip: bool) -> str:
        """`decode(ids)`, as these pieces make it."""
        return self.bytes_of(ids, skip).decode("utf-8", "replace")


_PIECES: weakref.WeakKeyDictionary[Tokenizer, ByteLevelPieces | None] = weakref.WeakKeyDictionary()


def byte_level_pieces(tokenizer: Tokenizer) -> ByteLevelPieces | None:
    """`tokenizer`'s `ByteLevelPieces` (built and checked once, in a few ms), or None where its
    `decode` is not that: another decoder, or any disagreement found by the check."""
    try:
        return _PIECES[tokenizer]
    except KeyError:
        pass
    pieces = ByteLevelPieces(tokenizer) if isinstance(tokenizer.decoder, ByteLevel) else None
    if pieces is not None and not _agrees(tokenizer, pieces):
        pieces = None
    _PIECES[tokenizer] = pieces
    return pieces


def _agrees(tokenizer: Tokenizer, pieces: ByteLevelPieces) -> bool:
    """`decode` equals `pieces.text` on seeded random sequences of ids that split characters (lone
    lead and continuation bytes), hold added tokens (which skipping takes out from between the
    bytes of one character), ids past the vocabulary and others, with special tokens shown and
    skipped: a guard against a `tokenizers` whose decoding differs from the definition above."""
    rng = random.Random(0)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    lone_bytes = [tokenizer.token_to_id(char) for char, byte in CHAR_BYTES.items() if byte >= 0x80]
    pool = [
        *(token_id for token_id in lone_bytes if token_id is not None),
        *tokenizer.get_added_tokens_decoder(),
        *rng.sample(range(size), min(size, 256)),
        size,
        size + 7,
    ]
    probes = [[token_id] for token_id in pool] + [rng.choices(pool, k=rng.randint(2, 8)) for _ in range(_PROBES)]
    for skip in (False, True):
        texts = tokenizer.decode_batch(probes, skip_special_tokens=skip)
        if any(text != pieces.text(ids, skip) for ids, text in zip(probes, texts, strict=True)):
            return False
    return True
