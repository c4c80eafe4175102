"""The route table: every path the server answers, its method, its handler and the rules that
apply to it, in one place. Adding an API surface adds a row here."""

from __future__ import annotations

from trio_direct.http.routing_table import Route, RouteTable
from trio_direct.surfaces import admin, chat, completions, models, operations

__all__ = ["ROUTES"]

ROUTES = RouteTable([
    Route("GET", "/live", operations.live, open=True, needs_frontend=False),
    Route("GET", "/health", operations.health, open=True, needs_frontend=False),
    Route("GET", "/metrics", operations.metrics, open=True, needs_frontend=False),
    Route("GET", "/v1/models", models.list_models),
    Route("GET", "/v1/models/{model:path}", models.retrieve_model),
    Route("POST", "/v1/chat/completions", chat.handle, endpoint="chat"),
    Route("POST", "/v1/completions", completions.handle, endpoint="completions"),
    Route("GET", "/debug/routing", operations.routing_state),
    Route("POST", "/debug/routing", operations.routing_for_prompt),
    Route("GET", "/admin/engines", admin.list_engines, admin=True),
    Route("POST", "/admin/engines", admin.add_engine, admin=True),
    Route("DELETE", "/admin/engines/{id}", admin.remove_engine, admin=True),
])  # fmt: skip
