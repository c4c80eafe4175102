"""SGLang's own page hashes (0.5.9+, no LoRA or cache-salt namespace), to check a guess against.

The index keys routing blocks by token ids, never by engine hashes (their algorithm varies by
release and namespace). It uses this only to tell apart candidate prefixes for a page it never
saw stored (`KvIndex` anchors): the published hash of a page names its whole prefix, so of two
prompts that could explain a store, the one whose pages hash to the store's parent is the one.
An engine hashing otherwise simply never confirms a candidate.

SGLang: ``d_i = SHA256(d_{i-1} || page_i's token ids as little-endian u32)``, ``d_0 = b""``; the
published value is the first 8 bytes of ``d_i`` as a big-endian signed int64.
"""

from __future__ import annotations

from hashlib import sha256

__all__ = ["MAX_CHECKED_PAGES", "same_engine_hash", "sglang_prefix_hash"]

#: Longest prefix (in pages) checked: one SHA-256 per page, on the event loop.
MAX_CHECKED_PAGES = 8192

_U64 = (1 << 64) - 1


def sglang_prefix_hash(token_bytes: bytes | memoryview, page_size: int) -> int | None:
    """The hash SGLang publishes for the last page of a prefix given as little-endian u32 bytes.

    ``None`` for an empty prefix, one that is not whole pages, or one longer than
    `MAX_CHECKED_PAGES` pages.
    """
    step = 4 * page_size
    view = memoryview(token_bytes).cast("B")
    if not view or len(view) % step or len(view) // step > MAX_CHECKED_PAGES:
        return None
    digest = b""
    for start in range(0, len(view), step):
        digest = sha256(digest + view[start : start + step]).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def same_engine_hash(a: int, b: int) -> bool:
    """Engine hashes compare as 64-bit values, whether published signed or unsigned."""
    return a & _U64 == b & _U64
