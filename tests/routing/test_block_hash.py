"""Router-side block hashes reproduce Dynamo/smg's token-id keying (kv-events.md §7)."""

from __future__ import annotations

from array import array

import pytest
import xxhash

from trio_direct.routing.block_hash import (
    RoutingKey,
    local_block_hashes,
    prefix_hashes,
    sequence_hashes,
    token_bytes,
)

# kv-events.md §7, computed with xxhash.xxh3_64_intdigest(data, seed=1337)
VECTORS = [
    (
        [1, 2, 3, 4],
        2,
        [10773075109927122010, 2662118915037317746],
        [10773075109927122010, 5890102321129957602],
    ),
    (
        [1, 2, 3, 4],
        1,
        [14426539925402682893, 132880511001376177, 9232589889711073482, 13814194016428080928],
        [14426539925402682893, 12095906288214270103, 7197499903451023458, 13067224698470837106],
    ),
]


@pytest.mark.parametrize(("tokens", "block_size", "local", "sequence"), VECTORS)
def test_reference_vectors(tokens, block_size, local, sequence):
    assert local_block_hashes(tokens, block_size) == local
    assert sequence_hashes(local) == sequence
    assert prefix_hashes(tokens, block_size) == sequence


def test_only_complete_blocks_are_hashed():
    assert local_block_hashes([1, 2, 3, 4, 5], 2) == local_block_hashes([1, 2, 3, 4], 2)
    assert prefix_hashes([1, 2, 3, 4, 5, 6, 7], 4) == prefix_hashes([1, 2, 3, 4], 4)
    assert prefix_hashes([1, 2, 3], 4) == []


@pytest.mark.parametrize("blocks", [0, 1, 255, 256, 257, 512, 700])
def test_long_prompts_hash_like_one_block_at_a_time(blocks):
    # Long prompts are split many blocks per C call; every block must still be hashed alone.
    block = 4
    tokens = [(i * 7919) % 150_000 for i in range(blocks * block + 3)]
    local = [
        xxhash.xxh3_64_intdigest(token_bytes(tokens[i : i + block]), seed=1337) for i in range(0, blocks * block, block)
    ]
    assert local_block_hashes(tokens, block) == local
    assert prefix_hashes(tokens, block) == sequence_hashes(local)


def test_a_chain_can_be_continued_from_a_parent_hash():
    whole = prefix_hashes(list(range(64)), 8)
    head = prefix_hashes(list(range(24)), 8)
    assert prefix_hashes(list(range(24, 64)), 8, parent=head[-1]) == whole[3:]
    local = local_block_hashes(list(range(64)), 8)
    assert sequence_hashes(local[3:], parent=head[-1]) == whole[3:]


def test_sequence_hash_names_the_whole_prefix():
    # Same last block after a different first block: different identity.
    assert prefix_hashes([9, 9, 5, 6], 2)[1] != prefix_hashes([1, 2, 5, 6], 2)[1]
    assert prefix_hashes([9, 9, 5, 6], 2)[0] != prefix_hashes([5, 6], 2)[0]


def test_inputs_of_any_sequence_type_hash_alike():
    tokens = [0, 1, 65535, 2**32 - 1, 151643, 7, 8, 9]
    expected = prefix_hashes(tokens, 4)
    assert prefix_hashes(tuple(tokens), 4) == expected
    assert prefix_hashes(array("I", tokens), 4) == expected
    assert token_bytes(tokens)[:8] == b"\x00\x00\x00\x00\x01\x00\x00\x00"


@pytest.mark.parametrize("bad", [[-1], [2**32]])
def test_token_ids_outside_u32_are_refused(bad):
    with pytest.raises(ValueError):
        prefix_hashes(bad, 1)


def test_block_size_must_be_positive():
    with pytest.raises(ValueError):
        local_block_hashes([1, 2], 0)
    with pytest.raises(ValueError):
        prefix_hashes([1, 2], 0)


def test_routing_key_is_a_hashable_value():
    assert RoutingKey("e1", 0) == RoutingKey("e1", 0)
    assert len({RoutingKey("e1", 0), RoutingKey("e1", 1), RoutingKey("e1")}) == 3
    assert RoutingKey("e1").dp_rank is None
