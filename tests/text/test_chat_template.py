"""Chat templates render as HF transformers renders them, and bad requests become 400s."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from trio_direct.text.chat_template import (
    ChatTemplateError,
    compile_chat_template,
    detect_content_format,
    load_chat_template,
    prepare_messages,
    render_chat,
    select_chat_template,
)
from trio_direct.text.tokenizer import ModelTokenizer

SYSTEM_AND_USER = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hello world"},
]
EXPECTED_CHATML = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _render(source: str, messages: list[dict] | None = None, **kwargs: Any) -> str:
    return compile_chat_template(source).render(messages or [], **kwargs)


def test_chatml_prompt_is_exact(tiny: ModelTokenizer) -> None:
    assert render_chat(tiny, SYSTEM_AND_USER) == EXPECTED_CHATML
    assert render_chat(tiny, SYSTEM_AND_USER, add_generation_prompt=False) == (
        EXPECTED_CHATML.removesuffix("<|im_start|>assistant\n")
    )


def test_content_parts_reach_a_template_that_loops_over_them(tiny: ModelTokenizer) -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello "},
                {"type": "text", "text": "world"},
            ],
        },
    ]
    assert render_chat(tiny, messages) == EXPECTED_CHATML


def test_content_parts_are_flattened_for_a_string_template(deepseek: ModelTokenizer) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
                {"type": "text", "text": "world"},
            ],
        }
    ]
    assert render_chat(deepseek, messages) == (
        "<｜begin▁of▁sentence｜><|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    ("inner_loop", "expected"),
    [
        ("{% for p in m['content'] %}{{ p.text }}{% endfor %}", "openai"),
        ("{% for p in m.content | selectattr('type') %}{% endfor %}", "openai"),
        ("{% for c in m['content'][::-1] %}{% endfor %}", "openai"),
        ("{{ m['content'] }}", "string"),
        ("{% for t in tools %}{{ t }}{% endfor %}", "string"),
        ("{% for x in m %", "string"),  # does not parse
    ],
)
def test_content_format_detection(inner_loop: str, expected: str) -> None:
    source = "{% for m in messages[1:] %}" + inner_loop + "{% endfor %}"
    assert detect_content_format(source) == expected


def test_tools_reach_the_template() -> None:
    source = (
        "{% if tools %}{% for t in tools %}"
        "[{{ t.function.name }}: {{ t.function.parameters | tojson }}]"
        "{% endfor %}{% else %}no tools{% endif %}"
    )
    assert _render(source) == "no tools"
    assert _render(source, tools=[WEATHER_TOOL]) == (
        '[get_weather: {"type": "object", "properties": {"city": {"type": "string"}}}]'
    )


def test_chat_template_kwargs_reach_the_template() -> None:
    source = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}go"
    assert _render(source) == "go"
    assert _render(source, chat_template_kwargs={"enable_thinking": False}) == "<think></think>go"
    assert _render(source, chat_template_kwargs={"enable_thinking": True}) == "go"


def test_chat_template_kwargs_cannot_replace_request_fields() -> None:
    with pytest.raises(ChatTemplateError, match="messages"):
        _render("x", chat_template_kwargs={"messages": []})


def test_special_tokens_are_variables_and_unset_ones_render_empty(tiny: ModelTokenizer) -> None:
    source = "[{{ bos_token }}|{{ eos_token }}]"
    assert _render(source, special_tokens=tiny.template_special_tokens) == "[|<|im_end|>]"


def test_raise_exception_becomes_chat_template_error() -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    )
    assert _render(source, [{"role": "user", "content": "hi"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Conversation must start with user"):
        _render(source, [{"role": "assistant", "content": "hi"}])


def test_template_runtime_errors_become_chat_template_error() -> None:
    with pytest.raises(ChatTemplateError):
        _render("{{ messages[0]['role'] + 1 }}", [{"role": "user"}])
    with pytest.raises(ChatTemplateError):  # the sandbox forbids mutation
        _render("{% set x = [] %}{{ x.append(1) }}")


def test_strftime_now() -> None:
    before = datetime.now().strftime("%Y-%m-%d")
    rendered = _render("{{ strftime_now('%Y-%m-%d') }}")
    assert rendered in {before, datetime.now().strftime("%Y-%m-%d")}


def test_tojson_has_hf_semantics() -> None:
    value = {"b": "<é>", "a": [1, 2]}  # no HTML escaping, no \u escapes, key order kept

    def render(expression: str) -> str:
        return _render("{{ " + expression + " }}", chat_template_kwargs={"v": value})

    assert render("v | tojson") == '{"b": "<é>", "a": [1, 2]}'
    assert render("v | tojson(indent=2)") == json.dumps(value, ensure_ascii=False, indent=2)
    assert render("v | tojson(separators=(',', ':'))") == '{"b":"<é>","a":[1,2]}'
    assert render("v | tojson(ensure_ascii=True)") == '{"b": "<\\u00e9>", "a": [1, 2]}'


def test_trim_blocks_lstrip_blocks_loopcontrols_and_generation_tag() -> None:
    source = (
        "{% for m in messages %}\n"
        "    {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{% generation %}{{ m.content }}{% endgeneration %};\n"
        "{% endfor %}"
    )
    messages = [{"role": "user", "content": c} for c in "abc"]
    assert _render(source, messages) == "a;\nb;\n"


def test_tool_call_arguments_become_dicts_and_none_fields_vanish() -> None:
    source = (
        "{% for m in messages %}{{ m.content is defined }}"
        "{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}"
    )
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "function": {"name": "f", "arguments": '{"city": "Paris"}'}},
                {"id": "2", "function": {"name": "g", "arguments": ""}},
            ],
        }
    ]
    rendered = _render(source, prepare_messages(messages, "string"))
    assert rendered == 'False{"city": "Paris"}{}'
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # untouched
    bad = [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(ChatTemplateError, match="not valid JSON"):
        prepare_messages(bad, "string")


def test_continue_final_message(tiny: ModelTokenizer) -> None:
    messages = [*SYSTEM_AND_USER, {"role": "assistant", "content": "The answer is"}]
    rendered = render_chat(tiny, messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered == EXPECTED_CHATML + "The answer is"
    with pytest.raises(ChatTemplateError):
        render_chat(tiny, messages, add_generation_prompt=True, continue_final_message=True)


def test_named_templates_are_selected_like_transformers() -> None:
    named = {"default": "plain", "tool_use": "tools"}
    assert select_chat_template(named) == "plain"
    assert select_chat_template(named, tools=[WEATHER_TOOL]) == "tools"
    assert select_chat_template(named, name="tool_use") == "tools"
    assert select_chat_template({"default": "plain"}, tools=[WEATHER_TOOL]) == "plain"
    with pytest.raises(ChatTemplateError, match="no default"):
        select_chat_template({"a": "x", "b": "y"})
    with pytest.raises(ChatTemplateError, match="no chat template"):
        select_chat_template({})
    with pytest.raises(ChatTemplateError, match="rag"):
        select_chat_template(named, name="rag")


def test_override_file(tiny: ModelTokenizer, tmp_path: Path) -> None:
    jinja = tmp_path / "custom.jinja"
    jinja.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    override = load_chat_template(jinja)
    assert render_chat(tiny, SYSTEM_AND_USER, chat_template=override) == (
        "system: You are helpful.\nuser: Hello world\n"
    )
    as_json = tmp_path / "chat_template.json"
    as_json.write_text(json.dumps({"chat_template": [{"name": "default", "template": "J"}]}))
    assert load_chat_template(as_json) == "J"
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="does not compile"):
        load_chat_template(broken)
    with pytest.raises(ChatTemplateError, match="cannot read"):
        load_chat_template(tmp_path / "missing.jinja")


def test_templates_compile_once() -> None:
    source = "{{ messages | length }} messages"
    assert compile_chat_template(source) is compile_chat_template(source)
