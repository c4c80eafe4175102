"""`/generate`, `/v1/embeddings` and `/tokenize` refuse a text that cannot fit the context as chat and
completions do, before encoding it whole (`surfaces.prompting`); without a known context length the
text is encoded, and a long one on a worker thread, so the event loop serves on."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from trio_direct.core.errors import ApiError
from trio_direct.core.plan import MAX_CHOICES
from trio_direct.openai.embeddings import decode_embedding_request
from trio_direct.openai.requests import decode_completion_request
from trio_direct.surfaces.completions import plan_completion
from trio_direct.surfaces.embeddings import embedding_prompts
from trio_direct.surfaces.generate import plan_generate
from trio_direct.surfaces.generate_request import decode_generate_request
from trio_direct.surfaces.tokenization import tokenize
from trio_direct.text.tokenizer import ModelTokenizer

#: Far over a 4096-token context by its length alone (the tiny model's tokens stand for a few dozen
#: characters at most), and over it only by count (one-character words, a token each).
FAR_OVER = "lorem ipsum " * 100_000
COUNTED_OVER = "x " * 40_000


@pytest.fixture
def encodes(monkeypatch) -> list[tuple[int, bool]]:
    """Every whole encoding as (characters, on the event loop's thread): `encode`, and `encode_packed`
    (which may call `encode`: counted once)."""
    seen: list[tuple[int, bool]] = []
    inside = threading.local()

    def recorded(method):
        def recording(self, text: str, add_special_tokens: bool = True):
            if not getattr(inside, "depth", 0):
                seen.append((len(text), threading.current_thread() is threading.main_thread()))
            inside.depth = getattr(inside, "depth", 0) + 1
            try:
                return method(self, text, add_special_tokens)
            finally:
                inside.depth -= 1

        return recording

    monkeypatch.setattr(ModelTokenizer, "encode", recorded(ModelTokenizer.encode))
    monkeypatch.setattr(ModelTokenizer, "encode_packed", recorded(ModelTokenizer.encode_packed))
    return seen


class FakeExchange:
    """What the tokenize handler reads and writes of an HTTP exchange."""

    def __init__(self, pool, body: dict) -> None:
        self.body = json.dumps(body).encode()
        self.frontend = SimpleNamespace(pool=lambda model: pool, pool_or_only=lambda model: pool)
        self.answer: dict | None = None

    async def json(self, status: int, body: bytes) -> None:
        assert status == 200
        self.answer = json.loads(body)


def refused(error: pytest.ExceptionInfo[ApiError], param: str) -> bool:
    return error.value.status == 400 and error.value.code == "context_length_exceeded" and error.value.param == param


@pytest.mark.parametrize("text", [FAR_OVER, COUNTED_OVER], ids=["by length", "by count"])
async def test_generate_refuses_a_text_over_the_context_without_encoding_it(make_pool, encodes, text):
    with pytest.raises(ApiError) as error:
        await plan_generate(make_pool(), decode_generate_request(json.dumps({"text": text}).encode()))
    assert refused(error, "text") and "maximum context length is 4096" in error.value.message
    with pytest.raises(ApiError) as error:
        await plan_generate(make_pool(), decode_generate_request(json.dumps({"text": ["Hi", text]}).encode()))
    assert refused(error, "text[1]")
    assert all(chars < 10 for chars, _ in encodes)  # only "Hi" was encoded


@pytest.mark.parametrize("text", [FAR_OVER, COUNTED_OVER], ids=["by length", "by count"])
async def test_embeddings_refuse_an_input_over_the_context_without_encoding_it(make_pool, encodes, text):
    pool = make_pool(embedding=True)
    with pytest.raises(ApiError) as error:
        await embedding_prompts(pool, decode_embedding_request(json.dumps({"model": "m", "input": text}).encode()))
    assert refused(error, "input")
    listed = json.dumps({"model": "m", "input": ["Hi", text]}).encode()
    with pytest.raises(ApiError) as error:
        await embedding_prompts(pool, decode_embedding_request(listed))
    assert refused(error, "input[1]")
    assert all(chars < 10 for chars, _ in encodes)


@pytest.mark.parametrize("text", [FAR_OVER, COUNTED_OVER], ids=["by length", "by count"])
async def test_tokenize_refuses_a_text_that_provably_cannot_fit(make_pool, encodes, text):
    for prompt in (text, ["Hi", text]):
        with pytest.raises(ApiError) as error:
            await tokenize(FakeExchange(make_pool(), {"model": "m", "prompt": prompt}))  # type: ignore[arg-type]
        assert refused(error, "prompt")
    assert all(chars < 10 for chars, _ in encodes)


async def test_tokenize_counts_a_text_past_the_context_while_that_is_cheap(make_pool):
    exchange = FakeExchange(make_pool(), {"model": "m", "prompt": "x " * 5000})
    await tokenize(exchange)  # type: ignore[arg-type]
    assert exchange.answer is not None and exchange.answer["count"] > exchange.answer["max_model_len"] == 4096


async def test_without_a_context_length_long_texts_are_encoded_on_a_worker_thread(make_pool, encodes):
    """Nothing to refuse by (the engines said no limit; only the body size bounds the text), but the
    encoding of a long text must not stall every other stream on the event loop."""
    pool = make_pool(context_length=None)
    long = "lorem ipsum " * 2_000
    plan = await plan_generate(pool, decode_generate_request(json.dumps({"text": long}).encode()))
    assert len(plan.prompts[0].token_ids) > 0
    exchange = FakeExchange(pool, {"model": "m", "prompt": long})
    await tokenize(exchange)  # type: ignore[arg-type]
    chat = {"model": "m", "messages": [{"role": "user", "content": long}], "add_special_tokens": True}
    await tokenize(FakeExchange(pool, chat))  # type: ignore[arg-type]
    embedding = make_pool(context_length=None, embedding=True)
    await embedding_prompts(embedding, decode_embedding_request(json.dumps({"model": "m", "input": long}).encode()))
    short = "Hello there"
    await plan_generate(pool, decode_generate_request(json.dumps({"text": short}).encode()))
    long_encodes = [on_loop for chars, on_loop in encodes if chars >= len(long)]
    assert len(long_encodes) == 4 and not any(long_encodes), encodes
    assert (len(short), True) in encodes  # a short text is encoded in place: a thread costs more


async def test_where_a_text_is_encoded_follows_its_estimated_cost_not_its_length(make_pool, encodes):
    """A text tiktoken encodes goes on the event loop up to ~1 ms of estimated work (a thread's
    hand-off costs more than that saves); one in a script only Hugging Face's ~8x slower encoder
    covers goes to a worker thread when shorter than the ~16k characters of that.
    Both are under the context's bound, so nothing is refused."""
    pool = make_pool(context_length=None)
    covered = "lorem ipsum " * 700  # 8,400 characters, ~0.5 ms estimated for tiktoken
    uncovered = "中文字 " * 600  # 2,400 characters, ~1.2 ms estimated for Hugging Face's encoder
    assert pool.tokenizer.fast_encoder is not None
    assert pool.tokenizer.fast_encoder.covers(covered) and not pool.tokenizer.fast_encoder.covers(uncovered)
    for text in (covered, uncovered):
        await plan_completion(pool, decode_completion_request(json.dumps({"model": "m", "prompt": text}).encode()))
        await plan_generate(pool, decode_generate_request(json.dumps({"text": text}).encode()))
        await tokenize(FakeExchange(pool, {"model": "m", "prompt": text}))  # type: ignore[arg-type]
    assert encodes == [(len(covered), True)] * 3 + [(len(uncovered), False)] * 3


async def test_a_batch_of_more_prompts_than_one_request_may_start_is_refused_before_any_is_encoded(make_pool, encodes):
    """A million one-word prompts would be a million engine calls: refused from the count alone."""
    many = ["Hi"] * (MAX_CHOICES + 1)
    with pytest.raises(ApiError) as error:
        await plan_generate(make_pool(), decode_generate_request(json.dumps({"text": many}).encode()))
    assert error.value.status == 400 and error.value.param == "text" and str(MAX_CHOICES + 1) in error.value.message
    body = {"model": "m", "prompt": ["Hi"] * (MAX_CHOICES // 2 + 1), "n": 2, "max_tokens": 1}
    with pytest.raises(ApiError) as error:
        await plan_completion(make_pool(), decode_completion_request(json.dumps(body).encode()))
    assert error.value.status == 400 and error.value.param == "prompt" and "n=2" in error.value.message
    assert encodes == []
    plan = await plan_generate(make_pool(), decode_generate_request(json.dumps({"text": ["Hi"] * 8}).encode()))
    assert len(plan.choices) == 8  # a batch within the bound plans as before
