"""Tool-call parsers (sans-IO): turn a choice's text into OpenAI `content` and `tool_calls`.

Each parser is per request and per choice: `feed` every text delta in order, then `finish`
once. The result is the same for every way the text is cut into deltas (property-tested), and
`parse_complete` of the whole text equals the joined stream. Tool markup never reaches
`content`, except from malformed calls, which stay content rather than being dropped (each
format's docstring says what counts as malformed); `anomalies` lists them.

Every parser, markup (`ToolCallParser` and its formats) or forced (`forced`), satisfies the
`ToolParser` protocol; callers read `requires_special_tokens` to know whether the detokenizer
must keep special tokens (most markup is made of them), never the parser's class.

Run it on content after the reasoning parser. Modules: `stream` (the driver and content
handling), `json_calls` (hermes, llama3_json, mistral, json, cohere, inkling, granite),
`argument_tag_calls` (qwen3_coder, seed_oss, glm45, hunyuan), `invoke_calls` (minimax_m2, step3,
deepseek_v32, deepseek_v4), `kimi_channel_calls` (kimi_k3), `special_token_calls` (deepseek_v3,
deepseek_v31, kimi_k2), `pythonic` (pythonic, sarashina), `harmony_calls` (gpt_oss),
`gemma_calls` (gemma4, function_gemma), `tree_calls` (minimax_m3), with `value_scan` and
`schema_types` beneath, and `registry` for names.
"""

from trio_direct.parsers.tools.deltas import ToolCall, ToolCallDelta, ToolDelta, assemble
from trio_direct.parsers.tools.protocol import ToolParser
from trio_direct.parsers.tools.registry import (
    KNOWN_TOOL_CALL_PARSERS,
    TOOL_CALL_FORMATS,
    UnknownToolCallParser,
    normalize_parser_name,
    tool_call_parser,
)
from trio_direct.parsers.tools.stream import ToolCallParser

__all__ = [
    "KNOWN_TOOL_CALL_PARSERS",
    "TOOL_CALL_FORMATS",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolDelta",
    "ToolParser",
    "UnknownToolCallParser",
    "assemble",
    "normalize_parser_name",
    "tool_call_parser",
]
