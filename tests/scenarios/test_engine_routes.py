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
            if logprobs.token_logprobs[0] is None:  # the native API: the prompt's rows lead
                assert len(logprobs.tokens) == prompt_tokens + 3
                assert all(lp is not None for lp in logprobs.token_logprobs[1:])
            else:  # the SMG mock sends no prompt rows: the output's only
                assert len(logprobs.tokens) == 3

    await trio.to_thread.run_sync(use_sdk)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer client-secret"}) as client:
        tokens = (await client.post("/v1/tokenize", json={"prompt": "Hello"})).json()["tokens"]
        assert tokens and (await client.post("/v1/detokenize", json={"tokens": tokens})).json()["prompt"] == "Hello"


async def test_native_echo_logprobs_show_the_prompt(mock_engine_factory, nursery):
    engine = await mock_engine_factory(api="native")
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}")

    def ask(stream: bool) -> tuple[list, int]:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        args: dict[str, Any] = {
            "model": "trio-direct-mock",
            "prompt": "Hello there",
            "echo": True,
            "logprobs": 1,
            "max_tokens": 2,
        }
        if not stream:
            reply = client.completions.create(**args)
            return reply.choices[0].logprobs.token_logprobs, reply.usage.prompt_tokens
        rows: list = []
        for chunk in client.completions.create(**args, stream=True):
            if chunk.choices and chunk.choices[0].logprobs:
                rows += chunk.choices[0].logprobs.token_logprobs
        return rows, len(rows) - 2

    for stream in (False, True):
        rows, prompt_tokens = await trio.to_thread.run_sync(ask, stream)
        assert rows[0] is None and len(rows) == prompt_tokens + 2 and prompt_tokens > 1


async def test_removing_an_engine_answers_draining(mock_engine_factory, nursery):
    engine = await mock_engine_factory()
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--admin-api-key", "k")
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": "Bearer k"}) as client:
        reply = await client.delete("/admin/engines/e0")
    assert reply.status_code == 200 and reply.json()["state"] == "draining"
