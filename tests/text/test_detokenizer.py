"""Streamed detokenization equals batch decoding, and never shows half a character."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_direct.text.byte_level import CHAR_BYTES, byte_level_pieces
from trio_direct.text.detokenizer import IncrementalDetokenizer
from trio_direct.text.tokenizer import ModelTokenizer

MULTILINGUAL = "你好世界，这是一个测试。😀🎉👍🏽 naïve café — ok"
DEEPSEEK_RANGE = 129280 + 8  # a few ids past the vocabulary, as a buggy engine might send
FUZZ = settings(max_examples=150, deadline=None, database=None)
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"


def token_id(tokenizer: ModelTokenizer, token: str) -> int:
    """The id of `token`, which the vocabulary must have."""
    found = tokenizer.tokenizer.token_to_id(token)
    assert found is not None, token
    return found


def _split(ids: Sequence[int], cuts: Sequence[int]) -> list[list[int]]:
    points = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    return [list(ids[a:b]) for a, b in zip(points, points[1:])]


def _stream(detok: IncrementalDetokenizer, chunks: Sequence[Sequence[int]]) -> list[str]:
    return [detok.push(chunk) for chunk in chunks] + [detok.flush()]


@st.composite
def _ids_and_chunks(draw: st.DrawFn, vocab: int, texts: Sequence[list[int]] = ()) -> tuple:
    parts = draw(
        st.lists(
            st.one_of(
                st.lists(st.integers(0, vocab - 1), max_size=6),
                *(st.just(t) for t in texts),
            ),
            max_size=6,
        )
    )
    ids = [i for part in parts for i in part]
    cuts = draw(st.lists(st.integers(0, 1000), max_size=8))
    return ids, _split(ids, cuts)


@FUZZ
@given(data=st.data(), skip=st.booleans())
def test_any_chunking_equals_batch_decode_tiny(data: st.DataObject, tiny: ModelTokenizer, skip: bool) -> None:
    texts = [tiny.encode(t, add_special_tokens=False) for t in ("Hello", "é😀中", "<|im_end|>")]
    ids, chunks = data.draw(_ids_and_chunks(tiny.vocab_size, texts))
    out = _stream(IncrementalDetokenizer(tiny, skip_special_tokens=skip), chunks)
    assert "".join(out) == tiny.decode(ids, skip_special_tokens=skip)


@FUZZ
@given(data=st.data(), skip=st.booleans())
def test_any_chunking_equals_batch_decode_deepseek(data: st.DataObject, deepseek: ModelTokenizer, skip: bool) -> None:
    texts = [deepseek.encode(t, add_special_tokens=False) for t in (MULTILINGUAL, "<｜end▁of▁sentence｜>")]
    ids, chunks = data.draw(_ids_and_chunks(DEEPSEEK_RANGE, texts))
    out = _stream(IncrementalDetokenizer(deepseek, skip_special_tokens=skip), chunks)
    assert "".join(out) == deepseek.decode(ids, skip_special_tokens=skip)


@FUZZ
@given(text=st.text(max_size=40), cuts=st.lists(st.integers(0, 1000), max_size=10))
def test_valid_text_never_shows_a_replacement_character(deepseek: ModelTokenizer, text: str, cuts: list[int]) -> None:
    ids = deepseek.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(deepseek)
    emitted = ""
    for chunk in _split(ids, cuts):
        piece = detok.push(chunk)
        assert "\ufffd" not in piece or "\ufffd" in text
        emitted += piece
        assert text.startswith(emitted)
    assert emitted + detok.flush() == text


def test_emoji_split_across_tokens_is_held_until_complete(deepseek: ModelTokenizer) -> None:
    ids = deepseek.encode("😀", add_special_tokens=False)
    assert len(ids) == 2
    detok = IncrementalDetokenizer(deepseek)
    assert detok.push(ids[:1]) == ""
    assert detok.push(ids[1:]) == "😀"
    assert detok.flush() == ""


def test_chinese_token_by_token(deepseek: ModelTokenizer) -> None:
    ids = deepseek.encode(MULTILINGUAL, add_special_tokens=False)
    detok = IncrementalDetokenizer(deepseek)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == MULTILINGUAL
    assert pieces[0] == "你好"


def test_incomplete_bytes_at_the_end_become_replacement_on_flush(deepseek: ModelTokenizer) -> None:
    lead_byte = token_id(deepseek, "ä")  # 0xE4: starts a 3-byte sequence
    detok = IncrementalDetokenizer(deepseek)
    assert detok.push(deepseek.encode("ok ", add_special_tokens=False) + [lead_byte]) == "ok "
    assert detok.flush() == "\ufffd"


def test_special_tokens_skipped_or_shown(tiny: ModelTokenizer) -> None:
    ids = tiny.encode("Hi<|im_end|>", add_special_tokens=False)
    shown = IncrementalDetokenizer(tiny, skip_special_tokens=False)
    assert shown.push(ids) + shown.flush() == "Hi<|im_end|>"
    skipped = IncrementalDetokenizer(tiny, skip_special_tokens=True)
    assert skipped.push(ids) + skipped.flush() == "Hi"


def test_ids_outside_the_vocabulary_decode_to_nothing(tiny: ModelTokenizer) -> None:
    detok = IncrementalDetokenizer(tiny)
    hello = tiny.encode("Hello", add_special_tokens=False)
    assert detok.push([tiny.vocab_size + 5, *hello]) + detok.flush() == "Hello"


@pytest.mark.parametrize("prepared", [False, True], ids=["opened-by-push", "prepared-first"])
@pytest.mark.parametrize("prompt", ["Hello", "你好", "😀"])
def test_prompt_context(deepseek: ModelTokenizer, prompt: str, prepared: bool) -> None:
    prompt_ids = deepseek.encode(prompt, add_special_tokens=False)
    gen_ids = deepseek.encode(" world 世界", add_special_tokens=False)
    detok = IncrementalDetokenizer(deepseek, prompt_ids=prompt_ids)
    if prepared:  # as a request does once its engine call has left
        detok.prepare()
        detok.prepare()
    text = "".join(detok.push([i]) for i in gen_ids) + detok.flush()
    assert text == " world 世界"


@pytest.mark.parametrize("prepared", [False, True], ids=["opened-by-push", "prepared-first"])
def test_prompt_ending_inside_a_character(deepseek: ModelTokenizer, prepared: bool) -> None:
    emoji = deepseek.encode("😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(deepseek, prompt_ids=emoji[:1])
    if prepared:
        detok.prepare()
    rest = deepseek.encode(" done", add_special_tokens=False)
    text = detok.push(emoji[1:]) + detok.push(rest) + detok.flush()
    assert text.endswith(" done")


def test_push_after_flush_is_a_bug(tiny: ModelTokenizer) -> None:
    detok = IncrementalDetokenizer(tiny)
    detok.flush()
    with pytest.raises(RuntimeError):
        detok.push([5])


@FUZZ
@given(
    text=st.text(alphabet="hel o你好世界😀é\n", max_size=20),
    cuts=st.lists(st.integers(0, 100), max_size=6),
)
def test_sentencepiece_byte_fallback_streams_valid_text_exactly(
    sentencepiece: ModelTokenizer, text: str, cuts: list[int]
) -> None:
    ids = sentencepiece.encode(text, add_special_tokens=False)
    out = _stream(IncrementalDetokenizer(sentencepiece), _split(ids, cuts))
    assert "\ufffd" not in "".join(out)
    assert "".join(out) == sentencepiece.decode(ids)


@FUZZ
@given(data=st.data(), skip=st.booleans())
def test_sentencepiece_invalid_bytes_never_fail_the_stream(
    data: st.DataObject, sentencepiece: ModelTokenizer, skip: bool
) -> None:
    # Byte-fallback decoding is not monotonic on invalid UTF-8 (see the module docstring), so
    # only a batch result without U+FFFD must be matched exactly; the stream must never raise.
    ids, chunks = data.draw(_ids_and_chunks(sentencepiece.vocab_size))
    out = "".join(_stream(IncrementalDetokenizer(sentencepiece, skip_special_tokens=skip), chunks))
    expected = sentencepiece.decode(ids, skip_special_tokens=skip)
    assert out == expected or "\ufffd" in expected


def test_sentencepiece_rewritten_prefix_does_not_break_the_stream(
    sentencepiece: ModelTokenizer,
) -> None:
    # "S" streams at once; the two invalid bytes after it make batch decoding rewrite it to
    # U+FFFD, which tokenizers' DecodeStream reports as an error.
    byte = {b: token_id(sentencepiece, f"<0x{b:02X}>") for b in (0x53, 0x9A, 0x80)}
    he = token_id(sentencepiece, "▁he")
    detok = IncrementalDetokenizer(sentencepiece)
    pieces = [detok.push([byte[0x53]]), detok.push([byte[0x9A], byte[0x80]]), detok.push([he, he])]
    assert pieces[0] == "S"
    assert pieces[2].endswith(" he he")
    assert detok.flush() == ""


# ---- the byte-level path: what DecodeStream returns, push by push ----------------------------------


def _byte_tokens(tokenizer: ModelTokenizer) -> list[int]:
    """The ids of the 128 single-byte tokens of bytes 0x80-0xFF: lead and continuation bytes."""
    alphabet = {byte: char for char, byte in CHAR_BYTES.items()}
    return [token_id(tokenizer, alphabet[byte]) for byte in range(0x80, 0x100)]


@st.composite
def _pushes(draw: st.DrawFn, tokenizer: ModelTokenizer, vocab: int, texts: Sequence[list[int]]) -> tuple:
    """Ids (any, past the vocabulary, lone bytes, whole texts, added tokens) and a split into pushes."""
    bytes_ = _byte_tokens(tokenizer)
    added = list(tokenizer.tokenizer.get_added_tokens_decoder())
    part = st.one_of(
        st.lists(st.integers(0, vocab - 1), max_size=4),
        st.lists(st.sampled_from(bytes_), max_size=6),
        st.lists(st.sampled_from(added), max_size=2),
        *(st.just(t) for t in texts),
    )
    ids = [i for p in draw(st.lists(part, max_size=8)) for i in p]
    prompt = draw(st.one_of(st.none(), st.lists(st.sampled_from(bytes_ + added + ids[:4] or [0]), max_size=6)))
    return prompt, ids, _split(ids, draw(st.lists(st.integers(0, 1000), max_size=10)))


def _same_pushes(tokenizer: ModelTokenizer, prompt: list[int] | None, chunks: list[list[int]], skip: bool) -> None:
    fast = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip, prompt_ids=prompt)
    reference = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip, prompt_ids=prompt, byte_level=False)
    assert _stream(fast, chunks) == _stream(reference, chunks)


@FUZZ
@given(data=st.data(), skip=st.booleans())
def test_the_byte_level_path_streams_what_decode_stream_does_deepseek(
    data: st.DataObject, deepseek: ModelTokenizer, skip: bool
) -> None:
    assert byte_level_pieces(deepseek.tokenizer) is not None
    texts = [deepseek.encode(t, add_special_tokens=False) for t in (MULTILINGUAL, "a\ufffdb", DEEPSEEK_EOS)]
    prompt, _, chunks = data.draw(_pushes(deepseek, DEEPSEEK_RANGE, texts))
    _same_pushes(deepseek, prompt, chunks, skip)


@FUZZ
@given(data=st.data(), skip=st.booleans())
def test_the_byte_level_path_streams_what_decode_stream_does_tiny(
    data: st.DataObject, tiny: ModelTokenizer, skip: bool
) -> None:
    assert byte_level_pieces(tiny.tokenizer) is not None
    texts = [tiny.encode(t, add_special_tokens=False) for t in ("Hello there", "é😀中", "<|im_end|>")]
    prompt, _, chunks = data.draw(_pushes(tiny, tiny.vocab_size + 3, texts))
    _same_pushes(tiny, prompt, chunks, skip)


def test_token_by_token_the_byte_level_path_holds_what_decode_stream_holds(deepseek: ModelTokenizer) -> None:
    lone = _byte_tokens(deepseek)
    ids = [*deepseek.encode("你好😀", add_special_tokens=False), lone[0x64], lone[0x38], lone[0x2D], lone[0]]
    ids += [token_id(deepseek, DEEPSEEK_EOS), lone[0x38], *deepseek.encode(" ok", add_special_tokens=False)]
    for skip in (False, True):
        _same_pushes(deepseek, None, [[i] for i in ids], skip)


def test_other_decoders_keep_decode_stream(sentencepiece: ModelTokenizer) -> None:
    assert byte_level_pieces(sentencepiece.tokenizer) is None
