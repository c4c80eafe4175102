"""The router's check of SGLang's page hashes agrees with SGLang's published test vectors."""

from __future__ import annotations

import pytest

from trio_direct.mock.kv_types import block_hash_chain
from trio_direct.routing.block_hash import token_bytes
from trio_direct.routing.engine_hash import MAX_CHECKED_PAGES, same_engine_hash, sglang_prefix_hash


@pytest.mark.parametrize(
    ("tokens", "page_size", "published"),
    [
        ([1, 2, 3, 4], 2, [3817746824117602890, -4216701448867210342]),
        ([1, 2, 3, 4], 1, [7470307888890966271, -1634645291211865391, 7325169757385981536, -4123756397210254169]),
    ],
)
def test_the_last_page_hash_is_sglangs(tokens, page_size, published):
    for pages in range(1, len(published) + 1):
        prefix = token_bytes(tokens[: pages * page_size])
        assert sglang_prefix_hash(prefix, page_size) == published[pages - 1]
    assert block_hash_chain(tokens, page_size)[0] == published  # and the mock engine publishes the same


def test_what_is_not_whole_pages_or_too_long_is_not_checked():
    assert sglang_prefix_hash(b"", 1) is None
    assert sglang_prefix_hash(token_bytes([1, 2, 3]), 2) is None
    assert sglang_prefix_hash(token_bytes([7] * (MAX_CHECKED_PAGES + 1)), 1) is None


def test_signed_and_unsigned_publications_of_a_hash_are_the_same():
    assert same_engine_hash(-1, 2**64 - 1)
    assert not same_engine_hash(1, 2)
