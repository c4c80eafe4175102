"""OpenAI's `max_tokens` semantics: a request without a limit generates until EOS or the context.

SGLang's native API applies its own default of 128 new tokens when a request names none; the
frontend must not let that leak: a long answer ends at its EOS (`stop`), on both engine APIs and on
the Chat and Responses surfaces (legacy Completions keep their documented default of 16). The operator may still cap it (`--default-max-tokens`).
Anthropic's Messages API keeps `max_tokens` required, as Anthropic's own does.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import trio
from support import start_frontend

pytestmark = pytest.mark.slow

#: ~300 tokens of the tiny model: well past SGLang's default of 128.
LONG_ANSWER = " ".join(["hello world"] * 100)


@pytest.fixture
def scripted(tmp_path) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([{"match": None, "text": LONG_ANSWER}]))
    return str(path)


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("api", ["native", "smg"])
async def test_without_max_tokens_the_answer_runs_to_its_end(mock_engine_factory, nursery, scripted, api):
    engine = await mock_engine_factory(api=api, scripted_outputs=scripted)
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--engine-api", api)

    def ask() -> None:
        client = sdk(base)
        chat = client.chat.completions.create(model="trio-direct-mock", messages=[{"role": "user", "content": "Hi"}])
        assert chat.usage is not None
        assert chat.choices[0].finish_reason == "stop" and chat.usage.completion_tokens > 128
        content = chat.choices[0].message.content
        assert content is not None and content.startswith("hello world hello world")
        # The legacy Completions API documents its own default of 16 (OpenAI, vLLM and SGLang alike).
        completion = client.completions.create(model="trio-direct-mock", prompt="Hi")
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 16
        # The SDK's helper raises unless the response completes.
        with client.responses.stream(model="trio-direct-mock", input="Hi") as stream:
            final = stream.get_final_response()
        assert final.usage is not None
        assert final.status == "completed" and final.usage.output_tokens > 128

    await trio.to_thread.run_sync(ask)


async def test_the_operator_caps_requests_without_a_limit(mock_engine_factory, nursery, scripted):
    engine = await mock_engine_factory(scripted_outputs=scripted)
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}", "--default-max-tokens", "40")

    def ask() -> None:
        client = sdk(base)
        capped = client.chat.completions.create(model="trio-direct-mock", messages=[{"role": "user", "content": "Hi"}])
        assert capped.usage is not None
        assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 40
        # A client's own limit still wins over the operator's default.
        own = client.chat.completions.create(
            model="trio-direct-mock", messages=[{"role": "user", "content": "Hi"}], max_tokens=200
        )
        assert own.usage is not None
        assert own.usage.completion_tokens == 200

    await trio.to_thread.run_sync(ask)


async def test_a_limit_near_the_context_is_the_room_left(mock_engine_factory, nursery, scripted):
    engine = await mock_engine_factory(scripted_outputs=scripted, context_length=100)
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body = {"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hi"}]}
        reply = (await client.post("/v1/chat/completions", json=body)).json()
    usage = reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] < 100


async def test_messages_keeps_max_tokens_required(mock_engine_factory, nursery):
    engine = await mock_engine_factory()
    base = await start_frontend(nursery, "--engine-url", f"{engine.host}:{engine.port}")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        body = {"model": "trio-direct-mock", "messages": [{"role": "user", "content": "Hi"}]}
        reply = await client.post("/v1/messages", json=body)
    assert reply.status_code == 400 and "max_tokens" in reply.json()["error"]["message"]
