"""Finding markup markers in streamed text: shared by the reasoning and tool-call parsers."""

from __future__ import annotations

from collections.abc import Sequence


def first_marker(text: str, pos: int, markers: Sequence[str]) -> tuple[int, str] | None:
    """The earliest complete marker in `text[pos:]`, as `(index, marker)`."""
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker, pos)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, marker)
    return best


def partial_marker_length(text: str, pos: int, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text[pos:]` that is a proper prefix of a marker."""
    longest = max(map(len, markers), default=0)
    for size in range(min(len(text) - pos, longest - 1), 0, -1):
        tail = text[len(text) - size :]
        if any(len(m) > size and m.startswith(tail) for m in markers):
            return size
    return 0
