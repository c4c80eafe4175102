"""Several models behind one `trio-direct serve`: engines grouped into pools by served model name,
each pool with its own tokenizer; a model whose engines are all down answers 503 while the others
keep serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest
import trio
from support import start_frontend, start_mock_engine
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from trio_direct.mock.tiny_model import SPECIAL_TOKENS

pytestmark = pytest.mark.slow

FAST = ("--speedup", "inf", "--incremental-streaming-output")
PROMPT = "The quick brown fox jumps over the lazy dog near the quiet river bank."


def model_with_another_tokenizer(tiny_model: Path, directory: Path) -> Path:
    """The tiny model's directory with a smaller byte-level BPE (same special tokens, same ids)."""
    shutil.copytree(tiny_model, directory)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, min_frequency=1, show_progress=False, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(["a tiny corpus of words, just a few of them"] * 10, trainer=trainer)
    (directory / "tokenizer.json").write_text(tokenizer.to_str())
    config = json.loads((directory / "config.json").read_text())
    config["vocab_size"] = tokenizer.get_vocab_size(with_added_tokens=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def token_count(directory: Path, text: str) -> int:
    return len(Tokenizer.from_file(str(directory / "tokenizer.json")).encode(text).ids)


async def test_two_models_with_their_own_tokenizers_serve_side_by_side(aio_loop, nursery, tiny_model, tmp_path):
    other = model_with_another_tokenizer(tiny_model, tmp_path / "other-model")
    assert token_count(tiny_model, PROMPT) != token_count(other, PROMPT)
    first = [await start_mock_engine(nursery, *FAST, "--model-path", str(tiny_model), "--served-model-name", "alpha")
             for _ in range(2)]  # fmt: skip
    second = await start_mock_engine(nursery, *FAST, "--model-path", str(other), "--served-model-name", "engine-beta")
    base = await start_frontend(
        nursery, *(arg for e in [*first, second] for arg in ("--engine-url", e.url)),
        "--served-model-name", "engine-beta=beta", "--model-path", f"beta={other}",
        "--health-interval", "0.2", "--health-timeout", "0.5",
    )  # fmt: skip

    def use_sdk() -> dict[str, int]:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        try:
            assert sorted(m.id for m in client.models.list().data) == ["alpha", "beta"]
            counts = {}
            for model in ("alpha", "beta"):
                reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=3)
                assert reply.usage is not None
                counts[model] = reply.usage.prompt_tokens
                assert reply.model == model and reply.choices[0].text
                chat = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
                )
                assert chat.choices[0].message.content
            return counts
        finally:
            client.close()

    counts = await trio.to_thread.run_sync(use_sdk)
    assert counts == {"alpha": token_count(tiny_model, PROMPT), "beta": token_count(other, PROMPT)}

    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        state = (await client.get("/debug/routing")).json()["models"]
        assert [w["engine"] for w in state["alpha"]["workers"]] == ["e0", "e1"]
        assert [w["engine"] for w in state["beta"]["workers"]] == ["e2"]

        second.process.kill()  # the beta pool loses its only engine
        await second.process.wait()
        body = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        with trio.fail_after(10):
            while (await client.post("/v1/chat/completions", json=body)).status_code != 503:
                await trio.sleep(0.1)
        reply = await client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 503 and reply.json()["error"]["type"]
        for _ in range(4):  # alpha keeps serving
            alpha = await client.post("/v1/chat/completions", json={**body, "model": "alpha"})
            assert alpha.status_code == 200
        assert (await client.get("/health")).status_code == 200  # ready: some model can be served
        models_listed = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert sorted(models_listed) == ["alpha", "beta"]  # its engine may come back: still listed
        unknown = await client.post("/v1/chat/completions", json={**body, "model": "gamma"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


async def test_a_model_whose_last_engine_left_is_no_longer_served(aio_loop, nursery, tmp_path):
    a = await start_mock_engine(nursery, *FAST)
    b = await start_mock_engine(nursery, *FAST)
    path = tmp_path / "engines.json"
    # The file names the pool of each engine (both report the same served name).
    path.write_text(json.dumps([{"url": a.url, "model": "alpha"}, {"url": b.url, "model": "beta"}]))
    base = await start_frontend(nursery, "--engine-file", str(path), "--discovery-interval", "0.2")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        assert sorted(m["id"] for m in (await client.get("/v1/models")).json()["data"]) == ["alpha", "beta"]
        body = {"model": "beta", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

        path.write_text(json.dumps([{"url": a.url, "model": "alpha"}]))
        with trio.fail_after(20):
            while len((await client.get("/v1/models")).json()["data"]) > 1:
                await trio.sleep(0.05)
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["alpha"]
        gone = await client.post("/v1/chat/completions", json=body)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
        assert (await client.post("/v1/chat/completions", json={**body, "model": "alpha"})).status_code == 200

        path.write_text(json.dumps([{"url": a.url, "model": "alpha"}, {"url": b.url, "model": "beta"}]))
        with trio.fail_after(20):  # it comes back: a new pool opens for it
            while (await client.post("/v1/chat/completions", json=body)).status_code != 200:
                await trio.sleep(0.05)
