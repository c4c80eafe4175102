"""A choice's output as an ordered list of blocks: reasoning, text, tool calls (sans-IO).

Chat puts reasoning, content and tool calls side by side in one message; the Responses API (output
items) and the Messages API (content blocks) put them one after another, each opened, filled and
closed in turn. `BlockSequencer` turns `ChoiceEvent`s into that sequence for both surfaces, as
`BlockStep`s (open, delta, close) a renderer writes as its own events; a unary answer runs the same
sequencer over the whole choice, so a stream and a unary response of the same output have the same
blocks.

Text that is only whitespace does not open a text block by itself (models put newlines between a
reasoning section and a tool call): it is held and goes out with the next text that is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from trio_direct.core.output import ChoiceEvent, ChoiceResult

__all__ = ["BlockKind", "BlockSequencer", "BlockStep", "OutputBlock", "blocks_of"]

BlockKind = Literal["reasoning", "text", "tool_call"]


@dataclass(slots=True)
class OutputBlock:
    """One block of output: its position among the blocks, its text so far (a tool call's: its
    arguments JSON), and for a tool call its id and name."""

    kind: BlockKind
    position: int
    parts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    closed: bool = False

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(slots=True)
class BlockStep:
    """What changed: a block opened (empty), grew by `piece`, or closed."""

    action: Literal["open", "delta", "close"]
    block: OutputBlock
    piece: str = ""


class BlockSequencer:
    """Feeds one choice's events, in order, into blocks; `finish` closes the last one."""

    __slots__ = ("_calls", "_held_space", "_open", "blocks")

    def __init__(self) -> None:
        self.blocks: list[OutputBlock] = []
        self._open: OutputBlock | None = None
        self._held_space = ""
        #: The tool parser's call index -> its block.
        self._calls: dict[int, OutputBlock] = {}

    def feed(self, event: ChoiceEvent) -> list[BlockStep]:
        """The steps for one event's reasoning, then its text, then its tool-call deltas."""
        steps: list[BlockStep] = []
        if event.reasoning:
            self._grow("reasoning", event.reasoning, steps)
        if event.text:
            if self._open is not None and self._open.kind == "text":
                self._grow("text", event.text, steps)
            elif event.text.isspace():
                self._held_space += event.text
            else:
                text, self._held_space = self._held_space + event.text, ""
                self._grow("text", text, steps)
        for call in event.tool_calls:
            block = self._calls.get(call.index)
            if block is None:
                block = self._start("tool_call", steps)
                block.call_id, block.name = call.id or "", call.name or ""
                self._calls[call.index] = block
            if call.arguments:
                block.parts.append(call.arguments)
                steps.append(BlockStep("delta", block, call.arguments))
        return steps

    def finish(self) -> list[BlockStep]:
        """Close the open block; whitespace still held is dropped."""
        self._held_space = ""
        steps: list[BlockStep] = []
        self._close(steps)
        return steps

    @property
    def open_block(self) -> OutputBlock | None:
        return self._open

    def _grow(self, kind: BlockKind, piece: str, steps: list[BlockStep]) -> None:
        block = self._open if self._open is not None and self._open.kind == kind else self._start(kind, steps)
        block.parts.append(piece)
        steps.append(BlockStep("delta", block, piece))

    def _start(self, kind: BlockKind, steps: list[BlockStep]) -> OutputBlock:
        self._close(steps)
        block = OutputBlock(kind, len(self.blocks))
        self.blocks.append(block)
        self._open = block
        steps.append(BlockStep("open", block))
        return block

    def _close(self, steps: list[BlockStep]) -> None:
        if self._open is not None:
            self._open.closed = True
            steps.append(BlockStep("close", self._open))
            self._open = None


def blocks_of(result: ChoiceResult) -> list[OutputBlock]:
    """A unary choice's blocks: its reasoning, its text, its tool calls, as a stream of the whole
    choice at once would give them. With tool calls, the text's trailing whitespace is dropped: it is
    what follows the call markup, which a stream holds and drops."""
    text = result.text.rstrip() if result.call_deltas else result.text
    sequencer = BlockSequencer()
    sequencer.feed(ChoiceEvent(result.index, text, [], reasoning=result.reasoning, tool_calls=result.call_deltas))
    sequencer.finish()
    return sequencer.blocks
