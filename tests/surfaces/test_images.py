"""Image input: image parts become the template's image placeholders and the prompt's `image_data`,
other APIs' image blocks become OpenAI parts, and the frontend fetches only when allowed."""

from __future__ import annotations

import base64
import json
from functools import partial

import pytest
import trio

from trio_direct.core.errors import ApiError
from trio_direct.openai.requests import decode_chat_request
from trio_direct.surfaces.chat import plan_chat
from trio_direct.surfaces.images import (
    anthropic_image_part,
    check_image_url,
    image_data_for,
    responses_image_part,
    take_images,
)

#: A Qwen2-VL-style template, as HF processors ship them: an image part renders the placeholder.
VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: A template that takes content only as a string (parts are flattened to their text).
STRING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()
CAT = "https://images.example/cat.png"
DOG = f"data:image/png;base64,{PNG}"


def chat(*parts, **fields):
    messages = [{"role": "user", "content": list(parts)}]
    return decode_chat_request(json.dumps({"model": "m", "messages": messages, **fields}).encode())


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url, "detail": "high"}}


def test_image_parts_become_placeholders_and_urls_in_order():
    plain = {"role": "system", "content": "Be brief."}
    messages: list[dict] = [plain, {"role": "user", "content": [text("a"), image(CAT), text("b"), image(DOG)]}]
    taken = take_images(messages)
    assert taken.urls == [CAT, DOG]
    assert taken.params == ["messages[1].content[1].image_url.url", "messages[1].content[3].image_url.url"]
    assert taken.messages[0] is plain  # untouched messages are not copied
    assert taken.messages[1]["content"] == [text("a"), {"type": "image"}, text("b"), {"type": "image"}]
    assert messages[1]["content"][1] == image(CAT)  # the request's own messages are left as they were


@pytest.mark.parametrize("url", [CAT, "http://10.0.0.1/x.jpg", DOG, "DATA:image/jpeg;BASE64,AAAA"])
def test_urls_the_engine_can_load_are_accepted(url):
    check_image_url(url, "p")


@pytest.mark.parametrize(
    "url",
    ["ftp://x/y.png", "file:///etc/passwd", "x.png", "data:text/plain;base64,AAAA", "data:image/png,raw-bytes", ""],
)
def test_other_urls_are_refused(url):
    with pytest.raises(ApiError) as caught:
        check_image_url(url, "messages[0].content[0].image_url.url")
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[0].image_url.url"


async def test_a_multimodal_model_renders_the_placeholder_and_sends_the_images(make_pool):
    pool = make_pool(images=True, template=VL_TEMPLATE)
    plan = await plan_chat(pool, chat(text("What is in"), image(CAT), text("and"), image(DOG), text("?")))
    prompt = plan.prompts[0]
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"What is in{placeholder}and{placeholder}?" in prompt.text
    assert prompt.token_ids == pool.tokenizer.encode(prompt.text, add_special_tokens=False)
    assert list(plan.choices[0].request.image_data) == [CAT, DOG]


async def test_a_text_only_chat_sends_no_images(make_pool):
    plan = await plan_chat(make_pool(images=True, template=VL_TEMPLATE), chat(text("hello")))
    assert list(plan.choices[0].request.image_data) == []


async def test_a_model_without_multimodal_support_refuses_images(make_pool):
    with pytest.raises(ApiError) as caught:
        await plan_chat(make_pool(images=False, template=VL_TEMPLATE), chat(text("what?"), image(CAT)))
    assert caught.value.status == 400 and caught.value.param == "messages[0].content[1].image_url.url"
    assert "multimodal" in caught.value.message


async def test_a_template_without_content_parts_has_no_place_for_an_image(make_pool):
    with pytest.raises(ApiError) as caught:
        await plan_chat(make_pool(images=True, template=STRING_TEMPLATE), chat(text("what?"), image(CAT)))
    assert caught.value.status == 400 and "template" in caught.value.message


async def test_video_and_audio_parts_are_still_refused(make_pool):
    video = {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}
    with pytest.raises(ApiError) as caught:
        await plan_chat(make_pool(images=True, template=VL_TEMPLATE), chat(text("what?"), video))
    assert caught.value.param == "messages[0].content[1].type"


def test_anthropic_image_sources_become_image_url_parts():
    assert anthropic_image_part({"type": "base64", "media_type": "image/png", "data": PNG}) == {
        "type": "image_url", "image_url": {"url": DOG},
    }  # fmt: skip
    assert anthropic_image_part({"type": "url", "url": CAT}) == {"type": "image_url", "image_url": {"url": CAT}}
    for bad in ({"type": "base64", "media_type": "text/plain", "data": "x"}, {"type": "file", "file_id": "f"},
                {"type": "url"}, {"type": "url", "url": "ftp://x"}):  # fmt: skip
        with pytest.raises(ApiError):
            anthropic_image_part(bad, "messages[0].content[0].source")


def test_responses_input_images_become_image_url_parts():
    assert responses_image_part({"type": "input_image", "image_url": CAT, "detail": "auto"}) == {
        "type": "image_url", "image_url": {"url": CAT},
    }  # fmt: skip
    with pytest.raises(ApiError) as caught:
        responses_image_part({"type": "input_image", "file_id": "file-1"}, "input[0].content[1]")
    assert caught.value.param == "input[0].content[1].file_id"


# ---- --allow-image-fetch --------------------------------------------------------------------------


async def serve_http(nursery: trio.Nursery, routes: dict[str, tuple[int, str, bytes, float]]) -> tuple[str, list[str]]:
    """A one-request-per-connection HTTP server: path -> (status, content type, body, delay)."""
    seen: list[str] = []

    async def handle(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            data = await stream.receive_some(4096)
            if not data:
                return
            request += data
        path = request.split(b" ", 2)[1].decode()
        seen.append(path)
        status, media, body, delay = routes.get(path, (404, "text/plain", b"missing", 0.0))
        await trio.sleep(delay)
        head = (
            f"HTTP/1.1 {status} X\r\nContent-Type: {media}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            await stream.send_all(head.encode() + body)
        except trio.BrokenResourceError:
            pass
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return f"http://127.0.0.1:{port}", seen


async def test_urls_go_to_the_engine_as_given_unless_fetching_is_allowed(make_pool, nursery):
    base, seen = await serve_http(nursery, {"/cat.png": (200, "image/png", b"\x89PNG-bytes", 0.0)})
    urls = [f"{base}/cat.png", DOG]
    assert await image_data_for(make_pool(images=True), urls, ["a", "b"]) == urls
    assert seen == []  # nothing was fetched
    fetched = await image_data_for(make_pool(images=True, allow_image_fetch=True), urls, ["a", "b"])
    inlined = base64.b64encode(b"\x89PNG-bytes").decode()
    assert fetched == [f"data:image/png;base64,{inlined}", DOG]
    assert seen == ["/cat.png"]


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        ((200, "text/html", b"<html>", 0.0), "not an image"),
        ((200, "image/png", b"x" * 2000, 0.0), "larger than"),
        ((404, "image/png", b"", 0.0), "answered 404"),
        ((200, "image/png", b"late", 5.0), "longer than"),
    ],
)
async def test_an_image_that_cannot_be_fetched_is_the_clients_400(make_pool, nursery, route, reason):
    base, _ = await serve_http(nursery, {"/img": route})
    pool = make_pool(images=True, allow_image_fetch=True, image_fetch_max_bytes=1000, image_fetch_timeout=0.5)
    with pytest.raises(ApiError) as caught:
        await image_data_for(pool, [f"{base}/img"], ["messages[0].content[0].image_url.url"])
    assert caught.value.status == 400 and reason in caught.value.message
    assert caught.value.param == "messages[0].content[0].image_url.url"
