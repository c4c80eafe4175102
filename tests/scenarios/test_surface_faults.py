"""An engine killed mid-stream under the Responses and Messages APIs, through `trio-direct serve`:
with a second engine the stream moves there and completes as one response; with migration off the
client gets the API's own failure events (`error` + `response.failed`; Anthropic's `error` event)."""

from __future__ import annotations

from contextlib import aclosing

import pytest
import trio
from support import RawSseClient, engine_accounting
from surface_scenarios import start_fleet

pytestmark = pytest.mark.slow

SURFACES = {
    "responses": (
        "/v1/responses",
        lambda model: {"model": model, "input": "Tell me a long story", "max_output_tokens": 120,
                       "stream": True, "ignore_eos": True},
    ),
    "messages": (
        "/v1/messages",
        lambda model: {"model": model, "max_tokens": 120, "messages": [{"role": "user", "content": "Tell me a long story"}],
                       "stream": True, "ignore_eos": True},
    ),
}  # fmt: skip


async def stream_and_kill(fleet, path: str, body: dict) -> list[dict]:
    """Stream `body`; after a few events, kill -9 the engine serving it; every event until the end."""
    events: list[dict] = []
    killed = False
    async with aclosing(RawSseClient(fleet.base).events(path, body)) as stream:
        async for event in stream:
            events.append(event)
            if len(events) == 6 and not killed:
                for engine in fleet.engines:
                    if (await engine_accounting(engine.url))["live"]:
                        engine.process.kill()
                        killed = True
                        break
    assert killed
    return events


@pytest.mark.parametrize("surface", list(SURFACES))
async def test_a_stream_whose_engine_is_killed_moves_to_the_other_engine(aio_loop, nursery, tmp_path, surface):
    fleet = await start_fleet(nursery, tmp_path, "aggregated", speedup="1")
    path, make_body = SURFACES[surface]
    with trio.fail_after(60):
        events = await stream_and_kill(fleet, path, make_body(fleet.model))
    kinds = [event.get("type") for event in events]
    assert "error" not in kinds and "response.failed" not in kinds
    if surface == "responses":
        done = events[-1]
        # the budget ran out, not the stream: OpenAI's "incomplete" with that reason, as without a kill
        assert kinds[-1] == "response.incomplete" and done["response"]["status"] == "incomplete"
        assert done["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
        assert done["response"]["usage"]["output_tokens"] == 120  # both engines' tokens, as the client saw them
    else:
        assert kinds[-2:] == ["message_delta", "message_stop"]
        assert events[-2]["delta"]["stop_reason"] == "max_tokens" and events[-2]["usage"]["output_tokens"] == 120


@pytest.mark.parametrize("surface", list(SURFACES))
async def test_with_migration_off_a_killed_engine_ends_the_stream_with_the_apis_failure_events(
    aio_loop, nursery, tmp_path, surface
):
    fleet = await start_fleet(nursery, tmp_path, "aggregated", "--migration-limit", "0", speedup="1")
    path, make_body = SURFACES[surface]
    with trio.fail_after(60):
        events = await stream_and_kill(fleet, path, make_body(fleet.model))
    kinds = [event.get("type") for event in events]
    if surface == "responses":
        assert kinds[-2:] == ["error", "response.failed"]
        assert events[-1]["response"]["status"] == "failed" and events[-1]["response"]["error"]["message"]
        numbers = [event["sequence_number"] for event in events]
        assert numbers == list(range(len(events)))  # the failure events continue the sequence
    else:
        assert kinds[-1] == "error" and events[-1]["error"]["type"] in ("api_error", "overloaded_error")
        assert "message_stop" not in kinds
