"""The routes SGLang's and vLLM's users and tools call, answered by the frontend as those servers do."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
import trio
from support import start_frontend

pytestmark = pytest.mark.slow

ADMIN = {"Authorization": "Bearer admin-secret"}


@pytest.fixture
async def two_apis(mock_engine_factory, nursery):
    """One model on a native-API engine and an SMG-API engine; the admin API on."""
    native = await mock_engine_factory(api="native", incremental_streaming_output=True)
    smg = await mock_engine_factory(api="smg")
    base = await start_frontend(
        nursery,
        "--engine-url", f"{native.host}:{native.port}",
        "--engine-url", f"{smg.host}:{smg.port}",
        "--admin-api-key", "admin-secret",
        "--api-key", "client-secret",
        "--health-interval", "0",  # the SMG health check generates: only /health_generate may here
    )  # fmt: skip
    return base, native, smg


async def test_version_model_and_server_info(two_apis):
    base, native, _ = two_apis
    headers = {"Authorization": "Bearer client-secret"}
    async with httpx.AsyncClient(base_url=base) as anonymous:  # --api-key guards all but probes and /version
        assert "version" in (await anonymous.get("/version")).json()
        assert (await anonymous.get("/get_model_info")).status_code == 401
    async with httpx.AsyncClient(base_url=base, headers=headers) as client:
        info = (await client.get("/get_model_info")).json()
        assert info["model_path"] == native.info.model_path and info["is_generation"] is True
        assert info["max_model_len"] == native.info.max_req_input_len
        assert info["tokenizer_encoder"].startswith("tiktoken: ")  # the tiny model's proof holds
        server = (await client.get("/get_server_info")).json()
        assert "api_key" not in server["server_args"] and "client-secret" not in str(server)
        assert [e["id"] for e in server["engines"]] == ["e0", "e1"]


async def test_health_generate_makes_one_real_token(two_apis):
    base, native, smg = two_apis
    before = native.engine.accounting.finished + smg.engine.accounting.finished
    async with httpx.AsyncClient(base_url=base) as client:  # open, like /health
        reply = await client.get("/health_generate")
    assert reply.status_code == 200 and reply.json()["status"] == "ok"
    assert native.engine.accounting.finished + smg.engine.accounting.finished == before + 1


async def test_flush_cache_flushes_every_engine_of_both_apis(two_apis):
    base, _, _ = two_apis
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.post("/flush_cache", headers={"Authorization": "Bearer client-secret"})).status_code == 401
        reply = await client.post("/flush_cache", headers=ADMIN)
    body = reply.json()
    assert reply.status_code == 200 and body["success"] is True
    assert sorted(e["engine"] for e in body["engines"] if e["success"]) == ["e0", "e1"]


async def test_models_tokenize_and_prompt_logprobs_with_the_sdk(two_apis):
    base, native, _ = two_apis

    def use_sdk() -> None:
        client = openai.OpenAI(base_url=base + "/v1", api_key="client-secret", max_retries=0)
        [card] = client.models.list().data
        extra = card.model_extra
        assert extra is not None
        assert card.owned_by == "trio-direct" and extra["root"] == native.info.model_path
        assert extra["parent"] is None and extra["max_model_len"] == native.info.max_req_input_len
        for _ in range(2):  # round-robin: once on each engine API
            reply = client.completions.create(model=card.id, prompt="Hello there", echo=True, logprobs=2, max_tokens=3)
            logprobs = reply.choices[0].logprobs
            assert reply.usage is not None
            prompt_tokens = reply.usage.prompt_tokens
            assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.tokens is not None
            assert len(logprobs.tokens) == prompt_tokens + 3  # both APIs: the prompt's rows lead
            assert logprobs.token_logprobs[0] is None
            assert all(lp is not None for lp in logprobs.token_logprobs[1:])

    await trio.to_thread.run_sync(use_sdk)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer client-secret"}) as client:
        tokens = (await client.post("/v1/tokenize", json={"prompt": "Hello"})).json()["tokens"]
        assert tokens and (await client.post("/v1/detokenize", json={"tokens": tokens})).json()["prompt"] == "Hello"


@pytest.mark.parametrize("api", ["native", "smg", "vllm"])
async def test_echo_logprobs_show_the_prompt_once_over_every_engine_api(mock_engine_factory, nursery, api):
    engine = await mock_engine_factory(api=api, incremental_streaming_output=True)
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--health-interval", "0")

    def ask(stream: bool, max_tokens: int) -> tuple[list, int, str]:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        args: dict[str, Any] = {"model": "trio-direct-mock", "prompt": "Hello there", "echo": True, "logprobs": 1}
        args |= {"max_tokens": max_tokens, "temperature": 0}
        if not stream:
            reply = client.completions.create(**args)
            choice = reply.choices[0]
            return choice.logprobs.token_logprobs, reply.usage.prompt_tokens, choice.text
        rows: list = []
        text, prompt_tokens = "", 0
        for chunk in client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
            if chunk.usage:
                prompt_tokens = chunk.usage.prompt_tokens
            if chunk.choices:
                text += chunk.choices[0].text
                rows += chunk.choices[0].logprobs.token_logprobs if chunk.choices[0].logprobs else []
        return rows, prompt_tokens, text

    # One token: the engine's first output is also its last (vLLM's and SMG's streamed `complete`
    # repeats the prompt's rows then); three: they come with the first chunk only.
    for max_tokens in (1, 3):
        unary = await trio.to_thread.run_sync(ask, False, max_tokens)
        streamed = await trio.to_thread.run_sync(ask, True, max_tokens)
        for rows, prompt_tokens, text in (unary, streamed):
            assert prompt_tokens > 1 and len(rows) == prompt_tokens + max_tokens
            assert rows[0] is None and all(lp is not None for lp in rows[1:])
            assert text.startswith("Hello there")
        assert streamed[0] == unary[0]  # the same rows, each once, whether streamed or not


async def test_removing_an_engine_answers_draining(mock_engine_factory, nursery):
    engine = await mock_engine_factory()
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--admin-api-key", "k")
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer k"}) as client:
        reply = await client.delete("/admin/engines/e0")
    assert reply.status_code == 200 and reply.json()["state"] == "draining"
