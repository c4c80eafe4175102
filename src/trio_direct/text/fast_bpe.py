"""An exact, faster encoder for byte-level BPE tokenizers: tiktoken's, where it provably equals HF's.

Encoding a long rendered prompt is most of the frontend's CPU per request, and most of that is the
Hugging Face `tokenizers` binding (its Oniguruma regex, the offsets and token strings it allocates
per token). `tiktoken` runs the same kind of pipeline (a pre-tokenizing regex, then byte-pair merges
per piece) about 5x faster. A single differing token id would silently change what the model reads,
so tiktoken serves a tokenizer only when the conditions below hold, each checked from
`tokenizer.json` at load (`plan_fast_encoder`), and only for texts where the argument covers it
(`FastBPE.encode` returns None otherwise and the caller uses HF). Why the two then agree:

1. Pipeline. HF encodes a text by (a) cutting out added tokens, (b) normalizing each remaining piece,
   (c) pre-tokenizing it with a regex, (d) running BPE on each regex match's bytes, (e) mapping added
   tokens to their ids. tiktoken does (a) with `allowed_special="all"`, (c), (d), (e). Required:

   - model BPE without dropout, `continuing_subword_prefix`, `end_of_word_suffix` or byte fallback,
     and all 256 byte-level characters in the vocabulary (then every piece starts as its bytes, as in
     tiktoken, whose ranks are the vocabulary's ids on the byte strings the characters stand for);
   - pre-tokenizer `ByteLevel(add_prefix_space=False, use_regex=True)` (GPT-2's regex), or
     `Sequence[Split(pattern, Isolated), ByteLevel(add_prefix_space=False, use_regex=False)]` with a
     pattern from `TOTAL_PATTERNS`. Those are *total*: every character is whitespace, a letter, a
     digit or none of these, and each case has an alternative matching at least that character
     wherever it stands, so the matches tile the text. HF keeps unmatched stretches as pieces and
     tiktoken drops them; with a total pattern there are none. Any other pattern: HF;
   - normalizer none, NFC, or Sequences of those; with NFC, only text already in NFC (then every
     piece between added tokens is too: composition and reordering are local, so a substring of a
     normalized text has nothing left to compose or reorder);
   - text whose characters are all in `COVERED` (ASCII, Latin-1, Latin Extended-A/B, General
     Punctuation: `text.isascii()` is O(1), the rest one regex scan). The two regex engines
     (Oniguruma for HF, fancy-regex for tiktoken) both use leftmost-first backtracking semantics
     over the same pattern, so they split alike wherever every class in it (`\\s`, `\\p{L}`,
     `\\p{N}`, `\\p{Lu}`, case-insensitive `'s`, ...) holds the same characters in both. Their
     Unicode tables are separate copies; for the pinned versions the tests put every covered
     character, in contexts that expose each class, through both. Other text goes to HF;
   - added tokens without `lstrip`, `rstrip` or `single_word`, none a prefix of another (HF matches
     leftmost-longest, tiktoken leftmost-first; with no prefixes at most one token matches at a
     position, so both take the same), and, when some are `normalized` and some not (HF then
     matches in two passes), no token of one kind overlapping or containing one of the other.

2. Merges. Both merge loops repeatedly merge one adjacent pair of a piece's current symbols: HF
   (H) the pair with the lowest rank in its merge list, leftmost among equal ranks; tiktoken (T)
   the pair whose concatenation has the lowest id, leftmost among equal ids, considering every pair
   whose concatenation is a token. Required: (R) the merge list is sorted by the id of the merged
   token (no duplicates). Not required: that every split of a token is a listed merge (HF's trainer
   lists only the merges it made: " the" from " t"+"he", not " "+"the"), nor that a token is newer
   than its parts (false for vocabularies converted from tiktoken's).

   Locality. If a loop, run on a piece, forms a token u, the merges it made inside u's span are
   exactly that loop's run on u's bytes alone: symbols never shrink, so every symbol lies inside
   the span or outside it, outer merges leave the inside alone, and each step took the least
   candidate overall, hence the least inside. In particular u is always formed by the same last
   merge, the one that run on u alone ends with.

   Let D be the tokens on whose bytes alone T and H differ at some step (computed at load by
   running both, only for tokens where they can: a candidate that is not a listed merge needs a
   token with an unlisted split inside, two candidates of different pairs with one result need a
   token with several listed splits inside twice; by (R) nothing else separates the choices), and
   `risky` the tokens whose T loop alone forms a token of D (the last step included). Claim: if no
   token T's merge loop outputs for a piece is in `risky`, H's output is the same. Take the first step where the
   runs differ, T merging c (into v) and H merging h or stopping; c lies inside a final T token s.
   Before this step both runs made the same merges, each the least candidate overall, so both
   loops run on s alone reach the same state as inside s here, where T picks c. If H on s alone
   picks otherwise, s is in D and T forms s: s is risky. Else c is H's least candidate inside s
   but not overall, so h exists; h is a listed merge, so a T candidate too. If h's result u is not
   v, T's choice gives id(v) < id(u) and H's rank(h) < rank(c), against (R). If u = v, by locality
   c and h are the last merges of T on u alone and of H on u alone; were u not in D they would be
   the same pair, and T took the leftmost candidate of that pair, which H takes too. So u is in D,
   T forms it inside s, and s is risky. Finally, if H stops while T does not, then c is no listed
   merge, so H on s alone differs at that point: s is risky; T cannot stop first, as H's
   candidates are T's.

3. Whole pieces. tiktoken encodes a piece that is itself in the vocabulary as that token without
   merging; HF does the same only with `ignore_merges`. Otherwise the two agree exactly when the
   merge loop on that token's bytes yields the token, which HF's own model decides at load for
   every token; the exceptions join `risky` (a token can come out of tiktoken only by this
   shortcut or by its own merge loop, which, by 2, is HF's), except those spelling an added token:
   a piece never equals an added token's text, since both cut every occurrence out first (with no
   added token a prefix of another, the leftmost scan matches each occurrence unless an overlapping
   match took part of it).

When any output id is in `risky`, `encode` returns None and the caller encodes with HF. For the
tiny model, the tokenizers HF's BpeTrainer made in the tests and o200k's vocabulary converted as
transformers converts tiktoken vocabularies (Llama 3's, gpt-oss's), D is empty: no per-text check.

4. Lookahead. Each pattern ends in `\\s+(?!\\S)|\\s+`, and that one lookahead puts the whole pattern on
   fancy-regex's backtracking VM: tiktoken then spends ~45 % longer on a prose prompt than with the
   same pattern less `\\s+(?!\\S)|` (call it P'), which the `regex` crate's automata run. P and P' pick
   the same match at every position except where no earlier alternative matches, a whitespace run
   of length R >= 2 starts there and a non-whitespace character follows it in the same span
   (between added tokens): P takes R - 1 characters, leaving the last for the next piece (" word"),
   P' takes R. A text without such a run (`LookaheadCuts` finds none) is split alike by both.

   Elsewhere the text is cut before the last character c of each maximal whitespace run W (|W| >= 2)
   that a non-whitespace character, not an added token, follows, and P' encodes the parts. Such a
   cut is exact when P's own split of the whole text has a boundary before c: regex matches start
   where the previous one ended, none of these patterns looks behind, and a match ending at the cut
   is chosen alike with or without the text after it (at the cut, `(?!\\S)` sees whitespace or the
   end, and passes both ways). The boundary:

   - GPT-2's pattern: no alternative but the last two matches whitespace except one leading " "
     before a non-whitespace character, so W's characters before c are matched by `\\s+(?!\\S)`,
     which ends right before c. Every such W is cut.
   - Llama 3's, Qwen2's and o200k's: `\\s*[\\r\\n]+` comes before the lookahead. When c is CR or LF,
     it matches at every position of W; when only the character before c is, at every position
     before c, and c alone is a run of one. P and P' agree on W, which is not cut. When neither is,
     no alternative matches c with the character before it (one optional character before letters,
     or " " before punctuation; CR, LF or "/" after punctuation; `\\s*[\\r\\n]+` ends in CR or LF;
     the lookahead ends before c), so W is cut.

   `LookaheadCuts` finds the runs at C speed (`str.find`, or with GPT-2's pattern one mask of the
   text's whitespace); a text with whitespace beyond ASCII's (U+00A0, U+2000...) is left to P, and
   added tokens that contain whitespace turn this off. A text with many short runs (indented code)
   costs a tiktoken call per part, so above one cut per `_MIN_PART_CHARS` characters it is encoded
   with P whole, and the search for runs stops as soon as they come that densely.

   o200k's pattern keeps its lookahead: without it, it measured no faster (its other alternatives
   cost as much either way), and looking for runs would be a loss.

   Measured (`benchmarks/text_pipeline_bench.py`, CPU time, best of 5, against the same checks with
   the whole pattern): prose 1.45-1.5x faster with GPT-2's pattern (the tiny model) while its runs
   were found by four pair searches, 1.68x with them masked at once (`LookaheadCuts`); 1.3x with
   Llama 3's (o200k's vocabulary); Markdown documentation and Python source 0.96-0.99x (their runs
   are too dense to cut with profit: the search for them is what they pay).
"""

from __future__ import annotations

import itertools
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trio_direct.engine.packed_ids import u32le_bytes, u32le_from_native

__all__ = ["COVERED", "GPT2_PATTERN", "TOTAL_PATTERNS", "FastBPE", "FastEncoderPlan", "plan_fast_encoder"]

#: The characters whose regex classes the tests check in both engines (ASCII, Latin-1, Latin
#: Extended-A and -B, General Punctuation: curly quotes, dashes, ellipsis, the typographic spaces).
COVERED = "\x00-\u024f\u2000-\u206f"
_UNCOVERED = re.compile(f"[^{COVERED}]")

#: HF's ByteLevel(use_regex=True) pattern (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_QWEN2_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
_O200K_PATTERN = "|".join((
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
))  # fmt: skip
#: Split patterns whose matches tile any text (see the module docstring), as tokenizer.json spells them.
TOTAL_PATTERNS = frozenset({GPT2_PATTERN, _LLAMA3_PATTERN, _QWEN2_PATTERN, _O200K_PATTERN})
#: The alternatives each of them ends with, and what they become without the lookahead (4. above).
_LOOKAHEAD_TAIL = r"|\s+(?!\S)|\s+"
_LOOKAHEAD_FREE_TAIL = r"|\s+"
#: The patterns where `\s*[\r\n]+` precedes the lookahead: a run ending in CR/LF never reaches it.
_NEWLINE_RUNS_FIRST = frozenset({_LLAMA3_PATTERN, _QWEN2_PATTERN, _O200K_PATTERN})
#: The patterns encoded without their lookahead where the text allows (o200k's is measured no faster:
#: its other alternatives cost as much either way).
_LOOKAHEAD_FREE_PATTERNS = frozenset({GPT2_PATTERN, _LLAMA3_PATTERN, _QWEN2_PATTERN})
#: `\s` of the regex engines (Unicode White_Space), ASCII and not; str.isspace differs (U+001C-U+001F).
_ASCII_SPACE = "\t\n\x0b\x0c\r "
_OTHER_SPACE = "\x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_ASCII_SPACE_RUN = re.compile(f"[{re.escape(_ASCII_SPACE)}]+")
#: Fewest characters per part, on average, for which cutting pays: a part costs ~3 us (a tiktoken
#: call, slicing, joining), P costs ~10-20 ns a character more than P'.
_MIN_PART_CHARS = 256
#: Fewest characters per tab, vertical tab or form feed hopped to while looking for runs.
_CHARS_PER_HOP = 128
#: Runs found before their density so far may end the search (more than one per `_MIN_PART_CHARS`).
_DENSE_RUNS = 16
#: The first window `LookaheadCuts` masks; dense runs show within it.
_FIRST_MASKED_CHARS = 2048


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character map, inverted: the character each byte is written as -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_CHAR_TO_BYTE = _byte_level_alphabet()


class LookaheadCuts:
    """Where a text may be cut so that a pattern less its lookahead splits it as the pattern does
    (4. in the module docstring): sans-IO, one per tokenizer.

    Every whitespace run of two or more characters holds two adjacent characters of it. With the
    patterns that take CR/LF runs first, a run to cut ends in two spaces (`str.find` of the pair)
    or holds a tab, vertical tab or form feed (hopped to: `str.find` of one character is a
    `memchr`). With GPT-2's, any run may need a cut, and looking for the four pairs of space and
    LF read the text four times, ~2 ns a character each (a two-character search reads every
    character). There, all pairs are marked at once: `bytes.translate` marks the whitespace (one
    byte a character, from a Latin-1 encoding where every other character becomes "?"), and one AND
    of that mask with itself shifted by a character, on Python's integers, leaves a byte set where
    a pair starts, found by `bytes.find` (a `memchr`): ~3x faster on a long prompt. A text with
    more runs than cutting pays for is left to the whole pattern, as soon as that shows.
    """

    __slots__ = ("_marks", "_newline_runs_first", "_special_at")

    def __init__(self, pattern: str, specials: Iterable[str]) -> None:
        #: With `\s*[\r\n]+` first, a run is cut only where its last two characters are neither CR
        #: nor LF (`_run_ends_found`). Otherwise any run is (`_run_ends_marked`).
        self._newline_runs_first = pattern in _NEWLINE_RUNS_FIRST
        #: GPT-2's: Latin-1 byte -> 1 for ASCII whitespace.
        marked = _ASCII_SPACE.encode()
        self._marks = None if self._newline_runs_first else bytes(byte in marked for byte in range(256))
        alternatives = sorted(specials, key=len, reverse=True)
        self._special_at = re.compile("|".join(map(re.escape, alternatives))).match if alternatives else None

    def __call__(self, text: str) -> list[int] | None:
        """The offsets to cut `text` at, in order; None when it has whitespace other than ASCII's,
        or so many runs that the whole pattern costs less."""
        if not text.isascii() and any(space in text for space in _OTHER_SPACE):
            return None
        ends = self._run_ends_found(text) if self._marks is None else self._run_ends_marked(text, self._marks)
        if ends is None:
            return None
        size = len(text)
        special_at = self._special_at
        newline_runs_first = self._newline_runs_first
        cuts = []
        for end in ends:
            if end == size or (special_at is not None and special_at(text, end)):
                continue  # the run ends its span: the pattern takes it whole, as P' does
            if newline_runs_first and (text[end - 2] in "\r\n" or text[end - 1] in "\r\n"):
                continue
            cuts.append(end - 1)
        return cuts

    @staticmethod
    def _run_ends_marked(text: str, whitespace: bytes) -> list[int] | None:
        """Where each run of two or more ends, in order, from masks of `text` (None: too many).

        The text is masked a window at a time, each 4x the last: dense runs (code) end the search
        within the first window, as they would `str.find`'s.
        """
        size = len(text)
        run = _ASCII_SPACE_RUN.match
        ends: list[int] = []
        start, window = 0, _FIRST_MASKED_CHARS
        while start < size:
            stop = min(size, start + window)
            # One character past the window: a pair may start at its last character.
            marks = text[start : stop + 1].encode("latin-1", "replace").translate(whitespace)
            marked = int.from_bytes(marks, "little")
            pairs = (marked & (marked >> 8)).to_bytes(len(marks), "little")  # byte i: marks i and i + 1
            next_start = stop
            at = pairs.find(1)
            while at >= 0:
                end = run(text, start + at).end()  # type: ignore[union-attr]  # the pair matches
                ends.append(end)
                if len(ends) >= _DENSE_RUNS and len(ends) * _MIN_PART_CHARS > end:
                    return None  # runs this dense (indented code): cutting would not pay, nor looking further
                if end >= stop:
                    next_start = end
                    break
                at = pairs.find(1, end - start)
            start, window = next_start, window * 4
        return ends

    @staticmethod
    def _run_ends_found(text: str) -> list[int] | None:
        """Where each run that may need a cut ends, in order, for the patterns that take CR/LF runs
        first (None: too many): such a run ends in two spaces, or holds a tab, vertical tab or form
        feed (the rest of such a run is tested where it is cut)."""
        size = len(text)
        run = _ASCII_SPACE_RUN.match
        ends: set[int] = set()
        found = 0
        at = text.find("  ")
        while at >= 0:
            end = run(text, at).end()  # type: ignore[union-attr]  # the pair matches
            ends.add(end)
            found += 1
            if found >= _DENSE_RUNS and found * _MIN_PART_CHARS > end:
                return None  # runs this dense (indented code): cutting would not pay, nor looking further
            at = text.find("  ", end)
        hops = max(16, size // _CHARS_PER_HOP)
        for char in "\t\x0b\x0c":
            found = 0
            at = text.find(char)
            while at >= 0:
                hops -= 1
                if hops < 0:
                    return None
                if (at + 1 < size and text[at + 1] in _ASCII_SPACE) or (at and text[at - 1] in _ASCII_SPACE):
                    end = run(text, at).end()  # type: ignore[union-attr]  # the run's end, from anywhere in it
                    ends.add(end)
                    found += 1
                    if found >= _DENSE_RUNS and found * _MIN_PART_CHARS > end:
                        return None
                    at = text.find(char, end)
                else:
                    at = text.find(char, at + 1)
        return sorted(ends)


class FastBPE:
    """tiktoken for one tokenizer, for the texts the proof covers; `encode` is None for the rest."""

    __slots__ = (
        "_buffers",
        "_cuts",
        "_encoding",
        "_lookahead_free",
        "_nfc",
        "_risky",
        "_specials",
        "prefix_ids",
        "suffix_ids",
    )

    def __init__(
        self,
        encoding: Any,
        *,
        risky: frozenset[int] = frozenset(),
        prefix_ids: Sequence[int] | None = None,
        suffix_ids: Sequence[int] = (),
        nfc: bool = False,
        lookahead_free: Any = None,
        cuts: LookaheadCuts | None = None,
    ) -> None:
        self._encoding = encoding
        #: The same encoding with the pattern less its lookahead, and where texts are cut for it.
        self._lookahead_free = lookahead_free if cuts is not None else None
        self._cuts = cuts
        self._nfc = nfc
        self._specials = frozenset(encoding.special_tokens_set)
        self._risky = risky
        #: What the post-processor puts around the ids (None: not known to be plain; use HF).
        self.prefix_ids = None if prefix_ids is None else list(prefix_ids)
        self.suffix_ids = list(suffix_ids)
        #: Whether tiktoken's core hands its ids out as a u32 buffer (`encode_u32le`), for each
        #: encoding used: a private method of the pinned tiktoken, looked for rather than assumed.
        self._buffers = all(
            callable(getattr(getattr(e, "_core_bpe", None), "encode_to_tiktoken_buffer", None))
            for e in (encoding, self._lookahead_free)
            if e is not None
        )

    @property
    def risky_ids(self) -> frozenset[int]:
        return self._risky

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int] | None:
        """HF's ids for `text`, or None when this text is not covered (then encode it with HF).

        Releases the GIL while it encodes (tiktoken's core does), as HF's batch call does.
        """
        if not self.covers(text):
            return None
        prefix = self.prefix_ids
        if add_special_tokens and prefix is None:
            return None
        ids = self._split_and_encode(text)
        if self._risky and not self._risky.isdisjoint(ids):
            return None
        if add_special_tokens and (prefix or self.suffix_ids):
            return [*prefix, *ids, *self.suffix_ids]  # type: ignore[misc]
        return ids

    def encode_u32le(self, text: str) -> bytes | None:
        """`encode(text)`'s ids as little-endian unsigned 32-bit ints, or None where `encode` is.

        tiktoken's core makes its ids as such ints, and hands them to `encode` as a list of Python
        ints (~11 ns an id) that the prefix cache then packed back into machine ints (~7 ns) for its
        segments and the wire; here they are taken from its buffer as they are. Where some ids are
        `risky` (checked per text against a set) the list is made and packed, as before.
        """
        if self._risky or not self._buffers:
            ids = self.encode(text)
            return None if ids is None else u32le_bytes(ids)
        if not self.covers(text):
            return None
        encoding, parts = self._parts(text)
        encode = encoding._core_bpe.encode_to_tiktoken_buffer
        specials = self._specials
        chunks = [memoryview(encode(part, specials)).cast("B") for part in parts]
        return u32le_from_native(chunks[0].tobytes() if len(chunks) == 1 else b"".join(chunks))

    def covers(self, text: str) -> bool:
        """Whether `encode` serves `text` (else it returns None, and HF encodes it)."""
        return text.isascii() or (
            _UNCOVERED.search(text) is None and (not self._nfc or unicodedata.is_normalized("NFC", text))
        )

    def _split_and_encode(self, text: str) -> list[int]:
        """tiktoken's ids for `text`: by the lookahead-free pattern where the text is cut for it,
        else by the tokenizer's own pattern."""
        specials = self._specials
        encoding, parts = self._parts(text)
        ids: list[int] = encoding.encode(parts[0], allowed_special=specials, disallowed_special=())
        for part in parts[1:]:
            ids += encoding.encode(part, allowed_special=specials, disallowed_special=())
        return ids

    def _parts(self, text: str) -> tuple[Any, list[str]]:
        """The encoding for `text` and the parts to encode it in: the lookahead-free pattern's, on
        the text cut where it is (4. in the module docstring), else the tokenizer's own, whole."""
        fast, find_cuts = self._lookahead_free, self._cuts
        cuts = None if fast is None or find_cuts is None else find_cuts(text)
        if fast is None or cuts is None or len(cuts) * _MIN_PART_CHARS > len(text):
            return self._encoding, [text]
        parts = []
        start = 0
        for cut in cuts:
            parts.append(text[start:cut])
            start = cut
        parts.append(text[start:])
        return fast, parts


@dataclass(frozen=True, slots=True)
class FastEncoderPlan:
    """Which encoder serves a tokenizer and why: `fast` is None when HF does."""

    fast: FastBPE | None
    reason: str
    seconds: float = 0.0

    @property
    def name(self) -> str:
        return "tiktoken" if self.fast is not None else "huggingface"


class _Refused(Exception):
    pass


def plan_fast_encoder(
    tokenizer_json: Mapping[str, Any],
    hf_model_tokenize: Callable[[list[str]], list[list[int]]] | None = None,
) -> FastEncoderPlan:
    """Decide from a parsed tokenizer.json whether tiktoken may encode for it, and build it if so.

    `hf_model_tokenize` runs HF's BPE model alone (no normalizer, pre-tokenizer or added tokens) on
    byte-level strings, for the whole-piece check (3. in the module docstring); it is needed only
    when the tokenizer lacks `ignore_merges`, and without it such a tokenizer stays on HF.
    """
    started = time.perf_counter()
    try:
        fast, reason = _plan(tokenizer_json, hf_model_tokenize)
    except _Refused as refusal:
        fast, reason = None, str(refusal)
    return FastEncoderPlan(fast, reason, time.perf_counter() - started)


def _plan(
    tj: Mapping[str, Any], hf_model_tokenize: Callable[[list[str]], list[list[int]]] | None
) -> tuple[FastBPE, str]:
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - a declared dependency
        raise _Refused("tiktoken is not installed")
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise _Refused(f"model is {model.get('type')}, not BPE")
    if model.get("dropout") is not None:
        raise _Refused("BPE dropout")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise _Refused("subword prefix or suffix")
    if model.get("byte_fallback"):
        raise _Refused("byte fallback")
    pattern = _pre_tokenizer_pattern(tj.get("pre_tokenizer"))
    nfc = _check_normalizer(tj.get("normalizer"))
    vocab: Mapping[str, int] = model.get("vocab") or {}
    if any(char not in vocab for char in _CHAR_TO_BYTE):
        raise _Refused("not every byte-level character is in the vocabulary")
    if len(set(vocab.values())) != len(vocab):
        raise _Refused("duplicate ids in the vocabulary")
    ranks: dict[bytes, int] = {}
    byte_level: dict[str, int] = {}
    to_byte = _CHAR_TO_BYTE
    for token, token_id in vocab.items():
        try:
            ranks[bytes([to_byte[c] for c in token])] = token_id
        except KeyError:
            continue  # not byte-level text: no merge can reach it from bytes (nor in HF)
        byte_level[token] = token_id
    merges = _merges(model.get("merges") or ())
    rank = _merge_ranks(byte_level, merges)
    specials, prefix_ids, suffix_ids = _added_tokens(tj.get("added_tokens") or (), tj.get("post_processor"))
    risky, unlisted, differ = _risky(byte_level, rank)
    ignore_merges = bool(model.get("ignore_merges"))
    if not ignore_merges:
        if hf_model_tokenize is None:
            raise _Refused("no way to check whole-piece merges (ignore_merges is false)")
        tokens = [t for t in byte_level if len(t) > 1]
        for token, ids in zip(tokens, hf_model_tokenize(tokens), strict=True):
            # A token spelling an added token is never a piece: that text is cut out first.
            if ids != [byte_level[token]] and _text(token) not in specials:
                risky.add(byte_level[token])
    encoding = tiktoken.Encoding(
        "trio-direct-fast-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials
    )
    lookahead_free = cuts = None
    spaces = _ASCII_SPACE + _OTHER_SPACE
    if pattern in _LOOKAHEAD_FREE_PATTERNS and not any(c in spaces for special in specials for c in special):
        lookahead_free = tiktoken.Encoding(
            "trio-direct-fast-bpe-lookahead-free",
            pat_str=pattern.removesuffix(_LOOKAHEAD_TAIL) + _LOOKAHEAD_FREE_TAIL,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
        cuts = LookaheadCuts(pattern, specials)
    fast = FastBPE(
        encoding,
        risky=frozenset(risky),
        prefix_ids=prefix_ids,
        suffix_ids=suffix_ids,
        nfc=nfc,
        lookahead_free=lookahead_free,
        cuts=cuts,
    )
    reason = (
        f"byte-level BPE with an exact tiktoken equivalent ({len(ranks)} tokens, {unlisted} with unlisted "
        f"splits, {differ} whose merge loops differ, {len(risky)} checked per text; texts in Latin scripts)"
    )
    return fast, reason


def _text(token: str) -> str | None:
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in token).decode()
    except UnicodeDecodeError:
        return None


def _pre_tokenizer_pattern(state: Mapping[str, Any] | None) -> str:
    if not state:
        raise _Refused("no pre-tokenizer")
    kind = state.get("type")
    if kind == "ByteLevel":
        if state.get("add_prefix_space") or not state.get("use_regex", True):
            raise _Refused("ByteLevel pre-tokenizer with a prefix space or without its regex")
        return GPT2_PATTERN
    if kind == "Sequence":
        parts: list[Any] = list(state.get("pretokenizers") or ())
        if len(parts) == 2 and parts[0].get("type") == "Split" and parts[1].get("type") == "ByteLevel":
            split, byte_level = parts
            pattern = str((split.get("pattern") or {}).get("Regex"))
            if split.get("behavior") != "Isolated" or split.get("invert") or pattern not in TOTAL_PATTERNS:
                raise _Refused("Split pre-tokenizer with an unknown pattern or behaviour")
            if byte_level.get("add_prefix_space") or byte_level.get("use_regex", True):
                raise _Refused("ByteLevel after Split with a prefix space or its own regex")
            return pattern
    raise _Refused(f"pre-tokenizer {kind} is not one tiktoken reproduces")


def _check_normalizer(state: Mapping[str, Any] | None) -> bool:
    """Accept normalizers that are the identity on NFC text; True when texts must be NFC."""
    if state is None:
        return False
    kind = state.get("type")
    if kind == "NFC":
        return True
    if kind == "Sequence":
        return any([_check_normalizer(inner) for inner in state.get("normalizers") or ()])
    raise _Refused(f"normalizer {kind}")


def _merges(raw: Iterable[Any]) -> list[tuple[str, str]]:
    out = []
    for merge in raw:
        if isinstance(merge, str):
            parts = merge.split(" ")
            if len(parts) != 2:
                raise _Refused("malformed merge")
            out.append((parts[0], parts[1]))
        else:
            out.append((merge[0], merge[1]))
    return out


def _merge_ranks(vocab: Mapping[str, int], merges: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """HF's rank of each byte-level merge, after checking (R)."""
    if len(set(merges)) != len(merges):
        raise _Refused("duplicate merges")
    rank: dict[tuple[str, str], int] = {}
    last = -1
    for index, (x, y) in enumerate(merges):
        merged_id = vocab.get(x + y)
        if merged_id is None or x not in vocab or y not in vocab:
            continue  # not byte-level: unreachable from bytes
        if merged_id < last:
            raise _Refused(f"merge order disagrees with token ids at {x!r} + {y!r} (R)")
        last = merged_id
        rank[(x, y)] = index
    return rank


def _unlisted(vocab: Mapping[str, int], rank: Mapping[tuple[str, str], int]) -> set[str]:
    """The tokens with a split into two tokens that is not a listed merge."""
    listed: dict[str, int] = {}
    for x, y in rank:
        listed[x + y] = listed.get(x + y, 0) + 1
    out: set[str] = set()
    for token in vocab:
        if listed.get(token, 0) == len(token) - 1:
            continue  # every cut is a listed merge
        if sum(1 for cut in range(1, len(token)) if token[:cut] in vocab and token[cut:] in vocab) > listed.get(
            token, 0
        ):
            out.add(token)
    return out


def _contains_any(token: str, targets: set[str], longest: int) -> bool:
    return any(
        token[i:j] in targets for i in range(len(token) - 1) for j in range(i + 2, min(len(token), i + longest) + 1)
    )


def _risky(vocab: Mapping[str, int], rank: Mapping[tuple[str, str], int]) -> tuple[set[int], int, int]:
    """`risky` of 2. in the module docstring (ids), the number of tokens with unlisted splits, and of D."""
    unlisted = _unlisted(vocab, rank)
    longest = max(map(len, unlisted), default=0)
    splits: dict[str, int] = {}
    for x, y in rank:
        splits[x + y] = splits.get(x + y, 0) + 1
    several = {token for token, count in splits.items() if count > 1}
    longest_several = max(map(len, several), default=0)
    differ: set[str] = set()
    for token in vocab:
        if len(token) < 2:
            continue
        # The loops can differ only at a candidate that is not a listed merge (its result, a token
        # with an unlisted split, is inside `token`) or at two candidates of different pairs with one
        # result (a token with several listed splits, seen twice inside `token`).
        suspect = (unlisted and _contains_any(token, unlisted, longest)) or (
            len(set(itertools.pairwise(token))) < len(token) - 1 and _contains_twice(token, several, longest_several)
        )
        if suspect and not _loops_agree(token, vocab, rank):
            differ.add(token)
    if not differ:
        return set(), len(unlisted), 0
    longest = max(map(len, differ))
    risky = {
        token_id
        for token, token_id in vocab.items()
        if _contains_any(token, differ, longest) and _tiktoken_loop_forms(token, vocab, differ)
    }
    return risky, len(unlisted), len(differ)


def _contains_twice(token: str, targets: set[str], longest: int) -> bool:
    """Whether some string of `targets` occurs at two places in `token` (both start with a bigram seen twice)."""
    starts: dict[str, list[int]] = {}
    for i in range(len(token) - 1):
        starts.setdefault(token[i : i + 2], []).append(i)
    seen: set[str] = set()
    for positions in starts.values():
        if len(positions) < 2:
            continue
        for i in positions:
            for j in range(i + 2, min(len(token), i + longest) + 1):
                part = token[i:j]
                if part in targets:
                    if part in seen:
                        return True
                    seen.add(part)
    return False


def _loops_agree(word: str, vocab: Mapping[str, int], rank: Mapping[tuple[str, str], int]) -> bool:
    """Whether tiktoken's and HF's merge loops on `word` alone make the same choice at every step."""
    never = 1 << 62
    parts = list(word)
    by_id = [vocab.get(parts[i] + parts[i + 1], never) for i in range(len(parts) - 1)]
    by_rank = [rank.get((parts[i], parts[i + 1]), never) for i in range(len(parts) - 1)]
    while by_id:
        least_id, least_rank = min(by_id), min(by_rank)
        if least_id == never or least_rank == never:
            return least_id == least_rank  # both stop, or one merges where the other stops
        i = by_id.index(least_id)  # leftmost, as both loops break ties
        if i != by_rank.index(least_rank):
            return False
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del by_id[i], by_rank[i]  # the merged pair; its neighbours change
        for j in (i - 1, i):
            if 0 <= j < len(by_id):
                by_id[j] = vocab.get(parts[j] + parts[j + 1], never)
                by_rank[j] = rank.get((parts[j], parts[j + 1]), never)
    return True


def _tiktoken_loop_forms(word: str, vocab: Mapping[str, int], targets: set[str]) -> bool:
    """Whether tiktoken's merge loop on `word` alone (no whole-piece lookup) forms a token of `targets`."""
    parts = list(word)
    while len(parts) > 1:
        best = -1
        best_id = 0
        for i in range(len(parts) - 1):
            merged_id = vocab.get(parts[i] + parts[i + 1])
            if merged_id is not None and (best < 0 or merged_id < best_id):
                best, best_id = i, merged_id
        if best < 0:
            return False
        merged = parts[best] + parts[best + 1]
        if merged in targets:
            return True
        parts[best : best + 2] = [merged]
    return False


def _added_tokens(
    added: Iterable[Mapping[str, Any]], post_processor: Mapping[str, Any] | None
) -> tuple[dict[str, int], list[int] | None, list[int]]:
    specials: dict[str, int] = {}
    kinds: dict[str, bool] = {}
    for token in added:
        content = token.get("content")
        if not isinstance(content, str) or not content:
            raise _Refused("an empty added token")
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            raise _Refused(f"added token {content!r} strips whitespace or matches single words")
        specials[content] = int(token["id"])
        kinds[content] = bool(token.get("normalized"))
    ordered = sorted(specials)
    for a, b in itertools.pairwise(ordered):
        if b.startswith(a):  # a prefix sorts right before its extensions
            raise _Refused(f"added token {a!r} is a prefix of {b!r}")
    normalized = [t for t, n in kinds.items() if n]
    plain = [t for t, n in kinds.items() if not n]
    if normalized and plain:
        for a in normalized:
            for b in plain:
                if _overlap(a, b):
                    raise _Refused(f"added tokens {a!r} and {b!r} overlap (matched in separate passes)")
    prefix, suffix = _post_processor_ids(post_processor)
    return specials, prefix, suffix


def _overlap(a: str, b: str) -> bool:
    if a in b or b in a:
        return True
    return any(b.startswith(a[i:]) for i in range(1, len(a))) or any(a.startswith(b[i:]) for i in range(1, len(b)))


def _post_processor_ids(state: Mapping[str, Any] | None) -> tuple[list[int] | None, list[int]]:
    """The ids a post-processor puts before and after a single sequence; (None, []) if not plain."""
    if state is None:
        return [], []
    kind = state.get("type")
    if kind == "ByteLevel":
        return [], []  # offsets only
    if kind == "Sequence":
        prefix: list[int] = []
        suffix: list[int] = []
        for inner in state.get("processors") or ():
            p, s = _post_processor_ids(inner)
            if p is None:
                return None, []
            prefix, suffix = [*p, *prefix], [*suffix, *s]
        return prefix, suffix
    if kind == "TemplateProcessing":
        tokens = state.get("special_tokens") or {}
        prefix, suffix = [], []
        seen_sequence = False
        for piece in state.get("single") or ():
            if "Sequence" in piece:
                if seen_sequence or piece["Sequence"].get("id") != "A":
                    return None, []
                seen_sequence = True
            elif "SpecialToken" in piece:
                entry = tokens.get(piece["SpecialToken"].get("id"))
                if entry is None:
                    return None, []
                (suffix if seen_sequence else prefix).extend(int(i) for i in entry.get("ids") or ())
            else:
                return None, []
        return (prefix, suffix) if seen_sequence else (None, [])
    return None, []
