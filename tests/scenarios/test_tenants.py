"""Tenants as their clients meet them (issue #29): keys from a file, JWTs from a JWKS, models a tenant
may not use, limits answered with OpenAI's 429 and ``x-ratelimit-*`` headers, and a key rotated by
renaming a new file over the old one while a stream opened with the old key runs on.

In-process `trio-direct serve` with its built-in mock engines, the official SDKs as clients.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import trio
from jwks_server import JwksServer, SigningKey
from support import start_frontend, start_mock_engine

MODEL = "tiny"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def tenants_yaml(*tenants: dict) -> str:
    return json.dumps({"tenants": list(tenants)})  # JSON is YAML


def tenant(name: str, *keys: str, models=("*",), **limits) -> dict:
    return {
        "name": name,
        "api_keys_sha256": [sha(key) for key in keys],
        "models": list(models),
        "priority": 0,
        "weight": 1,
        "limits": limits,
    }


def sample(exposition: str, series: str) -> float:
    """The value of one series in a Prometheus exposition (0 when absent)."""
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def write_over(path: Path, text: str) -> None:
    """Replace the file the way editors and ConfigMap updates do: write a new one, rename it over."""
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    os.replace(fresh, path)


_OPEN: list = []


def client(base: str, key: str) -> openai.AsyncOpenAI:
    sdk = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    _OPEN.append(sdk)
    return sdk


class StreamInThread:
    """A stream read by the sync SDK in a worker thread (the async SDK's generators are not closed
    under trio): `opened` is set at its first chunk, `chunks` holds them all once `done` is set."""

    def __init__(self, base: str, key: str, **body) -> None:
        self.base, self.key, self.body = base, key, chat(stream=True, extra_body={"ignore_eos": True}, **body)
        self.opened, self.done = trio.Event(), trio.Event()
        self.chunks: list = []

    async def run(self) -> None:
        token = trio.lowlevel.current_trio_token()

        def read() -> None:
            with openai.OpenAI(base_url=f"{self.base}/v1", api_key=self.key, max_retries=0) as sdk:
                with sdk.chat.completions.create(**self.body) as stream:
                    for chunk in stream:
                        self.chunks.append(chunk)
                        if len(self.chunks) == 1:
                            trio.from_thread.run_sync(self.opened.set, trio_token=token)

        try:
            await trio.to_thread.run_sync(read)
        finally:
            self.opened.set()
            self.done.set()


@pytest.fixture(autouse=True)
async def close_clients():
    yield
    while _OPEN:
        await _OPEN.pop().close()


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, **extra}


async def serve(nursery, tmp_path: Path, text: str, *extra: str, speed: str = "inf") -> tuple[str, Path]:
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    base = await start_frontend(
        nursery, "--mock-speedup", speed, "--served-model-name", MODEL, "--tenants-file", str(path), *extra
    )
    return base, path


async def test_each_key_is_its_tenant_with_its_models_and_limits_and_the_headers_say_where_it_stands(
    aio_loop, nursery, tmp_path
):
    text = tenants_yaml(
        tenant("alpha", "key-alpha", requests_per_minute=3, tokens_per_minute=100_000),
        tenant("beta", "key-beta", models=["other-model"]),
    )
    base, _ = await serve(nursery, tmp_path, text)
    alpha, beta = client(base, "key-alpha"), client(base, "key-beta")
    async with httpx.AsyncClient(base_url=base) as http:
        before = (await http.get("/metrics")).text

    raw = await alpha.chat.completions.with_raw_response.create(**chat())
    assert raw.parse().choices[0].message.content
    headers = raw.headers
    assert headers["x-ratelimit-limit-requests"] == "3" and headers["x-ratelimit-remaining-requests"] == "2"
    assert re.fullmatch(r"(\d+m)?\d+s|\d+ms", headers["x-ratelimit-reset-requests"])
    assert headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(headers["x-ratelimit-remaining-tokens"]) == 100_000  # what the minute had left when it came in
    assert re.fullmatch(r"(\d+m)?\d+s|\d+ms", headers["x-ratelimit-reset-tokens"])
    second = await alpha.chat.completions.with_raw_response.create(**chat())
    assert int(second.headers["x-ratelimit-remaining-tokens"]) < 100_000  # the first one's tokens were counted
    await alpha.completions.create(model=MODEL, prompt="Hi", max_tokens=2)  # the third

    with pytest.raises(openai.RateLimitError) as refused:
        await alpha.chat.completions.create(**chat())
    response = refused.value.response
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["code"] == "rate_limit_exceeded" and refused.value.body["type"] == "rate_limit_error"
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert response.headers["x-ratelimit-remaining-requests"] == "0"

    # beta may use only a model this server does not serve: the one it does is "not found" to it
    with pytest.raises(openai.NotFoundError) as hidden:
        await beta.chat.completions.create(**chat())
    assert isinstance(hidden.value.body, dict)
    assert hidden.value.body["code"] == "model_not_found"
    assert [m.id async for m in beta.models.list()] == []
    with pytest.raises(openai.NotFoundError):
        await beta.models.retrieve(MODEL)
    assert "x-ratelimit-limit-requests" not in (await beta.with_raw_response.models.list()).headers  # no limits

    with pytest.raises(openai.AuthenticationError) as wrong:
        await client(base, "key-gamma").chat.completions.create(**chat())
    assert isinstance(wrong.value.body, dict)
    assert wrong.value.body["code"] == "invalid_api_key"

    # the Messages API answers in Anthropic's envelope, with the same headers
    claude = anthropic.AsyncAnthropic(base_url=base, api_key="key-alpha", max_retries=0)
    _OPEN.append(claude)
    with pytest.raises(anthropic.RateLimitError) as limited:
        await claude.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert isinstance(limited.value.body, dict)
    assert limited.value.body["type"] == "error" and limited.value.body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers["x-ratelimit-limit-requests"] == "3"
    stranger = anthropic.AsyncAnthropic(base_url=base, api_key="nope", max_retries=0)
    _OPEN.append(stranger)
    with pytest.raises(anthropic.AuthenticationError):
        await stranger.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])

    async with httpx.AsyncClient(base_url=base) as http:
        after = (await http.get("/metrics")).text
    # the registry is the process's: other tests' requests may be in it, so count what this one added
    assert (
        sample(after, 'trio_direct_tenant_requests_total{tenant="alpha"}')
        - sample(before, 'trio_direct_tenant_requests_total{tenant="alpha"}')
        == 3
    )
    for name in (
        'trio_direct_tenant_refusals_total{reason="requests_per_minute",tenant="alpha"}',
        'trio_direct_tenant_refusals_total{reason="unauthorized",tenant="other"}',
        'trio_direct_tenant_tokens_total{kind="output",tenant="alpha"}',
    ):
        assert sample(after, name) > sample(before, name), name


async def test_a_stream_past_the_tokens_per_minute_runs_to_its_end_and_the_next_request_is_refused(
    aio_loop, nursery, tmp_path
):
    base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key", tokens_per_minute=40)))
    alpha = client(base, "key")
    stream = StreamInThread(base, "key", max_tokens=80, stream_options={"include_usage": True})
    await stream.run()
    chunks = stream.chunks
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens + usage.completion_tokens > 40  # not cut at the limit
    assert chunks[-2].choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.RateLimitError) as refused:
        await alpha.chat.completions.create(**chat())
    assert "tokens per minute" in refused.value.message
    assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_a_running_streams_tokens_count_against_its_tenant_before_it_ends(aio_loop, nursery, tmp_path):
    """Tokens are charged as a stream goes (every half second), not only at its end: a tenant whose
    stream already spent its tokens per minute gets its next request refused while that stream runs."""
    base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key", tokens_per_minute=60)), speed="1")
    alpha = client(base, "key")
    stream = StreamInThread(base, "key", max_tokens=600)  # ~4 s at the mock's real-time pace
    nursery.start_soon(stream.run)
    await stream.opened.wait()
    with trio.fail_after(30):
        while len(stream.chunks) < 80:  # past the limit by itself
            await trio.sleep(0.05)
    await trio.sleep(0.75)  # past a charge interval (0.5 s)
    assert not stream.done.is_set()
    with pytest.raises(openai.RateLimitError) as refused:
        await alpha.chat.completions.create(**chat())
    assert "tokens per minute" in refused.value.message
    assert not stream.done.is_set(), "refused while the stream that spent the tokens still runs"
    await stream.done.wait()


async def test_concurrent_requests_past_the_limit_are_refused_while_the_others_run(aio_loop, nursery, tmp_path):
    base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key", concurrent_requests=1)), speed="1")
    alpha = client(base, "key")
    stream = StreamInThread(base, "key", max_tokens=300)
    nursery.start_soon(stream.run)
    await stream.opened.wait()
    with pytest.raises(openai.RateLimitError) as refused:
        await alpha.chat.completions.create(**chat())
    assert refused.value.response.headers["retry-after"] == "1"
    assert not stream.done.is_set()
    await stream.done.wait()
    assert stream.chunks[-1].choices[0].finish_reason == "length"
    assert (await alpha.chat.completions.create(**chat())).choices  # its slot is free again


@pytest.mark.slow
async def test_a_key_rotated_by_renaming_a_new_file_over_the_old_one(aio_loop, nursery, tmp_path, caplog):
    base, path = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "old-key")), speed="1")
    old, new = client(base, "old-key"), client(base, "new-key")
    stream = StreamInThread(base, "old-key", max_tokens=1000)  # ~6 s at the mock's real speed
    nursery.start_soon(stream.run)
    await stream.opened.wait()
    write_over(path, "tenants: {")  # half-written: the old tenants stay
    with trio.fail_after(10):
        while "keeping the last good tenants" not in caplog.text:
            await trio.sleep(0.05)
    assert (await old.chat.completions.create(**chat(max_tokens=1))).choices
    write_over(path, tenants_yaml(tenant("alpha", "new-key")))
    with trio.fail_after(10):
        while True:
            try:
                await new.chat.completions.create(**chat(max_tokens=1))
                break
            except openai.AuthenticationError:
                await trio.sleep(0.1)
    with pytest.raises(openai.AuthenticationError):
        await old.chat.completions.create(**chat(max_tokens=1))
    assert not stream.done.is_set()  # rotated while it streamed
    await stream.done.wait()  # the stream opened with the old key finishes
    assert stream.chunks[-1].choices[0].finish_reason == "length"


async def test_api_key_is_one_anonymous_tenant_beside_the_file(aio_loop, nursery, tmp_path):
    base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key-alpha")), "--api-key", "legacy")
    assert (await client(base, "legacy").chat.completions.create(**chat())).choices
    assert (await client(base, "key-alpha").chat.completions.create(**chat())).choices
    with pytest.raises(openai.AuthenticationError):
        await client(base, "neither").chat.completions.create(**chat())


@pytest.fixture
def jwks():
    server = JwksServer()
    yield server
    server.stop()


async def test_jwt_bearer_tokens_from_a_jwks_name_their_tenant(aio_loop, nursery, tmp_path, jwks):
    key = SigningKey("k1", "RSA")
    jwks.keys = [key]
    text = tenants_yaml(tenant("alpha", requests_per_minute=10), tenant("beta", models=["other-model"]))
    base, _ = await serve(
        nursery, tmp_path, text, "--jwt-jwks-url", jwks.url, "--jwt-issuer", "https://issuer.test",
        "--jwt-audience", "trio-direct", "--jwt-tenant-claim", "tenant",
    )  # fmt: skip
    raw = await client(base, key.token(tenant="alpha")).chat.completions.with_raw_response.create(**chat())
    assert raw.headers["x-ratelimit-limit-requests"] == "10"  # the file's tenant, its limits
    with pytest.raises(openai.NotFoundError):
        await client(base, key.token(tenant="beta")).chat.completions.create(**chat())
    for token in (
        key.token(tenant="alpha", lifetime=-60),  # expired
        key.token(tenant="alpha", not_before=300),  # not yet valid
        key.token(tenant="alpha", aud="elsewhere"),  # another audience
        SigningKey("k1").token(tenant="alpha"),  # signed by another key
        SigningKey("k2").token(tenant="alpha"),  # an unknown kid (k2 is not published yet)
        key.token(tenant="gamma"),  # a tenant the file does not know
    ):
        with pytest.raises(openai.AuthenticationError):
            await client(base, token).chat.completions.create(**chat())
    rotated = SigningKey("k2")
    jwks.keys = [key, rotated]  # the provider publishes a new key: its tokens are accepted at once
    assert (await client(base, rotated.token(tenant="alpha")).chat.completions.create(**chat())).choices


async def test_the_tenant_is_in_the_requests_trace(aio_loop, nursery, tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from trio_direct import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    try:
        base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key-alpha")))
        await client(base, "key-alpha").chat.completions.create(**chat())
        with trio.fail_after(10):
            while not any(s.name == "POST /v1/chat/completions" for s in exporter.get_finished_spans()):
                await trio.sleep(0.01)
        (root,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/chat/completions"]
        assert root.attributes is not None and root.attributes["trio_direct.tenant"] == "alpha"
    finally:
        tracing.disable()


async def test_a_malformed_tenants_file_stops_the_start_naming_what_is_wrong(aio_loop, tmp_path):
    from trio_direct.config import parse_serve_args
    from trio_direct.fleet.fleet import FleetError
    from trio_direct.service import serve as serve_frontend

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  - name: alpha\n    api_keys_sha256: [not-a-digest]\n")
    config = parse_serve_args(["--port", "0", "--tenants-file", str(path)], environ={})
    with pytest.raises(FleetError, match=r"--tenants-file: .*tenant 0: alpha: 'api_keys_sha256'"):
        await serve_frontend(config)


async def test_a_stored_response_is_its_tenants_own(aio_loop, nursery, tmp_path):
    base, _ = await serve(nursery, tmp_path, tenants_yaml(tenant("alpha", "key-alpha"), tenant("beta", "key-beta")))
    alpha, beta = client(base, "key-alpha"), client(base, "key-beta")
    stored = await alpha.responses.create(model=MODEL, input="Hello", max_output_tokens=4, store=True)
    assert (await alpha.responses.retrieve(stored.id)).id == stored.id
    with pytest.raises(openai.NotFoundError):
        await beta.responses.retrieve(stored.id)
    with pytest.raises(openai.NotFoundError):
        await beta.responses.create(model=MODEL, input="Go on", max_output_tokens=4, previous_response_id=stored.id)
    with pytest.raises(openai.NotFoundError):
        await beta.responses.delete(stored.id)
    await alpha.responses.delete(stored.id)


async def test_embedding_tokens_count_against_the_tenants_tokens(aio_loop, nursery, tmp_path):
    engine = await start_mock_engine(nursery, "--is-embedding", "--speedup", "inf")
    path = tmp_path / "tenants.yaml"
    path.write_text(tenants_yaml(tenant("alpha", "key", tokens_per_minute=1000)))
    base = await start_frontend(
        nursery, "--engine-url", engine.url, "--served-model-name", MODEL, "--tenants-file", str(path)
    )
    alpha = client(base, "key")
    first = await alpha.embeddings.with_raw_response.create(model=MODEL, input="one two three four five")
    used = first.parse().usage.prompt_tokens
    second = await alpha.embeddings.with_raw_response.create(model=MODEL, input="six")
    assert used > 0 and int(second.headers["x-ratelimit-remaining-tokens"]) == 1000 - used
