"""The route table: every path the server answers, its method, its handler and the rules that
apply to it, in one place. Adding an API surface adds a row here."""

from __future__ import annotations

from trio_direct.anthropic.errors import anthropic_error_body
from trio_direct.http.routing_table import HttpRoute, RouteTable
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
    HttpRoute("GET", "/live", operations.live, open=True, needs_frontend=False),
    HttpRoute("GET", "/health", operations.health, open=True, needs_frontend=False),
    HttpRoute("GET", "/metrics", operations.metrics, open=True, needs_frontend=False),
    HttpRoute("GET", "/v1/models", models.list_models),
    HttpRoute("GET", "/v1/models/{model:path}", models.retrieve_model),
    HttpRoute("POST", "/v1/chat/completions", chat.handle, endpoint="chat"),
    HttpRoute("POST", "/v1/completions", completions.handle, endpoint="completions"),
    HttpRoute("POST", "/v1/embeddings", embeddings.handle, endpoint="embeddings"),
    HttpRoute("POST", "/generate", generate.handle, endpoint="generate"),
    HttpRoute("PUT", "/generate", generate.handle, endpoint="generate"),  # SGLang's server takes both
    HttpRoute("POST", "/v1/tokenize", tokenization.tokenize),
    HttpRoute("POST", "/tokenize", tokenization.tokenize),
    HttpRoute("POST", "/v1/detokenize", tokenization.detokenize),
    HttpRoute("POST", "/detokenize", tokenization.detokenize),
    HttpRoute("POST", "/v1/responses", responses.create, endpoint="responses"),
    HttpRoute("GET", "/v1/responses/{response_id}", responses.retrieve),
    HttpRoute("DELETE", "/v1/responses/{response_id}", responses.delete),
    HttpRoute("POST", "/v1/messages", messages.handle, endpoint="messages",
          error_body=anthropic_error_body, api_key_headers=_X_API_KEY),
    HttpRoute("POST", "/v1/messages/count_tokens", messages.count_tokens,
          error_body=anthropic_error_body, api_key_headers=_X_API_KEY),
    HttpRoute("GET", "/debug/routing", operations.routing_state),
    HttpRoute("POST", "/debug/routing", operations.routing_for_prompt),
    HttpRoute("GET", "/admin/engines", admin.list_engines, admin=True),
    HttpRoute("POST", "/admin/engines", admin.add_engine, admin=True),
    HttpRoute("DELETE", "/admin/engines/{id}", admin.remove_engine, admin=True),
    # SGLang's and vLLM's own routes that their users' tools call.
    HttpRoute("GET", "/version", server_info.version, open=True, needs_frontend=False),
    HttpRoute("GET", "/get_model_info", server_info.get_model_info),
    HttpRoute("GET", "/get_server_info", server_info.get_server_info),
    HttpRoute("GET", "/health_generate", server_info.health_generate, open=True, needs_frontend=False),
    HttpRoute("POST", "/flush_cache", server_info.flush_cache, admin=True),
    HttpRoute("GET", "/v1/responses/{response_id}/input_items", responses.input_items),
    HttpRoute("POST", "/v1/conversations", conversations.create),
    HttpRoute("GET", "/v1/conversations/{conversation_id}", conversations.retrieve),
    HttpRoute("POST", "/v1/conversations/{conversation_id}", conversations.update),
    HttpRoute("DELETE", "/v1/conversations/{conversation_id}", conversations.delete),
    HttpRoute("POST", "/v1/conversations/{conversation_id}/items", conversations.add_items),
    HttpRoute("GET", "/v1/conversations/{conversation_id}/items", conversations.list_items),
    HttpRoute("GET", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.retrieve_item),
    HttpRoute("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}", conversations.delete_item),
])  # fmt: skip
