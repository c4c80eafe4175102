"""Property: no request body makes the server answer 5xx; every rejection is an OpenAI error."""

from __future__ import annotations

import json
import queue
import threading

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from support import start_frontend, start_mock_engine

from trio_direct.engine.transport import open_asyncio_loop

pytestmark = pytest.mark.slow

MODEL = "fuzz-model"
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20)
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "n",
    "stop", "stream", "stream_options", "seed", "logprobs", "top_logprobs", "tools", "tool_choice",
    "response_format", "presence_penalty", "frequency_penalty", "min_tokens", "ignore_eos", "echo", "suffix",
    "chat_template_kwargs", "stop_token_ids", "logit_bias", "regex", "min_p",
]  # fmt: skip
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer", "robot"]), "content": values}
)
plausible = st.fixed_dictionaries(
    {"model": st.just(MODEL), "max_tokens": st.integers(1, 4)},
    optional={
        "messages": st.lists(message, max_size=3),
        "prompt": st.one_of(st.text(max_size=30), st.lists(st.integers(-5, 2000), max_size=6)),
        **{name: values for name in FIELDS if name not in ("model", "messages", "prompt", "max_tokens")},
    },
)
bodies = st.one_of(
    plausible.map(lambda b: json.dumps(b).encode()),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=6).map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=60),
)


@pytest.fixture(scope="module")
def base():
    """A frontend and mock engine running on their own trio loop in a thread, for a sync test."""
    started: queue.Queue = queue.Queue()

    async def serve() -> None:
        async with open_asyncio_loop(), trio.open_nursery() as nursery:
            engine = await start_mock_engine(nursery, "--speedup", "inf", "--incremental-streaming-output")
            url = await start_frontend(nursery, "--engine-url", engine.url, "--served-model-name", MODEL)
            stop = trio.Event()
            started.put((url, trio.lowlevel.current_trio_token(), stop))
            await stop.wait()
            nursery.cancel_scope.cancel()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    url, token, stop = started.get(timeout=60)
    yield url
    trio.from_thread.run_sync(stop.set, trio_token=token)
    thread.join(timeout=30)


@settings(max_examples=200, deadline=None)
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_no_body_gets_a_5xx(base, body, path):
    reply = httpx.post(base + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert reply.status_code < 500, (reply.status_code, body, reply.text[:300])
    if reply.status_code >= 400:
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
