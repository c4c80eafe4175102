"""Tool-call parsers (sans-IO): turn a choice's text into OpenAI `content` and `tool_calls`.

Each parser is per request and per choice: `feed` every text delta in order, then `finish`
once. The result is the same for every way the text is cut into deltas (property-tested), and
`parse_complete` of the whole text equals the joined stream. Tool markup never reaches
`content`, except from malformed calls, which stay content rather than being dropped (each
format's docstring says what counts as malformed); `ToolCallParser.anomalies` lists them.

Run it on content after the reasoning parser. Formats whose markup is special tokens
(deepseek_v3, deepseek_v31, kimi_k2, mistral's `[TOOL_CALLS]`, llama's `<|python_tag|>`) need
the detokenizer to keep special tokens, or there is nothing to parse.

Modules: `stream` (the driver and content handling), `json_calls` (hermes, llama3_json,
mistral), `xml_calls` (qwen3_coder, glm45), `special_token_calls` (deepseek_v3, deepseek_v31,
kimi_k2), `pythonic`, with `value_scan` and `schema_types` beneath, and `registry` for names.
"""

from trio_direct.parsers.tools.deltas import ToolCall, ToolCallDelta, ToolDelta, assemble
from trio_direct.parsers.tools.registry import (
    KNOWN_TOOL_CALL_PARSERS,
    UnknownToolCallParser,
    tool_call_parser,
)
from trio_direct.parsers.tools.stream import ToolCallParser

__all__ = [
    "KNOWN_TOOL_CALL_PARSERS",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "UnknownToolCallParser",
    "assemble",
    "tool_call_parser",
]
