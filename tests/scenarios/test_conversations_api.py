"""The Conversations API and `input_items` through `trio-direct serve` with the official `openai`
SDK, on a SQLite state store; and a state store that is down: 503 for what needs it, nothing else
affected."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio
from openai.types.conversations import Message
from openai.types.responses import ResponseInputMessageItem, ResponseInputText, ResponseOutputText
from state_servers import free_port
from surface_scenarios import start_fleet

pytestmark = pytest.mark.slow


def text_of(item: object) -> str:
    """The text of a conversation item that must be a message whose first part is text."""
    assert isinstance(item, Message)
    part = item.content[0]
    assert isinstance(part, ResponseInputText | ResponseOutputText)
    return part.text


async def test_conversations_and_input_items_with_the_openai_sdk(aio_loop, nursery, tmp_path):
    fleet = await start_fleet(nursery, tmp_path, "aggregated", "--state-store", f"sqlite://{tmp_path}/state.db")

    def use_client() -> None:
        client = openai.OpenAI(base_url=fleet.base + "/v1", api_key="unused", max_retries=0)
        conversation = client.conversations.create(
            items=[{"type": "message", "role": "user", "content": "My name is Ada. Please remember it."}],
            metadata={"topic": "names"},
        )
        assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
        assert client.conversations.retrieve(conversation.id).id == conversation.id
        assert client.conversations.update(conversation.id, metadata={"topic": "ada"}).metadata == {"topic": "ada"}
        added = client.conversations.items.create(
            conversation.id, items=[{"type": "message", "role": "assistant", "content": "I will remember, Ada."}]
        )
        (reply,) = added.data
        assert isinstance(reply, Message) and reply.role == "assistant"

        # a response in the conversation reads its items, and adds its input and output to them
        answer = client.responses.create(model=fleet.model, conversation=conversation.id, input="What is my name?")
        assert answer.output_text == "Your name is Ada."
        items = list(client.conversations.items.list(conversation.id, order="asc"))
        assert [item.type for item in items] == ["message", "message", "message", "message"]
        assert text_of(items[2]) == "What is my name?" and text_of(items[3]) == "Your name is Ada."
        newest = client.conversations.items.list(conversation.id, limit=1)
        assert [item.id for item in newest.data] == [items[3].id] and newest.has_more
        first_id = items[0].id
        assert first_id is not None
        assert client.conversations.items.retrieve(first_id, conversation_id=conversation.id).id == first_id
        client.conversations.items.delete(first_id, conversation_id=conversation.id)
        assert len(list(client.conversations.items.list(conversation.id))) == 3
        with pytest.raises(openai.NotFoundError):
            client.conversations.items.retrieve(first_id, conversation_id=conversation.id)

        # input_items: what a stored response was made from
        told = client.responses.create(model=fleet.model, input="My name is Ada. Please remember it.")
        inputs = client.responses.input_items.list(told.id)
        (sent,) = inputs.data
        assert isinstance(sent, ResponseInputMessageItem) and isinstance(sent.content[0], ResponseInputText)
        assert (sent.type, sent.role, sent.content[0].text) == (
            "message",
            "user",
            "My name is Ada. Please remember it.",
        )
        with pytest.raises(openai.NotFoundError):
            client.responses.input_items.list("resp_unknown")
        with pytest.raises(openai.BadRequestError):
            client.responses.create(
                model=fleet.model, conversation=conversation.id, previous_response_id=told.id, input="x"
            )

        client.conversations.delete(conversation.id)
        with pytest.raises(openai.NotFoundError):
            client.conversations.retrieve(conversation.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model=fleet.model, conversation=conversation.id, input="x")
        client.close()

    await trio.to_thread.run_sync(use_client)


async def test_a_state_store_that_is_down_fails_only_the_requests_that_need_it(aio_loop, nursery, tmp_path):
    nobody = free_port()  # nothing listens there: every store call fails
    fleet = await start_fleet(
        nursery, tmp_path, "aggregated", "--state-store", f"redis://127.0.0.1:{nobody}/0", "--state-store-timeout", "1"
    )

    def use_client() -> None:
        client = openai.OpenAI(base_url=fleet.base + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as raised:
            client.responses.create(model=fleet.model, input="Tell me the riddle answer")
        assert raised.value.status_code == 503
        assert isinstance(raised.value.body, dict) and raised.value.body["type"] == "service_unavailable"
        with pytest.raises(openai.InternalServerError):
            client.responses.retrieve("resp_1")
        with pytest.raises(openai.InternalServerError):
            client.conversations.create()
        # streamed: the stream ends with an error event, not `response.completed`
        events = list(client.responses.create(model=fleet.model, input="Tell me the riddle answer", stream=True))
        assert events[-1].type == "response.failed" and not any(e.type == "response.completed" for e in events)
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[-3].type == "response.output_item.done" and events[-2].type == "error"
        # what needs no store is served as ever
        unstored = client.responses.create(model=fleet.model, input="Tell me the riddle answer", store=False)
        assert unstored.output_text == "A piano."
        chat = client.chat.completions.create(
            model=fleet.model, messages=[{"role": "user", "content": "Tell me the riddle answer"}]
        )
        assert chat.choices[0].message.content == "A piano."
        assert client.completions.create(model=fleet.model, prompt="Count", max_tokens=5).choices[0].text
        client.close()

    await trio.to_thread.run_sync(use_client)
    async with httpx.AsyncClient(base_url=fleet.base, timeout=30) as http:
        scraped = (await http.get("/metrics")).text
    [count] = [
        line.split()[-1]
        for line in scraped.splitlines()
        if line.startswith("trio_direct_state_store_unavailable_total")
    ]
    assert float(count) >= 4  # each request that needed the store
