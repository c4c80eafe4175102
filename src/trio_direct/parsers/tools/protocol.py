"""What every tool-call parser offers its caller, whatever kind it is.

The frontend holds one parser per choice: a markup parser (`ToolCallParser` and its formats) when
the model writes its own tool markup, or a forced parser (`forced`) when guided decoding constrains
the output to plain JSON. It treats both the same way through `ToolParser`, so no decision depends
on which class a parser happens to be.
"""

from __future__ import annotations

from typing import Protocol

from trio_direct.parsers.tools.deltas import ToolDelta

__all__ = ["ToolParser"]


class ToolParser(Protocol):
    """One choice's incremental tool-call parser: `feed` every text delta in order, then `finish`."""

    @property
    def requires_special_tokens(self) -> bool:
        """The detokenizer must keep special tokens for this parser (its markup is made of them).

        Markup formats say True (DeepSeek's, Kimi's, harmony's, `<|python_tag|>`, ... are special
        tokens); the forced parsers read plain JSON and say False.
        """
        ...

    @property
    def call_count(self) -> int:
        """Calls committed so far: a choice with any ends with `finish_reason: "tool_calls"`."""
        ...

    @property
    def anomalies(self) -> list[str]:
        """Malformed or cut-off markup seen so far, for the logs (the text itself is never lost)."""
        ...

    def feed(self, text: str) -> ToolDelta:
        """Parse one delta; returns the content and call pieces that are now certain."""
        ...

    def finish(self) -> ToolDelta:
        """End of stream: everything held back is decided. Idempotent."""
        ...
