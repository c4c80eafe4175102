"""OpenAI SDK clients whose HTTP goes to a function, so tests see our bytes exactly as users do."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture
def sdk_client() -> Iterator[Callable[[Handler], openai.OpenAI]]:
    """Factory: a synchronous SDK client answering every call with `handler`, never retrying."""
    clients: list[openai.OpenAI] = []

    def make(handler: Handler) -> openai.OpenAI:
        client = openai.OpenAI(
            api_key="test",
            base_url="http://frontend.test/v1",
            max_retries=0,
            http_client=httpx.Client(transport=httpx.MockTransport(handler)),  # type: ignore[arg-type]  # the SDK takes a legacy httpx.Client too (checked at run time); its types name only httpx2
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def answering(sdk_client) -> Callable[..., openai.OpenAI]:
    """Factory: a client that gets `body` with `status` for every request."""

    def make(status: int, body: bytes, content_type: str = "application/json") -> openai.OpenAI:
        headers = {"content-type": content_type}
        return sdk_client(lambda request: httpx.Response(status, content=body, headers=headers))

    return make


@pytest.fixture
def sent_body(sdk_client) -> Callable[[Callable[[openai.OpenAI], object]], bytes]:
    """Run `call(client)` and return the request body the SDK sent (the call itself is answered 400)."""

    def capture(call: Callable[[openai.OpenAI], object]) -> bytes:
        bodies: list[bytes] = []

        def handler(request: httpx.Request) -> httpx.Response:
            bodies.append(request.read())
            error = {"message": "captured", "type": "invalid_request_error", "param": None, "code": None}
            return httpx.Response(400, json={"error": error})

        with pytest.raises(openai.BadRequestError):
            call(sdk_client(handler))
        (body,) = bodies
        return body

    return capture
