"""Client-side stop strings over streamed text (the multi-token stops smg keeps off the engine).

Text that might be the start of a stop string is held back (Dynamo's "jail"), so a client never
sees part of a stop that then completes. Each push scans only the held tail plus the new text,
so the cost per push is O(len(new text) + longest stop), independent of the stream's length.

The first stop to *complete* wins (ties: the one that starts first, i.e. the longest): that is
the only rule a streaming matcher can follow without waiting, and it makes the result the same
for every chunking of the text (property-tested).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopStringMatcher"]


class StopStringMatcher:
    """Per-stream matcher; create one per request choice."""

    __slots__ = ("_stops", "_prefixes", "_prefix_ends", "_longest", "_include", "_held", "_matched")

    def __init__(self, stops: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))  # empty stops match nothing
        # Every proper prefix of a stop: the tails worth holding back.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._prefix_ends = frozenset(p[-1] for p in self._prefixes)
        self._longest = max(map(len, self._stops), default=0)
        self._include = include_stop_str_in_output
        self._held = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the stream, once one has."""
        return self._matched

    def push(self, text: str) -> tuple[str, str | None]:
        """Return `(text safe to emit now, the stop matched or None)`.

        On a match the emitted text ends right before the stop (or after it, when included);
        every later push returns `("", matched)`.
        """
        if self._matched is not None:
            return "", self._matched
        if not self._stops:
            return text, None
        buffer = self._held + text
        best_end, best = -1, ""
        for stop in self._stops:
            at = buffer.find(stop)
            if at >= 0:
                end = at + len(stop)
                if best_end < 0 or end < best_end or (end == best_end and len(stop) > len(best)):
                    best_end, best = end, stop
        if best_end >= 0:
            self._matched = best
            self._held = ""
            return buffer[: best_end if self._include else best_end - len(best)], best
        hold = self._hold_length(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold], None

    def flush(self) -> str:
        """End of stream without a match: release the held text (nothing after a match)."""
        held, self._held = self._held, ""
        return "" if self._matched is not None else held

    def _hold_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop."""
        if not buffer or buffer[-1] not in self._prefix_ends:
            return 0
        for size in range(min(len(buffer), self._longest - 1), 0, -1):
            if buffer[-size:] in self._prefixes:
                return size
        return 0
