"""Token ids of rendered chat prompts, reusing the ids of the prefixes earlier prompts shared.

Multi-turn chats and agents resend their whole history with every request: the rendered prompt of
turn n+1 starts with the one of turn n, and tokenizing it again costs ~1 ms per 1k tokens. This
cache keeps the ids of prompt *segments* in a trie, so a follow-up tokenizes only what is new.

BPE merges across any cut in plain text (the ids of `prefix + suffix` are not the ids of `prefix`
followed by those of `suffix`), so segments end only right after an *added token* (`<|im_end|>`,
`<｜User｜>`, ...), where the tokenizer itself splits its input: HF tokenizers cut the text at added
tokens first and normalize, pre-tokenize and encode each piece between them on its own. A cut there
is exact when, besides, (checked once per tokenizer, `cut_tokens`):

- the token's match cannot depend on the text after it: no `rstrip` (it would swallow the
  whitespace that follows) or `single_word`, no other added token that contains it or overlaps it,
  and it ends in a character that is neither a word character nor whitespace (a `single_word` or
  `lstrip` token right after the cut then sees the same boundary both ways);
- a `normalized` added token is matched after the normalizer ran on the piece around it, so it
  qualifies only when there is no normalizer (DeepSeek's `<｜User｜>` qualifies: its tokenizer has an
  empty one);
- no pre-tokenizer depends on a piece's position rather than its content (Metaspace's
  `prepend_scheme: first` adds "▁" only at offset 0), and the model is deterministic (no BPE
  dropout). Unknown pre-tokenizer types disqualify the tokenizer.

Segments are cut at the first such token at least `min_segment_chars` after the previous cut, a
choice that depends only on the text before the cut, so every prompt that shares a prefix cuts it
the same way. A segment's ids are stored only after checking, in the encoding they came from, that
each cut token's id sits where its text is (otherwise that prompt is simply not cached). The cache
is bounded by bytes (strings, ids and per-node overhead) and evicts the least recently used leaf
first. It is locked: prompts are encoded on worker threads as well as on the event loop's.

Each segment also keeps its ids packed as the engines' gRPC requests carry them (`encode_packed`,
`engine.packed_ids`): a follow-up turn's request reuses the history's packed ids too, and packs
only what it tokenized.

With an encoder that itself cuts its input at added tokens before anything else (`encode_parts`:
tiktoken, whose allowed special tokens are matched first and split the text into spans the regex
and the merges never cross), the new part of a prompt is encoded segment by segment, and each
segment's ids are its own encoding: the check is then that each one ends with its cut token's id.
That skips searching the whole prompt's ids for every cut token's id (~0.3 ms for a new 19k-token
prompt, where the encoding itself takes ~2.3 ms). A part that encoder does not cover (a text it
returns None for) sends the prompt down the general path above. That encoder gives its ids as
little-endian u32 bytes (`FastBPE.encode_u32le`, tiktoken's own buffer): a segment's array and its
payload for the wire are made from them, a new prompt's ids never become Python ints.
"""

from __future__ import annotations

import json
import re
import struct
import sys
import threading
import unicodedata
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from trio_direct.engine.packed_ids import pack_ids, pack_u32le, u32_array, u32le_bytes

__all__ = ["DEFAULT_MAX_BYTES", "PrefixCacheStats", "PromptLookup", "PromptPrefixCache", "cut_tokens"]

#: Default bound of one cache: ~550 distinct 8k-token conversation prefixes of ASCII text (the text,
#: its ids, and the ids packed for the wire).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024

#: Shortest segment worth a trie node: chat templates put two added tokens around every message
#: header ("<|im_end|>\n<|im_start|>"); cutting at both would make nodes of a dozen characters.
DEFAULT_MIN_SEGMENT_CHARS = 256

#: Bytes counted per trie node besides its text and ids (the node, its dict entry, the LRU entry).
_NODE_OVERHEAD = 400

#: Pre-tokenizers that split a piece by its content alone (Metaspace is checked separately).
_CONTENT_PRE_TOKENIZERS = frozenset({
    "BertPreTokenizer", "ByteLevel", "CharDelimiterSplit", "Digits", "FixedLength", "Metaspace",
    "Punctuation", "Sequence", "Split", "UnicodeScripts", "Whitespace", "WhitespaceSplit",
})  # fmt: skip


def _pre_tokenizers_content_only(state: Any) -> bool:
    if state is None:
        return True
    kind = state.get("type")
    if kind not in _CONTENT_PRE_TOKENIZERS:
        return False
    if kind == "Metaspace" and str(state.get("prepend_scheme", "always")).lower() == "first":
        return False
    return all(_pre_tokenizers_content_only(inner) for inner in state.get("pretokenizers") or ())


def _identity_normalizer(tokenizer: Tokenizer) -> bool:
    normalizer = tokenizer.normalizer
    if normalizer is None:
        return True
    state = json.loads(normalizer.__getstate__())
    return state.get("type") == "Sequence" and not state.get("normalizers")


def _is_word_or_space(char: str) -> bool:
    return char.isspace() or char == "_" or unicodedata.category(char)[0] in "LN"


def _self_overlapping(text: str) -> bool:
    """A proper suffix of `text` is also its prefix ("abab"): two occurrences could share characters."""
    return any(text.startswith(text[i:]) for i in range(1, len(text)))


def cut_tokens(tokenizer: Tokenizer, candidates: Iterable[str] | None = None) -> dict[str, int]:
    """The added tokens after which this tokenizer's output provably splits, with their ids.

    Empty when the tokenizer's pipeline cannot be cut anywhere (see the module docstring).
    `candidates` narrows the search to those token texts (say, the ones a chat template writes).
    """
    model = tokenizer.model
    if getattr(model, "dropout", None):
        return {}
    pre_tokenizer = tokenizer.pre_tokenizer
    if pre_tokenizer is not None and not _pre_tokenizers_content_only(json.loads(pre_tokenizer.__getstate__())):
        return {}
    added = tokenizer.get_added_tokens_decoder()
    contents = {token.content for token in added.values() if token.content}
    # Which added tokens end / start with a given string: a token overlaps another when a proper
    # suffix of one is a prefix of the other.
    ends: dict[str, set[str]] = {}
    starts: dict[str, set[str]] = {}
    for other in contents:
        for i in range(1, len(other)):
            ends.setdefault(other[i:], set()).add(other)
            starts.setdefault(other[:i], set()).add(other)
    wanted = None if candidates is None else set(candidates)
    identity = _identity_normalizer(tokenizer)
    found: dict[str, int] = {}
    for token_id, token in added.items():
        text = token.content
        if not text or (wanted is not None and text not in wanted):
            continue
        if token.rstrip or token.single_word or _is_word_or_space(text[-1]) or _self_overlapping(text):
            continue
        if token.normalized and not identity:
            continue
        if tokenizer.token_to_id(text) != token_id:
            continue
        others = contents - {text}
        contained = any(text in other for other in others) or any(
            text[i:j] in others for i in range(len(text)) for j in range(i + 1, len(text) + 1)
        )
        overlapping = any(ends.get(text[:k], set()) - {text} for k in range(1, len(text))) or any(
            starts.get(text[k:], set()) - {text} for k in range(1, len(text))
        )
        if not contained and not overlapping:
            found[text] = token_id
    return found


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters since start: prompts encoded, how many reused a cached prefix, characters reused."""

    prompts: int = 0
    hits: int = 0
    reused_chars: int = 0
    encoded_chars: int = 0
    #: Prompts whose encoding did not put a cut token's id where its text is: encoded, not cached.
    unverified: int = 0
    nodes: int = 0
    bytes: int = 0
    evicted: int = 0


def _joined(payloads: list[bytes | None]) -> bytes | None:
    """The payloads back to back (a packed field's payloads concatenate), or None if one is missing."""
    parts: list[bytes] = []
    for payload in payloads:
        if payload is None:
            return None
        parts.append(payload)
    return b"".join(parts)


#: The array typecode of a native unsigned 32-bit integer (`engine.packed_ids.u32_array`): what
#: segments, and the ids `finish` returns, are kept in (4 bytes an id, where a list of Python ints
#: takes ~40), the same type the KV router hashes blocks over (`routing.block_hash.token_array`
#: takes such an array as it is).
_U32 = "I"
_LAST_ID = struct.Struct("<I").unpack_from


def _machine_ints(ids: list[int]) -> tuple[bytes, array] | None:
    """`ids` as unsigned 32-bit ints, in little-endian bytes (which `pack_u32le` packs for the wire)
    and in an array (a segment keeps the array); None for an id outside them, which no exact
    tokenizer gives. `struct` packs a list of ints in ~half the time `array(_U32, ids)` takes."""
    try:
        data = u32le_bytes(ids)
    except struct.error:
        return None
    return data, u32_array(data)


@dataclass(slots=True)
class PromptLookup:
    """What `PromptPrefixCache.lookup` found of a prompt: its cached prefix (the trie's `path` from
    below the root, covering `text[:start]`), and where `finish` cuts the rest (`occurrences`, `cuts`)."""

    text: str
    occurrences: list[tuple[int, int]]
    cuts: list[int]
    path: list[_Node]
    start: int

    @property
    def new_chars(self) -> int:
        """Characters `finish` will encode: those after the cached prefix."""
        return len(self.text) - self.start

    @property
    def cached_ids(self) -> int:
        """Ids `finish` will take from the cache."""
        return sum(len(node.ids) for node in self.path)


class _Node:
    """A segment: its text (`key`), its ids, and those ids packed for the wire (`payload`)."""

    __slots__ = ("alive", "children", "ids", "key", "parent", "payload", "size")

    def __init__(self, key: str, ids: array, parent: _Node | None, payload: bytes | None = None) -> None:
        self.children: dict[str, _Node] | None = None  # most nodes are leaves: no dict for them
        self.key = key
        self.ids = ids
        self.payload = payload
        self.parent = parent
        self.size = sys.getsizeof(key) + ids.itemsize * len(ids) + len(payload or b"") + _NODE_OVERHEAD
        self.alive = True


class PromptPrefixCache:
    """A trie of prompt segments (each ending right after a cut token) and their token ids.

    `encode(text)` returns exactly what `encode_uncached(text)` returns (the tokenizer's encoding
    without special tokens added), computing only the part after the longest cached prefix.
    """

    def __init__(
        self,
        encode_uncached: Callable[[str], list[int]],
        cut_token_ids: dict[str, int],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_segment_chars: int = DEFAULT_MIN_SEGMENT_CHARS,
        encode_parts: Callable[[str], bytes | None] | None = None,
    ) -> None:
        """`encode_parts`: the same ids as `encode_uncached` (or None for a text it does not cover),
        as little-endian unsigned 32-bit ints, from an encoder whose ids of a text cut right after
        an added token are the ids of the two parts, one after the other (see the module docstring)."""
        if not cut_token_ids:
            raise ValueError("a prefix cache needs at least one cut token")
        self._encode = encode_uncached
        self._encode_parts = encode_parts
        self._ids = dict(cut_token_ids)
        # Longest first: no cut token contains another (cut_tokens), so the order only documents intent.
        self._pattern = re.compile("|".join(re.escape(t) for t in sorted(self._ids, key=len, reverse=True)))
        self.max_bytes = max_bytes
        self.min_segment_chars = min_segment_chars
        self.stats = PrefixCacheStats()
        self._root = _Node("", array(_U32), None)
        self._root.size = 0
        self._lru: OrderedDict[_Node, None] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: Tokenizer,
        encode_uncached: Callable[[str], list[int]],
        *,
        candidates: Iterable[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_segment_chars: int = DEFAULT_MIN_SEGMENT_CHARS,
        encode_parts: Callable[[str], bytes | None] | None = None,
    ) -> PromptPrefixCache | None:
        """A cache for `tokenizer`, or None when no added token is a provably exact cut."""
        found = cut_tokens(tokenizer, candidates)
        if not found:
            return None
        return cls(
            encode_uncached,
            found,
            max_bytes=max_bytes,
            min_segment_chars=min_segment_chars,
            encode_parts=encode_parts,
        )

    @property
    def cut_token_texts(self) -> tuple[str, ...]:
        return tuple(self._ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added), reusing and then extending the cache."""
        ids = self.encode_packed(text, pack=False)[0]
        return ids.tolist() if isinstance(ids, array) else list(ids)

    def encode_packed(self, text: str, *, pack: bool = True) -> tuple[Sequence[int], bytes | None]:
        """`encode(text)`, and the ids packed for the wire (`engine.packed_ids.pack_ids`; None when
        they cannot be, or `pack` is false): the cached prefix's payloads are reused, only the rest
        is packed. Every new segment keeps its payload for the prompts that will share it."""
        return self.finish(self.lookup(text), pack=pack)

    def lookup(self, text: str) -> PromptLookup:
        """`text`'s longest cached prefix: the first half of `encode_packed`, which `finish`
        completes. It costs a search of `text` for cut tokens and a walk down the trie, so that a
        caller can learn what is left to encode (`PromptLookup.new_chars`) before deciding where
        to encode it (the event loop or a worker thread)."""
        occurrences, cuts = self._scan(text)
        path: list[_Node] = []
        start = 0
        node = self._root
        if cuts:
            with self._lock:
                for end in cuts:
                    children = node.children
                    child = None if children is None else children.get(text[start:end])
                    if child is None:
                        break
                    path.append(child)
                    node, start = child, end
                self._touch(path)
        return PromptLookup(text, occurrences, cuts, path, start)

    def finish(self, found: PromptLookup, *, pack: bool = True) -> tuple[Sequence[int], bytes | None]:
        """`encode_packed(found.text)` from what `lookup` found: the cached prefix's ids and payloads
        (a segment's never change once made, so they are read without the lock), the rest encoded
        and the new segments cached. The trie may have changed since `lookup`: a segment evicted
        meanwhile still holds its ids, and new segments are only added below a node still in it.

        The ids of a prompt with cut tokens come as an array of unsigned 32-bit ints (`_U32`): the
        cached prefix's and the new segments' arrays copied into it at C speed, where a list would
        make a Python int of every id (a long prompt's ~20k of them, ~40 bytes each, walked by every
        young garbage collection while the request lives). A prompt without cut tokens gets the
        encoder's list."""
        text, occurrences, cuts, path, start = found.text, found.occurrences, found.cuts, found.path, found.start
        node = path[-1] if path else self._root
        stats = self.stats
        if not cuts:
            with self._lock:
                stats.prompts += 1
                stats.encoded_chars += len(text)
            whole = self._encode(text)
            return whole, pack_ids(whole) if pack else None
        ids = array(_U32)
        payloads: list[bytes | None] = []
        for child in path:
            ids.extend(child.ids)  # one type: a copy of the segment's memory
            payloads.append(child.payload)
        if start:
            rest = text[start:]
            occurrences = [(end - start, token_id) for end, token_id in occurrences if end > start]
            cuts = [end - start for end in cuts if end > start]
        else:
            rest = text
        parts = None if self._encode_parts is None or not cuts else self._encoded_in_parts(rest, occurrences, cuts)
        segments: list[tuple[str, array, bytes | None]] | None
        tail: bytes | list[int]
        if parts is not None:
            segments, tail = parts
        else:
            rest_ids = self._encode(rest)
            segments = self._segments(rest, rest_ids, occurrences, cuts)
            tail = rest_ids if segments is None else rest_ids[sum(len(segment[1]) for segment in segments) :]
        with self._lock:
            stats.prompts += 1
            stats.hits += start > 0
            stats.reused_chars += start
            stats.encoded_chars += len(rest)
            if segments is None:
                stats.unverified += 1
            elif segments and node.alive:
                self._insert(node, path, segments)
        payload = None
        if pack:
            # The new segments were packed as they were cut: only the tail after them is left.
            payloads.extend(segment[2] for segment in segments or ())
            payloads.append(pack_u32le(tail) if isinstance(tail, bytes) else pack_ids(tail))
            payload = _joined(payloads)
        for segment in segments or ():
            ids.extend(segment[1])
        if isinstance(tail, bytes):
            ids.extend(u32_array(tail))
            return ids, payload
        try:
            ids.fromlist(tail)
        except (OverflowError, TypeError):  # an id no u32 holds: not from an exact tokenizer
            return [*ids, *tail], payload
        return ids, payload

    def clear(self) -> None:
        with self._lock:
            for node in self._lru:
                node.alive = False
            self._lru.clear()
            self._root.children = None
            self.stats.nodes = self.stats.bytes = 0

    # --- internals (the lock held where noted) --------------------------------------------------------

    def _scan(self, text: str) -> tuple[list[tuple[int, int]], list[int]]:
        """Every cut token in `text` as (end offset, id), and the chosen cuts: each the first cut token
        ending `min_segment_chars` or more past the previous cut (a choice that depends only on the
        text before the cut)."""
        occurrences: list[tuple[int, int]] = []
        cuts: list[int] = []
        ids = self._ids
        last = 0
        gap = self.min_segment_chars
        for match in self._pattern.finditer(text):
            end = match.end()
            occurrences.append((end, ids[match.group()]))
            if end - last >= gap:
                cuts.append(end)
                last = end
        return occurrences, cuts

    @staticmethod
    def _segments(
        text: str, ids: list[int], occurrences: list[tuple[int, int]], cuts: list[int]
    ) -> list[tuple[str, array, bytes | None]] | None:
        """`text` split at `cuts` with the ids of each piece before the last cut (and those ids
        packed for the wire); None when `ids` do not hold each cut token's id where its text is
        (`occurrences`, offsets in `text`).

        The check: each cut token's id occurs in `ids` exactly as often as its text in `text`, and
        the n-th occurrence of any cut token's text maps to a later position than the one before
        it. The ids are searched as packed machine integers (`bytes.find`, at C speed: a 19k-token
        prompt's ids are 76 kB), where comparing Python ints (`list.count`) cost ~1 ms.
        """
        if not cuts:
            return []
        machine = _machine_ints(ids)
        if machine is None:
            return None
        data, packed = machine
        width = packed.itemsize
        positions: dict[int, list[int]] = {}
        for _, token_id in occurrences:
            if token_id in positions:
                continue
            found: list[int] = []
            needle = struct.pack("<I", token_id)
            at = data.find(needle)
            while at >= 0:
                if at % width == 0:  # a match across two ids is none
                    found.append(at // width)
                at = data.find(needle, at + 1)
            positions[token_id] = found
        seen: dict[int, int] = {}
        for _, token_id in occurrences:
            seen[token_id] = seen.get(token_id, 0) + 1
        if any(len(positions[token_id]) != count for token_id, count in seen.items()):
            return None  # some occurrence was not encoded as the added token: its cut is not exact
        segments: list[tuple[str, array, bytes | None]] = []
        wanted = iter(cuts)
        target: int | None = next(wanted)
        taken = dict.fromkeys(positions, 0)
        previous = -1
        text_start = ids_start = 0
        for end, token_id in occurrences:
            position = positions[token_id][taken[token_id]]
            taken[token_id] += 1
            if position <= previous:
                return None  # the ids hold the cut tokens in another order than the text
            previous = position
            if end == target:
                piece = data[width * ids_start : width * (position + 1)]
                segments.append((text[text_start:end], packed[ids_start : position + 1], pack_u32le(piece)))
                text_start, ids_start = end, position + 1
                target = next(wanted, None)
                if target is None:
                    break
        return segments

    def _encoded_in_parts(
        self, text: str, occurrences: list[tuple[int, int]], cuts: list[int]
    ) -> tuple[list[tuple[str, array, bytes | None]], bytes] | None:
        """`text`'s segments (as `_segments` makes them), each encoded on its own by `encode_parts`,
        and the ids of the tail after them (as that encoder gives them); None when it does not
        cover a part, or a segment's ids do not end with its cut token's id (not to be expected of
        such an encoder: checked anyway)."""
        encode = self._encode_parts
        assert encode is not None
        token_at = dict(occurrences)
        segments: list[tuple[str, array, bytes | None]] = []
        start = 0
        for end in cuts:
            piece = text[start:end]
            data = encode(piece)
            if not data or _LAST_ID(data, len(data) - 4)[0] != token_at[end]:
                return None
            segments.append((piece, u32_array(data), pack_u32le(data)))
            start = end
        tail = encode(text[start:])
        if tail is None or not segments:
            return None
        return segments, tail

    def _touch(self, path: list[_Node]) -> None:
        """Mark `path` (root to leaf) used, children before parents: a parent is always more recent
        than its children, so the least recently used node is a leaf. Lock held."""
        move = self._lru.move_to_end
        for node in reversed(path):
            move(node)

    def _insert(self, node: _Node, path: list[_Node], segments: list[tuple[str, array, bytes | None]]) -> None:
        """Add `segments` below `node` (reached through `path`), then evict to the bound. Lock held."""
        stats = self.stats
        added: list[_Node] = []
        for key, ids, payload in segments:
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(key)
            if child is None:  # another thread may have added it meanwhile
                child = children[key] = _Node(key, ids, node, payload)
                self._lru[child] = None
                stats.nodes += 1
                stats.bytes += child.size
            added.append(child)
            node = child
        self._touch(path + added)
        while stats.bytes > self.max_bytes and self._lru:
            oldest, _ = self._lru.popitem(last=False)
            self._drop(oldest)

    def _drop(self, node: _Node) -> None:
        """Remove `node` and anything below it (a leaf, unless the LRU order was broken). Lock held."""
        stats = self.stats
        todo = [node]
        while todo:
            current = todo.pop()
            if current.children:
                todo.extend(current.children.values())
            if current is not node:
                self._lru.pop(current, None)
            current.alive = False
            stats.nodes -= 1
            stats.bytes -= current.size
            stats.evicted += 1
        parent = node.parent
        if parent is not None and parent.children is not None:
            parent.children.pop(node.key, None)
