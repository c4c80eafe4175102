"""KV cache events as the mock engine's radix cache emits them, and SGLang's block hashes.

In-memory shapes only: the wire encoding (msgpack maps or tagged arrays) belongs to the
publisher. Hashes follow SGLang 0.5.9+ (each page hashed with its parent's hash, as
``python/sglang/srt/mem_cache/radix_cache.py`` does) so that a router indexing the
mock's events sees the same ids a stock engine would publish for the same tokens.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

# The engine emits the very events a router decodes: one definition for both sides.
from trio_direct.routing.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KvEvent",
    "block_hash_chain",
    "page_digest",
    "page_hasher",
    "published_hash",
]


_SHA256 = hashlib.sha256
_PACKERS: dict[int, struct.Struct] = {}


def _packer(n: int) -> struct.Struct:
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f"<{n}I")
    return packer


def page_digest(parent_digest: bytes, page_tokens: Sequence[int]) -> bytes:
    """SHA-256 of the parent page's digest followed by the page's tokens as LE uint32."""
    try:
        payload = _packer(len(page_tokens)).pack(*page_tokens)
    except struct.error as exc:
        # SGLang switches to a "wide" encoding above 2**32; no real vocabulary gets there.
        raise ValueError(f"token ids must be in [0, 2**32) to hash: {exc}") from None
    return _SHA256(parent_digest + payload).digest()


def page_hasher(page_size: int) -> Callable[[bytes, Sequence[int], int], tuple[bytes, int]]:
    """A fast ``page_digest`` + ``published_hash`` for the page at ``token_ids[start:]``.

    For the radix cache's insert loop, which hashes every new page: it avoids slicing and
    per-call lookups but computes exactly what ``block_hash_chain`` does.
    """
    pack = _packer(page_size).pack
    sha = _SHA256
    from_bytes = int.from_bytes

    def hash_page(parent_digest: bytes, token_ids: Sequence[int], start: int) -> tuple[bytes, int]:
        try:
            if page_size == 1:
                payload = pack(token_ids[start])
            else:
                payload = pack(*token_ids[start : start + page_size])
        except struct.error as exc:
            raise ValueError(f"token ids must be in [0, 2**32) to hash: {exc}") from None
        digest = sha(parent_digest + payload).digest()
        return digest, from_bytes(digest[:8], "big", signed=True)

    return hash_page


def published_hash(digest: bytes) -> int:
    """The value SGLang publishes for a page: the digest's first 8 bytes as big-endian int64."""
    return int.from_bytes(digest[:8], "big", signed=True)


def block_hash_chain(token_ids: Sequence[int], page_size: int, parent_digest: bytes = b"") -> tuple[list[int], bytes]:
    """Hash every full page of ``token_ids`` as SGLang's chained SHA-256 does.

    The chain starts from ``parent_digest`` (empty at the radix root); the tail shorter than a
    page is ignored, as only full pages are cached. Returns the published hashes and the last
    digest, which continues the chain.
    """
    if page_size < 1:
        raise ValueError("page_size must be >= 1")
    hashes: list[int] = []
    digest = parent_digest
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        digest = page_digest(digest, token_ids[start : start + page_size])
        hashes.append(published_hash(digest))
    return hashes, digest
