"""Image input for the conversational surfaces: image parts to the engine's `image_data`.

An OpenAI `image_url` part (an http(s) or `data:` URL) becomes `{"type": "image"}` in the message
the chat template renders, which is how HF processors' templates (Qwen2-VL, Llama 3.2 Vision, ...)
mark where the model's image placeholder goes, and its URL joins the prompt's `image_data`, in
order. This is what SGLang's own server does (`process_content_for_template_format`). The engine
fetches or decodes the image and expands the placeholder.

Refused with a 400: images for a model whose engines report no multimodal support, and images
with a template that does not iterate over content parts (it would drop the placeholder). The
frontend fetches nothing unless ``--allow-image-fetch`` (`surfaces.image_fetch`).

The Responses and Messages surfaces turn their own image blocks into OpenAI parts with
`responses_image_part` and `anthropic_image_part`, then plan through `surfaces.chat`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trio_direct.core import errors
from trio_direct.surfaces.image_fetch import ImageFetchLimits, inline_images
from trio_direct.text.chat_template import (
    ChatTemplateError,
    compile_chat_template,
    select_chat_template,
)

if TYPE_CHECKING:
    from trio_direct.core.pool import PoolView

__all__ = [
    "ChatImages",
    "anthropic_image_part",
    "check_image_url",
    "image_data_for",
    "prepare_chat_images",
    "require_image_support",
    "responses_image_part",
    "take_images",
]


@dataclass(slots=True)
class ChatImages:
    """A conversation's messages with image parts marked for the template, and the images' URLs."""

    messages: list[dict[str, Any]]
    urls: list[str] = field(default_factory=list)
    #: Where each image was, for error messages (`messages[0].content[1]`).
    params: list[str] = field(default_factory=list)


def take_images(messages: Sequence[Mapping[str, Any]]) -> ChatImages:
    """Every `image_url` part becomes `{"type": "image"}`; the URLs are collected in order.

    Messages without images are passed through as they are (no copy)."""
    out: list[dict[str, Any]] = []
    images = ChatImages(out)
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(_is_image(part) for part in content):
            out.append(message)  # type: ignore[arg-type]
            continue
        parts = []
        for j, part in enumerate(content):
            if _is_image(part):
                param = f"messages[{i}].content[{j}].image_url.url"
                url = part["image_url"]["url"]
                check_image_url(url, param)
                images.urls.append(url)
                images.params.append(param)
                parts.append({"type": "image"})
            else:
                parts.append(part)
        out.append({**message, "content": parts})
    return images


def _is_image(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image_url"


def check_image_url(url: str, param: str) -> None:
    """An http(s) URL, or a base64 `data:` URL of an image: what SGLang's image loader takes."""
    lowered = url[:16].lower()
    if lowered.startswith(("http://", "https://")):
        return
    if lowered.startswith("data:"):
        header, comma, _ = url.partition(",")
        media = header[5:].split(";")
        if comma and media[0].lower().startswith("image/") and "base64" in (m.lower() for m in media[1:]):
            return
        raise errors.invalid_request(
            f"Invalid value for '{param}': a data URL must be a base64-encoded image (data:image/...;base64,...).",
            param=param,
        )
    raise errors.invalid_request(
        f"Invalid value for '{param}': the image URL must be an http(s) URL or a data URL.", param=param
    )


async def image_data_for(pool: PoolView, urls: list[str], params: Sequence[str]) -> list[str]:
    """The `image_data` for the engine: a 400 when the model takes no images; with
    ``--allow-image-fetch`` http(s) images are fetched and sent as data URLs."""
    if not urls:
        return []
    require_image_support(pool, params)
    config = pool.config
    if not config.allow_image_fetch:
        return list(urls)
    limits = ImageFetchLimits(max_bytes=config.image_fetch_max_bytes, timeout=config.image_fetch_timeout)
    return await inline_images(urls, params, limits)


def require_image_support(pool: PoolView, params: Sequence[str] = ()) -> None:
    """A 400 unless every engine of the model takes image input."""
    if not pool.supports_images:
        raise errors.invalid_request(
            f"The model `{pool.name}` does not take image input: its engines report no multimodal support.",
            param=params[0] if params else None,
            code="unsupported_parameter",
        )


async def prepare_chat_images(
    pool: PoolView, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages ready for the template and the prompt's `image_data` (see the module docstring)."""
    images = take_images(messages)
    if not images.urls:
        return messages, []
    require_image_support(pool, images.params)
    if not _template_renders_parts(pool, tools):
        raise errors.invalid_request(
            "The model's chat template does not render content parts, so it has no place for an image.",
            param=images.params[0],
            code="unsupported_parameter",
        )
    return images.messages, await image_data_for(pool, images.urls, images.params)


def _template_renders_parts(pool: PoolView, tools: Sequence[Mapping[str, Any]] | None) -> bool:
    try:
        source = pool.chat_template_override or select_chat_template(pool.tokenizer.chat_templates, tools=tools)
        return compile_chat_template(source).content_format == "openai"
    except ChatTemplateError:
        return True  # no usable template: rendering reports it, as for any chat


# ---- other APIs' image blocks ------------------------------------------------------------------


def anthropic_image_part(source: Mapping[str, Any], param: str = "source") -> dict[str, Any]:
    """An Anthropic `image` block's `source` as an OpenAI `image_url` part: `{"type": "base64",
    "media_type", "data"}` becomes a data URL, `{"type": "url", "url"}` the URL itself."""
    kind = source.get("type")
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type.startswith("image/") or not isinstance(data, str):
            raise errors.invalid_request(
                f"Invalid value for '{param}': a base64 image needs an image/* 'media_type' and 'data'.", param=param
            )
        url = f"data:{media_type};base64,{data}"
    elif kind == "url":
        given = source.get("url")
        if not isinstance(given, str):
            raise errors.invalid_request(f"Missing required parameter: '{param}.url'.", param=f"{param}.url")
        url = given
    else:
        raise errors.invalid_request(
            f"Invalid value for '{param}.type': image sources of type {kind!r} are not supported (base64, url).",
            param=f"{param}.type",
        )
    check_image_url(url, param)
    return {"type": "image_url", "image_url": {"url": url}}


def responses_image_part(part: Mapping[str, Any], param: str = "input") -> dict[str, Any]:
    """A Responses API `input_image` part (`image_url`: an http(s) or data URL) as an OpenAI chat
    `image_url` part; uploaded files (`file_id`) are not supported."""
    url = part.get("image_url")
    if not isinstance(url, str):
        if part.get("file_id") is not None:
            raise errors.invalid_request(
                f"Invalid value for '{param}.file_id': uploaded files are not supported; give 'image_url'.",
                param=f"{param}.file_id",
                code="unsupported_parameter",
            )
        raise errors.invalid_request(f"Missing required parameter: '{param}.image_url'.", param=f"{param}.image_url")
    check_image_url(url, f"{param}.image_url")
    return {"type": "image_url", "image_url": {"url": url}}
