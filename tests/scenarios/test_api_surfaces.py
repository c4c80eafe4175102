"""Embeddings, the token APIs, SGLang's `/generate` and image input, as their clients meet them:
`trio-direct serve` in front of two mock engine processes, the official `openai` SDK where one exists
(httpx for SGLang's native routes, which have none), streamed and unary, aggregated and prefill/decode."""

from __future__ import annotations

import json
import math
import shutil
import socket
from contextlib import aclosing
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING

import httpx
import openai
import pytest
import trio
from openai.types.chat import (
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartParam,
    ChatCompletionMessageParam,
)
from openai.types.responses import ResponseInputContentParam
from support import RawSseClient, settled_accounts, start_frontend, start_mock_engine

if TYPE_CHECKING:
    from anthropic.types import ContentBlockParam

pytestmark = pytest.mark.slow

FAST = ("--speedup", "inf", "--incremental-streaming-output")
VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The mock's prompt tokens per image (docs/mock-engine.md).
IMAGE_TOKENS = 16


async def two_engines(nursery, *args: str) -> list:
    return [await start_mock_engine(nursery, *args) for _ in range(2)]


def engine_flags(engines) -> list[str]:
    return [arg for engine in engines for arg in ("--engine-url", engine.url)]


async def model_of(base: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return (await client.get("/v1/models")).json()["data"][0]["id"]


async def settle(engines, timeout: float = 20.0) -> list[dict]:
    """Every engine's accounts once none holds a live request and the Aborts owed have arrived."""
    return await settled_accounts([engine.url for engine in engines], timeout)


def sdk(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def norm(vector) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


# ---- /v1/embeddings ------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["native", "smg", "vllm"])
async def test_embeddings_with_the_openai_sdk_over_two_embedding_engines(aio_loop, nursery, api):
    serves = ("--api", "vllm") if api == "vllm" else ()
    engines = await two_engines(nursery, *serves, "--is-embedding", *FAST)
    base = await start_frontend(nursery, "--engine-api", api, *engine_flags(engines))
    model = await model_of(base)
    client = sdk(base)
    one = await client.embeddings.create(model=model, input="The quick fox")  # the SDK asks for base64
    vector = one.data[0].embedding
    assert len(vector) == 256 and norm(vector) == pytest.approx(1.0, abs=1e-5)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        counted = (await http.post("/v1/tokenize", json={"model": model, "prompt": "The quick fox"})).json()
    assert one.usage.prompt_tokens == one.usage.total_tokens == counted["count"]
    batch = await client.embeddings.create(
        model=model, input=["The quick fox", "a lazy dog", "The quick fox", "one more"], encoding_format="float"
    )
    assert [item.index for item in batch.data] == [0, 1, 2, 3]
    vectors = [item.embedding for item in batch.data]
    assert vectors[0] == pytest.approx(vector) and vectors[2] == pytest.approx(vector)  # whichever engine
    assert vectors[1] != pytest.approx(vector)
    tokens = await client.embeddings.create(model=model, input=[[5, 6, 7], [8, 9]])
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 5
    flat = await client.embeddings.create(model=model, input=[5, 6, 7], encoding_format="float")
    assert flat.data[0].embedding == pytest.approx(tokens.data[0].embedding)
    # an embedding model generates nothing, and cannot be cut to dimensions it was not trained for
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=model, input="x", dimensions=64)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "dimensions"
    await client.close()
    accounts = await settle(engines)
    assert all(account["started"] >= 4 for account in accounts)  # round-robin spread the inputs
    assert all(account["started"] == account["finished"] for account in accounts)


async def test_a_matryoshka_model_cuts_its_vectors_to_the_dimensions_it_lists(aio_loop, nursery, tmp_path, tiny_model):
    model_dir = tmp_path / "matryoshka"
    shutil.copytree(tiny_model, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"matryoshka_dimensions": [64, 128, 256]}))
    engines = await two_engines(nursery, "--is-embedding", "--model-path", str(model_dir), *FAST)
    base = await start_frontend(nursery, *engine_flags(engines))
    model = await model_of(base)
    client = sdk(base)
    full = (await client.embeddings.create(model=model, input="cut me")).data[0].embedding
    cut = (await client.embeddings.create(model=model, input="cut me", dimensions=64)).data[0].embedding
    assert len(cut) == 64 and norm(cut) == pytest.approx(1.0, abs=1e-5)
    head = full[:64]
    assert cut == pytest.approx([x / norm(head) for x in head], abs=1e-6)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model=model, input="cut me", dimensions=100)
    assert isinstance(caught.value.body, dict)
    assert "only supports [64, 128, 256]" in caught.value.body["message"]
    await client.close()


async def test_a_client_that_leaves_an_embeddings_request_leaves_every_engine_idle(aio_loop, nursery):
    # slow prefills (speed 0.05x): the client is gone long before any vector is ready
    engines = await two_engines(nursery, "--is-embedding", "--speedup", "0.05")
    base = await start_frontend(nursery, *engine_flags(engines))
    model = await model_of(base)
    body = json.dumps({"model": model, "input": [" ".join(["word"] * 300)] * 4}).encode()
    host, port = base.removeprefix("http://").rsplit(":", 1)
    for _ in range(2):
        stream = await trio.open_tcp_stream(host, int(port))
        head = f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        await stream.send_all(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await trio.sleep(0.3)
        await stream.aclose()
    accounts = await settle(engines)
    started = sum(account["started"] for account in accounts)
    assert started == 8
    for account in accounts:
        assert account["finished"] == 0 and account["started"] == account["cancelled"] + account["aborted"]
        rids = [rid for rid, _ in account["abort_rpcs"]]
        assert len(rids) == len(set(rids)) == account["started"]  # one Abort per input still running


# ---- /v1/tokenize, /v1/detokenize ----------------------------------------------------------------


async def test_tokenize_and_detokenize_round_trip_and_count_what_a_chat_sends(aio_loop, nursery):
    engines = await two_engines(nursery, *FAST)
    base = await start_frontend(nursery, *engine_flags(engines))
    model = await model_of(base)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        plain = (await http.post("/v1/tokenize", json={"model": model, "prompt": "Hello there"})).json()
        assert plain["count"] == len(plain["tokens"]) and plain["max_model_len"] > 0
        sglang = (await http.post("/tokenize", json={"model": model, "prompt": ["Hello there", "bye"]})).json()
        assert sglang["tokens"][0] == plain["tokens"] and sglang["count"] == [plain["count"], len(sglang["tokens"][1])]
        back = (await http.post("/v1/detokenize", json={"model": model, "tokens": plain["tokens"]})).json()
        assert back == {"prompt": "Hello there", "text": "Hello there"}
        both = (await http.post("/detokenize", json={"model": model, "tokens": sglang["tokens"]})).json()
        assert both["text"] == ["Hello there", "bye"]
        chat_form = (await http.post("/v1/tokenize", json={"model": model, "messages": messages})).json()
        reply = await http.post("/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 2})
        assert chat_form["count"] == reply.json()["usage"]["prompt_tokens"]
        strs = (
            await http.post("/v1/tokenize", json={"model": model, "prompt": "Hi", "return_token_strs": True})
        ).json()
        assert len(strs["token_strs"]) == strs["count"]
        # a text past the context is still counted (by how much to cut it?) while that is cheap ...
        limit = plain["max_model_len"]
        over = (await http.post("/v1/tokenize", json={"model": model, "prompt": "x " * limit})).json()
        assert over["count"] > limit and over["max_model_len"] == limit
        # ... but one that provably cannot fit (counted in chunks, stopped at the limit) is refused
        refused = await http.post("/tokenize", json={"model": model, "prompt": "x " * (8 * limit)})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        assert refused.json()["error"]["param"] == "prompt"


# ---- /generate -----------------------------------------------------------------------------------


async def sse_events(http: httpx.AsyncClient, path: str, body: dict) -> list:
    events = []
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def check_generate(base: str) -> None:
    """`/generate` unary and streamed over `base`: same text, SGLang's shapes, the client's rid."""
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "rid": "my-1"}
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        unary = (await http.post("/generate", json=body)).json()
        meta = unary["meta_info"]
        assert meta["id"] == "my-1" and meta["finish_reason"] == {"type": "length", "length": 8}
        assert len(unary["output_ids"]) == meta["completion_tokens"] == 8 and meta["prompt_tokens"] > 0
        events = await sse_events(http, "/generate", body | {"stream": True})
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(later["text"].startswith(earlier["text"]) for earlier, later in pairwise(chunks))
        assert chunks[-1]["text"] == unary["text"] and chunks[-1]["output_ids"] == unary["output_ids"]
        assert chunks[-1]["meta_info"]["finish_reason"] == meta["finish_reason"]
        batch = (
            await http.post("/generate", json={"text": ["one", "two"], "sampling_params": {"max_new_tokens": 3}})
        ).json()
        assert [answer["meta_info"]["completion_tokens"] for answer in batch] == [3, 3]


@pytest.mark.parametrize("api", ["both", "vllm"])
async def test_generate_in_sglangs_shape_over_two_engines(aio_loop, nursery, api):
    engines = await two_engines(nursery, "--api", api, *FAST)
    base = await start_frontend(nursery, *engine_flags(engines))
    await check_generate(base)
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        logprobs = (
            await http.post(
                "/generate",
                json={
                    "input_ids": [5, 6, 7], "return_logprob": True, "top_logprobs_num": 2,
                    "return_text_in_logprobs": True, "sampling_params": {"max_new_tokens": 3, "stop": ["zzz"]},
                },
            )
        ).json()  # fmt: skip
        rows = logprobs["meta_info"]["output_token_logprobs"]
        assert [row[1] for row in rows] == logprobs["output_ids"] and all(isinstance(row[2], str) for row in rows)
        assert len(logprobs["meta_info"]["output_top_logprobs"][0]) == 2
    accounts = await settle(engines)
    assert all(account["started"] >= 2 for account in accounts)


async def test_generate_over_prefill_and_decode_engines(aio_loop, nursery):
    prefill = await start_mock_engine(
        nursery, "--role", "prefill", "--disaggregation-bootstrap-port", str(free_port()), *FAST
    )
    decode = await start_mock_engine(nursery, "--role", "decode", *FAST)
    base = await start_frontend(nursery, "--prefill-engine-url", prefill.url, "--engine-url", decode.url)
    await check_generate(base)
    accounts = await settle([prefill, decode])
    for account in accounts:  # each request ran as a prefill leg and a decode leg, to the end
        assert account["started"] == account["finished"] == 4


async def test_a_client_that_leaves_a_streamed_generate_leaves_every_engine_idle(aio_loop, nursery):
    engines = await two_engines(nursery, "--incremental-streaming-output")  # real step times: tokens keep coming
    base = await start_frontend(nursery, *engine_flags(engines))
    client = RawSseClient(base)
    body = {"text": "Talk to me", "sampling_params": {"max_new_tokens": 200}, "stream": True}
    cut: list[str] = []
    for keep in (1, 3, 6, 2):
        async with aclosing(client.events("/generate", body)) as events:
            async for event in events:
                keep -= 1
                if keep == 0:
                    cut.append(event["meta_info"]["id"])  # no rid given: the engine request's own id
                    break
    accounts = await settle(engines)
    abort_rids = [rid for account in accounts for rid, _ in account["abort_rpcs"]]
    assert sorted(abort_rids) == sorted(cut)  # one Abort per request, each still running
    for account in accounts:
        assert account["finished"] == 0 and account["started"] == account["cancelled"] + account["aborted"]


# ---- image input ---------------------------------------------------------------------------------


async def serve_image(nursery: trio.Nursery, body: bytes) -> tuple[str, list[str]]:
    """An HTTP server answering every GET with `body` as image/png; returns its URL and the paths asked."""
    seen: list[str] = []

    async def handle(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            data = await stream.receive_some(4096)
            if not data:
                return
            request += data
        seen.append(request.split(b" ", 2)[1].decode())
        head = f"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode() + body)
        await stream.aclose()

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/cat.png", seen


@pytest.mark.parametrize(("fetch", "disaggregated"), [(False, False), (True, False), (False, True)])
async def test_chat_with_images_through_the_sdk_on_multimodal_engines(
    aio_loop, nursery, tmp_path, fetch, disaggregated
):
    template = tmp_path / "vl.jinja"
    template.write_text(VL_TEMPLATE)
    url, fetched = await serve_image(nursery, b"\x89PNG not really")
    flags = ["--allow-image-fetch"] if fetch else []
    if disaggregated:  # both legs get the images: the prefill computes them, the decode counts them
        port = str(free_port())
        prefill = await start_mock_engine(
            nursery, "--multimodal", "--role", "prefill", "--disaggregation-bootstrap-port", port, *FAST
        )
        decode = await start_mock_engine(nursery, "--multimodal", "--role", "decode", *FAST)
        flags += ["--prefill-engine-url", prefill.url, "--engine-url", decode.url]
    else:
        flags += engine_flags(await two_engines(nursery, "--multimodal", *FAST))
    base = await start_frontend(nursery, "--chat-template", str(template), *flags)
    model = await model_of(base)
    content: list[ChatCompletionContentPartParam] = [
        {"type": "text", "text": "What is on"},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    ]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": content}]
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        text_tokens = (await http.post("/v1/tokenize", json={"model": model, "messages": messages})).json()["count"]

    def use_sdk() -> None:  # the synchronous client: its streams close cleanly outside an event loop
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        # ignore_eos: the mock's tokens follow the prompt, which holds the image server's port, so
        # an EOS among the 4 could end the answer early in one run of a few hundred
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, extra_body={"ignore_eos": True}
        )
        assert reply.choices[0].finish_reason == "length"
        # the engine got both images: each counts its tokens on top of the placeholders' text
        assert reply.usage is not None
        assert reply.usage.prompt_tokens == text_tokens + 2 * IMAGE_TOKENS
        stream = client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens == text_tokens + 2 * IMAGE_TOKENS
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        client.close()

    await trio.to_thread.run_sync(use_sdk)
    assert fetched == (["/cat.png", "/cat.png"] if fetch else [])  # only a flag lets the frontend fetch


async def test_a_text_only_model_refuses_images_through_the_sdk(aio_loop, nursery):
    engines = await two_engines(nursery, *FAST)
    base = await start_frontend(nursery, *engine_flags(engines))
    client = sdk(base)
    image: ChatCompletionContentPartImageParam = {
        "type": "image_url",
        "image_url": {"url": "https://images.example/cat.png"},
    }
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=await model_of(base), messages=[{"role": "user", "content": [image]}], max_tokens=2
        )
    assert isinstance(caught.value.body, dict)
    assert "multimodal" in caught.value.body["message"]
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "messages[0].content[0].image_url.url"
    await client.close()


# ---- bad input: each route's own envelope, never a 5xx -------------------------------------------

MODEL = "{model}"

#: (name, path, body, status, param or None) against a frontend of generation engines
GENERATION_CASES = [
    ("generate: no prompt", "/generate", {"sampling_params": {}}, 400, "text"),
    ("generate: both prompts", "/generate", {"text": "a", "input_ids": [1]}, 400, "text"),
    ("generate: empty text", "/generate", {"text": ""}, 400, "text"),
    ("generate: empty ids", "/generate", {"input_ids": []}, 400, "input_ids"),
    ("generate: id out of vocabulary", "/generate", {"input_ids": [1, 10**7]}, 400, "input_ids"),
    ("generate: bad max_new_tokens", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": -3}}, 400,
     "sampling_params.max_new_tokens"),
    ("generate: prompt too long", "/generate", {"input_ids": [5] * 40000}, 400, "input_ids"),
    ("generate: unknown model", "/generate", {"text": "a", "model": "nope"}, 404, "model"),
    ("generate: lora", "/generate", {"text": "a", "lora_path": "x"}, 400, "lora_path"),
    ("generate: prompt logprobs", "/generate", {"text": "a", "return_logprob": True, "logprob_start_len": 0}, 400,
     "logprob_start_len"),
    ("generate: image on a text model", "/generate", {"text": "a", "image_data": "https://x/y.png"}, 400,
     "image_data"),
    ("generate: malformed", "/generate", b"{nope", 400, None),
    ("tokenize: nothing", "/v1/tokenize", {"model": MODEL}, 400, "prompt"),
    ("tokenize: wrong type", "/v1/tokenize", {"model": MODEL, "prompt": 5}, 400, "prompt"),
    ("tokenize: unknown model", "/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
    ("tokenize: bad message", "/v1/tokenize", {"model": MODEL, "messages": [{"role": "boss", "content": "x"}]}, 400,
     None),
    ("detokenize: out of vocabulary", "/v1/detokenize", {"model": MODEL, "tokens": [1, 10**7]}, 400, "tokens"),
    ("detokenize: negative", "/detokenize", {"model": MODEL, "tokens": [-1]}, 400, "tokens[0]"),
    ("detokenize: missing tokens", "/v1/detokenize", {"model": MODEL}, 400, "tokens"),
    ("embeddings: generation model", "/v1/embeddings", {"model": MODEL, "input": "a"}, 400, "model"),
    ("embeddings: empty", "/v1/embeddings", {"model": MODEL, "input": ""}, 400, "input"),
    ("chat: image on a text model", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}, 400, "messages[0].content[0].image_url.url"),
    ("chat: image URL scheme", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}, 400,
     "messages[0].content[0].image_url.url"),
]  # fmt: skip

#: the same against a frontend of embedding engines
EMBEDDING_CASES = [
    ("embeddings: missing input", "/v1/embeddings", {"model": MODEL}, 400, "input"),
    ("embeddings: empty list", "/v1/embeddings", {"model": MODEL, "input": []}, 400, "input"),
    ("embeddings: empty item", "/v1/embeddings", {"model": MODEL, "input": ["a", " "]}, 400, "input[1]"),
    ("embeddings: mixed list", "/v1/embeddings", {"model": MODEL, "input": ["a", [1]]}, 400, "input[1]"),
    ("embeddings: negative id", "/v1/embeddings", {"model": MODEL, "input": [1, -1]}, 400, "input[1]"),
    ("embeddings: out of vocabulary", "/v1/embeddings", {"model": MODEL, "input": [[1, 10**7]]}, 400, "input[0]"),
    ("embeddings: too long", "/v1/embeddings", {"model": MODEL, "input": [5] * 40000}, 400, "input"),
    ("embeddings: too many", "/v1/embeddings", {"model": MODEL, "input": ["a"] * 2049}, 400, "input"),
    ("embeddings: bad format", "/v1/embeddings", {"model": MODEL, "input": "a", "encoding_format": "int8"}, 400,
     "encoding_format"),
    ("embeddings: dimensions", "/v1/embeddings", {"model": MODEL, "input": "a", "dimensions": 16}, 400, "dimensions"),
    ("embeddings: zero dimensions", "/v1/embeddings", {"model": MODEL, "input": "a", "dimensions": 0}, 400,
     "dimensions"),
    ("embeddings: unknown model", "/v1/embeddings", {"model": "nope", "input": "a"}, 404, "model"),
    ("embeddings: malformed", "/v1/embeddings", b"[1]", 400, None),
    ("chat on an embedding model", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ("completion on an embedding model", "/v1/completions", {"model": MODEL, "prompt": "hi"}, 400, "model"),
    ("generate on an embedding model", "/generate", {"text": "hi"}, 400, "model"),
    ("tokenize on an embedding model", "/v1/tokenize", {"model": MODEL, "prompt": "hi"}, 200, None),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "cases"), [((), GENERATION_CASES), (("--is-embedding",), EMBEDDING_CASES)])
async def test_bad_input_gets_the_routes_error_envelope_never_a_5xx(aio_loop, nursery, flags, cases):
    engines = await two_engines(nursery, *flags, *FAST)
    base = await start_frontend(nursery, *engine_flags(engines))
    model = await model_of(base)
    failures = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        for name, path, body, status, param in cases:
            content = body if isinstance(body, bytes) else json.dumps(body).replace(MODEL, model).encode()
            with trio.fail_after(10):
                response = await http.post(path, content=content, headers={"content-type": "application/json"})
            try:
                assert response.status_code == status, response.status_code
                if status != 200:
                    error = response.json()["error"]
                    assert set(error) == {"message", "type", "param", "code"} and error["message"]
                    if param is not None:
                        assert error["param"] == param, error
            except (AssertionError, ValueError, KeyError) as failure:
                failures.append(f"{name}: {failure!r} / {response.status_code} {response.text[:300]}")
    assert not failures, "\n".join(failures)
    accounts = await settle(engines)
    assert all(account["live"] == [] for account in accounts)


async def test_anthropic_and_responses_image_inputs_reach_the_engine(aio_loop, nursery, tmp_path):
    """Anthropic `image` blocks (base64 and URL sources) and Responses `input_image` parts travel as
    the chat's images do: the engine gets them and counts their tokens."""
    import anthropic

    template = tmp_path / "vl.jinja"
    template.write_text(VL_TEMPLATE)
    base = await start_frontend(
        nursery, "--chat-template", str(template), *engine_flags(await two_engines(nursery, "--multimodal", *FAST))
    )
    model = await model_of(base)
    as_chat = [
        {"role": "user", "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://images.example/cat.png"}},
        ]},
    ]  # fmt: skip
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        text_tokens = (await http.post("/v1/tokenize", json={"model": model, "messages": as_chat})).json()["count"]

    def use_sdks() -> tuple[int, int]:
        claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        blocks: list[ContentBlockParam] = [
            {"type": "text", "text": "Compare"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://images.example/cat.png"}},
        ]
        message = claude.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": blocks}])
        claude.close()
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        parts: list[ResponseInputContentParam] = [
            {"type": "input_text", "text": "Compare"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},  # type: ignore[list-item]  # "detail" left out: the API defaults it, the SDK marks it Required
            {"type": "input_image", "image_url": "https://images.example/cat.png"},  # type: ignore[list-item]  # "detail" left out: the API defaults it, the SDK marks it Required
        ]
        response = client.responses.create(
            model=model, max_output_tokens=4, store=False, input=[{"role": "user", "content": parts}]
        )
        client.close()
        assert response.usage is not None
        return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0), response.usage.input_tokens

    messages_tokens, responses_tokens = await trio.to_thread.run_sync(use_sdks)
    assert messages_tokens == responses_tokens == text_tokens + 2 * IMAGE_TOKENS


async def test_an_embedding_model_and_a_generation_model_behind_one_frontend(aio_loop, nursery):
    """Each kind serves its own routes; the other kind's routes get a 400 in their own envelope."""
    embedder = await start_mock_engine(nursery, "--is-embedding", "--served-model-name", "embedder", *FAST)
    writer = await start_mock_engine(nursery, "--served-model-name", "writer", *FAST)
    base = await start_frontend(nursery, *engine_flags([embedder, writer]))
    client = sdk(base)
    assert sorted(model.id for model in (await client.models.list()).data) == ["embedder", "writer"]
    vector = (await client.embeddings.create(model="embedder", input="a fox", encoding_format="float")).data[0]
    assert len(vector.embedding) == 256
    reply = await client.chat.completions.create(
        model="writer", messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="embedder", messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="embedder", input="Hi")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "model_not_supported"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model="writer", input="a fox")
    assert caught.value.status_code == 400
    await client.close()
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        refused = await http.post(
            "/v1/messages",
            json={"model": "embedder", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        )
    assert refused.status_code == 400
    assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "invalid_request_error"
    for account in await settle([embedder, writer]):
        assert account["started"] == account["finished"]
