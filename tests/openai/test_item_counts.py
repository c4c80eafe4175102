"""--max-messages: messages, input items and content parts are counted before the body is decoded,
at a cost that does not grow with how far over the cap a body is."""

from __future__ import annotations

import json
import time

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.openai.item_counts import check_item_counts

TEXT = {"type": "text", "text": "x"}


def body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"messages": [{"role": "user", "content": "hi"}] * 101}, "too_many_messages"),
        ({"input": [{"role": "user", "content": "a"}] * 101}, "too_many_messages"),
        ({"messages": [{"role": "user", "content": [TEXT] * 101}]}, "too_many_content_parts"),
        ({"messages": [{"role": "user", "content": [TEXT] * 3}] * 34}, "too_many_content_parts"),
        ({"input": [{"role": "user", "content": [TEXT] * 60}] * 2}, "too_many_content_parts"),
    ],
)
def test_over_the_cap_is_a_400_naming_what_was_counted(fields, code):
    with pytest.raises(ApiError) as raised:
        check_item_counts(body(**fields), 100)
    assert raised.value.status == 400 and raised.value.code == code


@pytest.mark.parametrize(
    "spelling",
    [b'"content":[', b'"content" :\n\t[ ', b'"\\u0063ontent":[', b'"cont\\u0065nt"\r\n:['],
)
def test_content_parts_are_counted_however_the_key_is_written(spelling):
    # msgspec reads the key as JSON does: escapes and whitespace are the same key, and the same parts.
    parts = b",".join([b'{"type":"text","text":"x"}'] * 101)
    raw = b'{"model":"m","messages":[{"role":"user",' + spelling + parts + b"]}]}"
    assert json.loads(raw)["messages"][0]["content"][100] == TEXT
    with pytest.raises(ApiError) as raised:
        check_item_counts(raw, 100)
    assert raised.value.code == "too_many_content_parts"


def test_an_input_over_the_cap_is_named_wherever_the_messages_are():
    items = [{"role": "user", "content": "a"}] * 101
    for fields in (
        {"input": items, "messages": [{"role": "user", "content": "hi"}]},
        {"messages": "x", "input": items},
    ):
        with pytest.raises(ApiError) as raised:
            check_item_counts(body(**fields), 100)
        assert raised.value.param == "input"


@pytest.mark.parametrize(
    "fields",
    [
        {"messages": [{"role": "user", "content": "hi"}] * 100},
        {"messages": [{"role": "user", "content": [TEXT] * 50}] * 2},
        {"input": "one string"},
        {"messages": "not an array"},  # shapes the full decoder answers
        {"messages": [1, "x", None, {"content": {"a": 1}}]},
        {"prompt": [1] * 1000},  # other arrays are not these items
        {"input": list(range(1000))},  # an embeddings input of token ids, not items
        {"input": ["a"] * 1000},
    ],
)
def test_at_the_cap_or_of_another_shape_passes(fields):
    check_item_counts(body(**fields), 100)


def test_malformed_json_is_left_to_the_decoder_and_zero_means_no_cap():
    check_item_counts(b"{not json", 100)
    check_item_counts(body(messages=[{"role": "user", "content": "hi"}] * 500), 0)


def test_a_million_messages_cost_about_what_the_cap_does():
    huge = json.dumps({"messages": [{"role": "user", "content": "hi"}] * 1_000_000}).encode()
    check_item_counts(b"{}", 10_000)  # its decoders, built once
    started = time.perf_counter()
    with pytest.raises(ApiError):
        check_item_counts(huge, 10_000)
    assert time.perf_counter() - started < 0.5  # stops past the cap: a few ms (a full decode: ~1 s)


def test_the_shortest_body_over_the_cap_is_refused_and_shorter_ones_are_never_decoded(monkeypatch):
    shortest = b'{"messages":[' + b",".join([b"0"] * 101) + b"]}"  # 101 one-byte items: 2 * 101 - 1 bytes of them
    with pytest.raises(ApiError):
        check_item_counts(shortest, 100)
    parts = b'{"messages":[{"content":[' + b",".join([b"0"] * 101) + b"]}]}"
    with pytest.raises(ApiError):
        check_item_counts(parts, 100)

    def no_decoding(cap: int) -> None:
        raise AssertionError("a body too short to be over the cap was decoded")

    monkeypatch.setattr("trio_direct.openai.item_counts._decoders", no_decoding)
    within = b'{"messages":[' + b",".join([b"0"] * 90) + b"]}"
    assert len(within) <= 2 * 100
    check_item_counts(within, 100)
    check_item_counts(body(messages=[{"role": "user", "content": "hi"}]), 100)


def test_a_long_body_with_fewer_commas_than_the_cap_is_never_decoded_and_one_more_item_is_refused(monkeypatch):
    # n items, or n parts over all the arrays, take n - 1 commas: a body with fewer commas than the
    # cap is within it however long its prose is, and a body at the bound is read and refused.
    prose = "word " * 2000
    long = body(messages=[{"role": "user", "content": prose}, {"role": "assistant", "content": prose}])
    over = b'{"messages":[' + b",".join([b"0"] * 102) + b"]}"  # 102 items, 101 commas
    assert over.count(b",") == 101 and len(over) > 2 * 101
    with pytest.raises(ApiError) as raised:
        check_item_counts(over, 101)  # as many commas as the cap: read, and over it
    assert raised.value.code == "too_many_messages"
    # Parts over two arrays: 51 + 50 parts, 100 commas between them and around the arrays.
    parts = b'{"messages":[{"content":[' + b",".join([b"0"] * 51) + b']}],"input":[{"content":['
    parts += b",".join([b"0"] * 50) + b"]}]}"
    assert parts.count(b",") == 100 and len(parts) > 2 * 100
    with pytest.raises(ApiError) as raised:
        check_item_counts(parts, 100)
    assert raised.value.code == "too_many_content_parts"

    def no_decoding(cap: int) -> None:
        raise AssertionError("a body with fewer commas than the cap was decoded")

    monkeypatch.setattr("trio_direct.openai.item_counts._decoders", no_decoding)
    assert len(long) > 2 * 100 and long.count(b",") < 100
    check_item_counts(long, 100)
    check_item_counts(over, 102)  # 101 commas: 102 items at most, within a cap of 102
    check_item_counts(parts, 101)
