"""Chat templates rendered exactly as HF transformers' `apply_chat_template` renders them.

Users tune prompts against transformers and SGLang, so the environment, globals and filters copy
transformers (`utils/chat_template_utils.py`), and message preparation copies SGLang's OpenAI
server (content format detection, tool-call arguments parsed to dicts, `None` fields dropped).
Every failure a request can cause surfaces as `ChatTemplateError`, which the HTTP layer answers
with a 400.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

if TYPE_CHECKING:
    from trio_direct.text.tokenizer import ModelTokenizer

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "ContentFormat",
    "compile_chat_template",
    "detect_content_format",
    "load_chat_template",
    "prepare_messages",
    "render_chat",
    "select_chat_template",
]

ContentFormat = Literal["string", "openai"]

# Variables the request itself sets; `chat_template_kwargs` may not override them.
_RESERVED = frozenset({"messages", "tools", "add_generation_prompt"})


class ChatTemplateError(ValueError):
    """The template cannot render this request (bad input, or the template raised)."""


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled template plus the content format its messages need; shared, immutable."""

    source: str
    content_format: ContentFormat
    template: jinja2.Template

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        special_tokens: Mapping[str, Any] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for OpenAI-style `messages` (prepared with `prepare_messages`).

        `special_tokens` supplies `bos_token`, `eos_token`, ...; `chat_template_kwargs` (e.g.
        `enable_thinking`) is merged over them. `continue_final_message` leaves the last
        message open for the model to continue, as transformers does.
        """
        kwargs = dict(chat_template_kwargs or {})
        if clash := _RESERVED & kwargs.keys():
            raise ChatTemplateError(f"chat_template_kwargs may not set {sorted(clash)}")
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt are mutually exclusive")
        variables = {
            **(special_tokens or {}),
            **kwargs,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            rendered = self.template.render(variables)
        except ChatTemplateError:
            raise
        except Exception as exc:  # any template failure is the request's fault: 400, not 500
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
        if continue_final_message:
            rendered = _cut_after_final_message(rendered, messages)
        return rendered


def compile_chat_template(source: str) -> ChatTemplate:
    """Compile (once per distinct source, cached) and detect the content format."""
    return _compile(source)


@lru_cache(maxsize=64)
def _compile(source: str) -> ChatTemplate:
    try:
        template = _ENV.from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
    return ChatTemplate(source, detect_content_format(source), template)


def select_chat_template(
    templates: Mapping[str, str],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    name: str | None = None,
) -> str:
    """Pick a template from a model's named set the way transformers' `get_chat_template` does.

    An explicit `name` wins; with tools, "tool_use" is preferred; otherwise "default".
    """
    if name is not None:
        if name in templates:
            return templates[name]
        raise ChatTemplateError(f"the model has no chat template named {name!r}")
    if tools is not None and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    if not templates:
        raise ChatTemplateError("the model has no chat template; start with --chat-template")
    raise ChatTemplateError(f"the model has several chat templates ({', '.join(sorted(templates))}) and no default")


def load_chat_template(path: str | Path) -> str:
    """The `--chat-template FILE` override: a Jinja file, or HF's `chat_template.json`.

    Fails at startup (ChatTemplateError) rather than on the first request if it does not compile.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ChatTemplateError(f"cannot read chat template {file}: {exc}") from exc
    source = text
    if file.suffix == ".json":
        try:
            value = json.loads(text).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise ChatTemplateError(f"{file} is not HF chat_template.json") from exc
        if isinstance(value, list):
            value = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}.get("default")
        if not isinstance(value, str):
            raise ChatTemplateError(f"{file} has no (default) chat_template string")
        source = value
    compile_chat_template(source)
    return source


def detect_content_format(source: str) -> ContentFormat:
    """ "openai" when the template loops over a message's `content`, else "string".

    This is SGLang's (and vLLM's) rule, read from the template's syntax tree rather than by
    guessing from its text: a template that iterates `message['content']` (or `m.content`,
    through filters or slices) understands `[{"type": "text", ...}]` parts; any other
    template gets those parts flattened to a string. Unparseable templates count as "string".
    """
    try:
        tree = _ENV.parse(source)
    except jinja2.TemplateError:
        return "string"
    for loop in tree.find_all(jinja2.nodes.For):
        if _reads_content(loop.iter):
            return "openai"
    return "string"


def prepare_messages(messages: Sequence[Mapping[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    """Turn OpenAI request messages into what templates expect, as SGLang does.

    * fields set to `None` are dropped (templates test `is defined`);
    * for "string" templates, a list of content parts becomes the text parts joined by " "
      (other parts are dropped); "openai" templates get the list as is;
    * assistant `tool_calls[].function.arguments` JSON strings become dicts, since templates
      write them with `tojson`. Invalid JSON is a ChatTemplateError.
    """
    out = []
    for message in messages:
        msg = {k: v for k, v in message.items() if v is not None}
        content = msg.get("content")
        if content_format == "string" and isinstance(content, list):
            msg["content"] = " ".join(
                part["text"]
                for part in content
                if isinstance(part, Mapping)
                and part.get("type") in ("text", "input_text")
                and isinstance(part.get("text"), str)
            )
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_parse_arguments(call) for call in msg["tool_calls"]]
        out.append(msg)
    return out


def render_chat(
    tokenizer: ModelTokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    chat_template: str | None = None,
    template_name: str | None = None,
) -> str:
    """Prompt text for a chat request: select, compile (cached), prepare messages, render.

    `chat_template` (the `--chat-template` override) replaces the model's own templates.
    """
    source = chat_template or select_chat_template(tokenizer.chat_templates, tools=tools, name=template_name)
    compiled = compile_chat_template(source)
    return compiled.render(
        prepare_messages(messages, compiled.content_format),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        special_tokens=tokenizer.template_special_tokens,
        chat_template_kwargs=chat_template_kwargs,
    )


# -- the environment transformers renders with ---------------------------------------------------


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike Jinja's own `tojson`, no HTML escaping and key order kept: what transformers does.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks assistant text with it.

    transformers uses the block to build assistant-token masks for training; rendering only
    needs the body, but templates that use the tag must still compile.
    """

    tags = {"generation"}  # noqa: RUF012 - jinja2.ext.Extension declares it so

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# Compiling and rendering with one environment from several threads is safe in Jinja.
_ENV = _environment()


def _reads_content(node: jinja2.nodes.Node) -> bool:
    """Whether `node` is `<name>['content']` / `<name>.content`, possibly filtered or sliced."""
    while True:
        if (
            isinstance(node, (jinja2.nodes.Filter, jinja2.nodes.Test))
            or (isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice))
        ) and node.node is not None:  # a Getitem always has a node; a Filter in a filter block has none
            node = node.node
        else:
            break
    if isinstance(node, jinja2.nodes.Getitem):
        key_ok = isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
    elif isinstance(node, jinja2.nodes.Getattr):
        key_ok = node.attr == "content"
    else:
        return False
    return key_ok and isinstance(node.node, jinja2.nodes.Name)


def _parse_arguments(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    arguments = call["function"].get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError as exc:
        raise ChatTemplateError(f"tool call arguments are not valid JSON: {exc}") from exc
    return {**call, "function": {**call["function"], "arguments": parsed}}


def _cut_after_final_message(rendered: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """transformers' `continue_final_message`: drop what the template wrote after the last text."""
    if not messages:
        raise ChatTemplateError("continue_final_message needs at least one message")
    final = messages[-1].get("content")
    if isinstance(final, list):
        texts = [p["text"] for p in final if isinstance(p, Mapping) and "text" in p]
        if not texts:
            raise ChatTemplateError("continue_final_message: the final message has no text")
        final = texts[-1]
    if not isinstance(final, str) or final.strip() not in rendered:
        raise ChatTemplateError("continue_final_message: the final message does not appear in the rendered prompt")
    at = rendered.rindex(final.strip())
    if rendered[at : at + len(final.lstrip())] == final:  # verbatim, as transformers checks
        return rendered[: at + len(final.lstrip())]
    return rendered[: at + len(final.strip())]
