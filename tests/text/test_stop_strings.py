"""Stop strings cut the stream at the first match, whatever the chunking; no prefix leaks."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from trio_direct.text.stop_strings import StopStringMatcher

FUZZ = settings(max_examples=300, deadline=None, database=None)


def _reference(text: str, stops: Sequence[str], include: bool) -> tuple[str, str | None]:
    """Batch answer: the stop that completes first (ties: the longest) and the text before it."""
    for end in range(1, len(text) + 1):
        ending_here = [s for s in stops if s and text.startswith(s, end - len(s)) and end >= len(s)]
        if ending_here:
            stop = max(ending_here, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


def _stream(matcher: StopStringMatcher, chunks: Sequence[str]) -> tuple[str, str | None, list[str]]:
    emitted, matched = [], None
    for chunk in chunks:
        piece, matched = matcher.push(chunk)
        emitted.append(piece)
    emitted.append(matcher.flush())
    return "".join(emitted), matched, emitted


@FUZZ
@given(
    text=st.text(alphabet="ab c", max_size=30),
    stops=st.lists(st.text(alphabet="ab c", max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    include=st.booleans(),
)
def test_any_chunking_equals_the_batch_cut(text: str, stops: list[str], cuts: list[int], include: bool) -> None:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    chunks = [text[a:b] for a, b in zip(points, points[1:])]
    out, matched, _ = _stream(StopStringMatcher(stops, include), chunks)
    assert (out, matched) == _reference(text, stops, include)


def test_partial_match_is_held_then_released_when_it_diverges() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.push("The result</ans") == ("The result", None)
    assert matcher.push("wer is near</") == ("</answer is near", None)
    assert matcher.flush() == "</"


def test_match_across_many_chunks_then_silence() -> None:
    matcher = StopStringMatcher(["STOP"])
    pieces = [matcher.push(c) for c in ["go S", "T", "O", "P and more"]]
    assert pieces == [("go ", None), ("", None), ("", None), ("", "STOP")]
    assert matcher.push("still more") == ("", "STOP")
    assert matcher.matched == "STOP"
    assert matcher.flush() == ""


def test_include_stop_str_in_output() -> None:
    matcher = StopStringMatcher(["\n\n"], include_stop_str_in_output=True)
    assert matcher.push("line one\n") == ("line one", None)
    assert matcher.push("\nline two") == ("\n\n", "\n\n")


def test_first_completed_stop_wins() -> None:
    # "bc" completes before "abcd" does, so it wins even though "abcd" starts earlier.
    assert StopStringMatcher(["abcd", "bc"]).push("xabcd") == ("xa", "bc")
    # Both complete at the same character: the longer one starts first and wins.
    assert StopStringMatcher(["c", "abc"]).push("xabc") == ("x", "abc")


def test_no_stops_passes_text_through() -> None:
    matcher = StopStringMatcher(["", ""])
    assert matcher.push("anything") == ("anything", None)
    assert matcher.flush() == ""


def test_unicode_stops() -> None:
    matcher = StopStringMatcher(["。\n", "😀"])
    assert matcher.push("你好。") == ("你好", None)
    assert matcher.push("再见😀!") == ("。再见", "😀")


def test_long_stream_holds_at_most_a_stop_length() -> None:
    matcher = StopStringMatcher(["<|end|>", "Observation:"])
    emitted = []
    for i in range(20_000):
        piece, matched = matcher.push(f"token{i} <|en" if i % 7 == 0 else f" word{i}")
        assert matched is None
        emitted.append(piece)
    tail = matcher.flush()
    assert len(tail) < len("Observation:")
    assert "".join(emitted) + tail == "".join(f"token{i} <|en" if i % 7 == 0 else f" word{i}" for i in range(20_000))
