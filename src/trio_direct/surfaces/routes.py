"""The route table: every path the server answers, its method, its handler and the rules that
apply to it, in one place. Adding an API surface adds a row here."""

from __future__ import annotations

from trio_direct.anthropic.errors import anthropic_error_body
from trio_direct.http.routing_table import Route, RouteTable
from trio_direct.surfaces import (
    admin,
    chat,
    completions,
    conversations,
    embeddings,
    generate,
    messages,
    models,
    operations,
    responses,
    server_info,
    tokenization,
)

__all__ = ["ROUTES"]

#: The Messages API's key header (Anthropic's SDK sends `x-api-key`); its errors use Anthropic's envelope.
_X_API_KEY = (b"x-api-key",)

ROUTES = RouteTable([
    Route("GET", "/live", operations.live, open=True, needs_frontend=False),
    Route("GET", "/health", operations.health, open=True, needs_frontend=False),
    Route("GET", "/metrics", operations.metrics, open=True, needs_frontend=False),
    Route("GET", "/v1/models", models.list_models),
    Route("GET", "/v1/models/{model:path}", models.retrieve_model),
    Route("POST", "/v1/chat/completions", chat.handle, endpoint="chat"),
    Route("POST", "/v1/completions", completions.handle, endpoint="completions"),
    Route("POST", "/v1/embeddings", embeddings.handle, endpoint="embeddings"),
    Route("POST", "/generate", generate.handle, endpoint="generate"),
    Route("PUT", "/generate", generate.handle, endpoint="generate"),  # SGLang's server takes both
    Route("POST", "/v1/tokenize", tokenization.tokenize),
    Route("POST", "/tokenize", tokenization.tokenize),
    Route("POST", "/v1/detokenize", tokenization.detokenize),
    Route("POST", "/detokenize", tokenization.detokenize),
    Route("POST", "/v1/responses", responses.create, endpoint="responses"),
    Route("GET", "/v1/responses/{response_id}", responses.retrieve),
    Route("DELETE", "/v1/responses/{response_id}", responses.delete),
    Route("POST", "/v1/messages", messages.handle, endpoint="messages",
          error_body=anthropic_error_body, api_key_headers=_X_API_KEY),
    Route("POST", "/v1/messages/count_tokens", messages.count_tokens,
          error_body=anthropic_error_body, api_key_headers=_X_API_KEY),
    Route("GET", "/debug/routing", operations.routing_state),
    Route("POST", "/debug/routing", operations.routing_for_prompt),
    Route("GET", "/admin/engines", admin.list_engines, admin=True),
    Route("POST", "/admin/engines", admin.add_engine, admin=True),
    Route("DELETE", "/admin/engines/{id}", admin.remove_engine, admin=True),
    # SGLang's and vLLM's own routes that their users' tools call.
    Route("GET", "/version", server_info.version, open=True, needs_frontend=False),
    Route("GET", "/get_model_info", server_info.get_model_info),
    Route("GET", "/get_server_info", server_info.get_server_info),
    Route("GET", "/health_generate", server_info.health_generate, open=True, needs_frontend=False),
    Route("POST", "/flush_cache", server_info.flush_cache, admin=True),
    Route("GET", "/v1/responses/{response_id}/input_items", responses.input_items),
    Route("POST", "/v1/conversations", conversations.create),
    Route("GET", "/v1/conversations/{conversation_id}", conversations.retrieve),
    Route("POST", "/v1/conversations/{conversation_id}", conversations.update),
    Route("DELETE", "/v1/conversations/{conversation_id}", conversations.delete),
    Route("POST", "/v1/conversations/{conversation_id}/items", conversations.add_items),
    Route("GET", "/v1/conversations/{conversation_id}/items", conversations.list_items),
    Route("GET", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.retrieve_item),
    Route("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.delete_item),
])  # fmt: skip
