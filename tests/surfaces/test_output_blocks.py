"""A choice's events become ordered blocks (reasoning, text, tool calls), streamed or whole alike."""

from __future__ import annotations

from surface_support import TOOL_TURN, call, event, result_of

from trio_direct.surfaces.output_blocks import BlockSequencer, blocks_of


def run(batches) -> tuple[list[tuple[str, str, str]], BlockSequencer]:
    sequencer = BlockSequencer()
    steps = []
    for batch in batches:
        for item in batch:
            steps += sequencer.feed(item)
            if item.finish_reason is not None:
                steps += sequencer.finish()
    return [(s.action, s.block.kind, s.piece) for s in steps], sequencer


def test_a_tool_turn_is_reasoning_then_text_then_the_call():
    steps, sequencer = run(TOOL_TURN)
    assert steps == [
        ("open", "reasoning", ""),
        ("delta", "reasoning", "The user wants "),
        ("delta", "reasoning", "the weather."),
        ("close", "reasoning", ""),
        ("open", "text", ""),
        ("delta", "text", "\n\nLet me "),  # the held newlines go out with the first real text
        ("delta", "text", "check."),
        ("close", "text", ""),
        ("open", "tool_call", ""),
        ("delta", "tool_call", '{"city": '),
        ("delta", "tool_call", '"Paris"}'),
        ("close", "tool_call", ""),  # the trailing newline never opens a text block
    ]
    reasoning, text, tool = sequencer.blocks
    assert (reasoning.text, text.text, tool.text) == (
        "The user wants the weather.",
        "\n\nLet me check.",
        '{"city": "Paris"}',
    )
    assert (tool.call_id, tool.name, [b.position for b in sequencer.blocks]) == ("call_1", "get_weather", [0, 1, 2])
    assert all(block.closed for block in sequencer.blocks)


def test_the_unary_blocks_equal_the_streamed_ones():
    _, sequencer = run(TOOL_TURN)
    streamed = [(b.kind, b.text, b.call_id, b.name) for b in sequencer.blocks]
    assert [(b.kind, b.text, b.call_id, b.name) for b in blocks_of(result_of(TOOL_TURN))] == streamed


def test_two_calls_are_two_blocks_and_whitespace_only_output_has_none():
    steps, sequencer = run([
        [event(calls=[call(0, "{}", name="a", call_id="call_a")])],
        [event(calls=[call(1, '{"x": 1}', name="b", call_id="call_b")])],
        [event(" \n", finish="tool_calls")],
    ])  # fmt: skip
    assert [(b.kind, b.name, b.text) for b in sequencer.blocks] == [
        ("tool_call", "a", "{}"),
        ("tool_call", "b", '{"x": 1}'),
    ]
    assert [s for s in steps if s[0] == "close"] == [("close", "tool_call", "")] * 2
    assert blocks_of(result_of([[event("  \n", finish="stop")]])) == []


def test_plain_text_is_one_block_with_its_leading_space():
    _, sequencer = run([[event(" ")], [event(" Hello")], [event(" world", finish="stop")]])
    (block,) = sequencer.blocks
    assert (block.kind, block.text) == ("text", "  Hello world")
