"""Prompt ids packed where they are tokenized: each API's engine parses the very request it would
get with the ids set in place, and a payload never travels with other ids than its own."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_direct._proto.native import sglang_pb2 as native_pb
from trio_direct._proto.smg import sglang_scheduler_pb2 as smg_pb
from trio_direct._proto.vllm import vllm_engine_pb2 as vllm_pb
from trio_direct.engine import native, smg, vllm
from trio_direct.engine.packed_ids import PackedIds, Serialized, pack_ids, pack_u32le, packed_request
from trio_direct.engine.types import Bootstrap, GenerateInput, SamplingOptions

_ids = st.lists(st.integers(0, 2**31 - 1) | st.sampled_from([0, 127, 128, 16383, 16384, 151_643]), max_size=300)


@settings(max_examples=200, deadline=None)
@given(ids=_ids)
def test_the_payload_is_what_protobuf_writes_for_the_ids(ids):
    reference = native_pb.GenerateRequest(input_ids=ids).SerializeToString()
    payload = pack_ids(ids)
    assert payload is not None
    parsed = native_pb.GenerateRequest()
    parsed.ParseFromString(b"\x0a" + _varint(len(payload)) + payload)
    assert list(parsed.input_ids) == ids
    assert (b"\x0a" + _varint(len(payload)) + payload if ids else b"") == reference


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 2**32 - 1) | st.sampled_from([0, 127, 128, 2**21, 2**28, 2**32 - 1]), max_size=2000))
def test_u32_bytes_pack_as_protobuf_writes_their_ids(ids):
    """Long prompts are packed from their ids' u32 bytes (a fixed32 field's parse, copied into the
    uint32 one by protobuf's runtime): the very varints protobuf writes from the ids themselves,
    over the whole uint32 range, from `pack_u32le` and from `pack_ids` past its bulk threshold."""
    reference = smg_pb.TokenizedInput(input_ids=ids).SerializeToString()
    payload = pack_u32le(struct.pack(f"<{len(ids)}I", *ids))
    assert (b"\x12" + _varint(len(payload)) + payload if ids else b"") == reference
    assert pack_ids(ids) == payload


@pytest.mark.parametrize("ids", [[-1], [1, 2**32], [0, "3"], [0] * 500 + [-1], [7] * 500 + [2**32], [0] * 500 + ["3"]])
def test_ids_no_api_takes_are_not_packed(ids):
    assert pack_ids(ids) is None


def _requests() -> list[GenerateInput]:
    sampling = SamplingOptions(temperature=0.0, max_new_tokens=9, seed=7, stop=("END",), stop_token_ids=[3])
    return [
        GenerateInput(rid="plain", input_ids=[5]),
        GenerateInput(rid="long", input_ids=list(range(0, 300_000, 7)), sampling=sampling, original_text="héllo"),
        GenerateInput(
            rid="pd",
            input_ids=[1, 2, 3, 200_000],
            sampling=sampling,
            routed_dp_rank=1,
            bootstrap=Bootstrap("10.0.0.1", 8998, 12345),
            return_logprob=True,
            top_logprobs_num=2,
            logprob_start_len=0,
            original_text="abc",
        ),
    ]


_APIS: dict[str, tuple[Callable[..., Any], tuple[int, ...], Any]] = {
    "native": (native.generate_request, native._IDS_PATH, native_pb.GenerateRequest),
    "smg": (smg.generate_request, smg._IDS_PATH, smg_pb.GenerateRequest),
    "vllm": (partial(vllm.generate_request, defaults={"temperature": 0.6}), vllm._IDS_PATH, vllm_pb.GenerateRequest),
}


@pytest.mark.parametrize("api", sorted(_APIS))
@pytest.mark.parametrize("request_", _requests(), ids=lambda r: r.rid)
def test_each_api_parses_the_request_it_would_get_with_the_ids_in_place(api, request_):
    build, path, message_type = _APIS[api]
    expected = build(request_)
    packed = replace(request_, packed_input_ids=PackedIds.of(request_.input_ids, pack_ids(request_.input_ids)))
    sent = packed_request(packed, build, path)
    assert isinstance(sent, Serialized)
    parsed = message_type.FromString(sent.SerializeToString())
    assert parsed == expected
    ids = parsed.input_ids if api == "native" else parsed.tokenized.input_ids
    assert list(ids) == request_.input_ids


def test_a_payload_goes_only_with_the_list_it_was_made_from():
    ids = [1, 2, 3]
    packed = PackedIds.of(ids, pack_ids(ids))
    request = GenerateInput(rid="r", input_ids=ids, packed_input_ids=packed)
    assert isinstance(packed_request(request, native.generate_request, native._IDS_PATH), Serialized)
    # A migrated request resends the prompt and what was generated: a new list, the message built as before.
    migrated = replace(request, input_ids=[*ids, 9])
    sent = packed_request(migrated, native.generate_request, native._IDS_PATH)
    assert isinstance(sent, native_pb.GenerateRequest) and list(sent.input_ids) == [1, 2, 3, 9]
    ids.append(4)  # the same list grown: its payload is stale, so it is not used
    sent = packed_request(request, native.generate_request, native._IDS_PATH)
    assert isinstance(sent, native_pb.GenerateRequest) and list(sent.input_ids) == [1, 2, 3, 4]
    unpackable = GenerateInput(rid="r", input_ids=ids, packed_input_ids=PackedIds.of(ids, None))
    assert isinstance(packed_request(unpackable, native.generate_request, native._IDS_PATH), native_pb.GenerateRequest)
