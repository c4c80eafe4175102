"""Routes and their lookup: a method and a path to a handler and the rules that apply to it (sans-IO).

A path is literal (`/v1/models`) or has parameters: ``{name}`` matches one path segment,
``{name:path}`` the rest of the path (model ids such as ``Qwen/Qwen3-8B`` contain slashes).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trio_direct.core.errors import ApiError
from trio_direct.openai.errors import openai_error_body

if TYPE_CHECKING:
    from trio_direct.http.exchange import Exchange

__all__ = ["ErrorFormat", "Handler", "Match", "HttpRoute", "RouteTable"]

Handler = Callable[["Exchange"], Awaitable[None]]
#: How a route writes an error body (OpenAI's envelope unless the route's API has its own).
ErrorFormat = Callable[[ApiError], bytes]


@dataclass(frozen=True, slots=True)
class HttpRoute:
    """One row of the route table."""

    method: str
    path: str
    handler: Handler
    #: Served without an API key: probes and scrapers must work whatever the clients' credentials.
    open: bool = False
    #: Answered 503 until the frontend is up (engines probed, tokenizer loaded).
    needs_frontend: bool = True
    #: Generation endpoints (the metrics' `endpoint` label) count against the concurrency limit.
    endpoint: str | None = None
    #: The error envelope of this route's API.
    error_body: ErrorFormat = openai_error_body
    #: Request headers that may carry the API key besides `Authorization: Bearer`.
    api_key_headers: tuple[bytes, ...] = ()
    #: The admin API: `--admin-api-key` (not `--api-key`) is required, and without one the route
    #: does not exist (404).
    admin: bool = False


@dataclass(frozen=True, slots=True)
class Match:
    route: HttpRoute | None
    params: dict[str, str]
    #: Methods the path allows, when it exists but not for the method asked (405).
    allowed: tuple[str, ...] = ()


_PARAM = re.compile(r"\{(?P<name>\w+)(?::(?P<kind>path))?\}")


class RouteTable:
    """Every route of the server, listed once; `match` finds the route of a request."""

    def __init__(self, routes: Iterable[HttpRoute]) -> None:
        self.routes = list(routes)
        self._literal: dict[str, dict[str, HttpRoute]] = {}
        self._patterns: list[tuple[re.Pattern[str], dict[str, HttpRoute]]] = []
        patterns: dict[str, dict[str, HttpRoute]] = {}
        for route in self.routes:
            if _PARAM.search(route.path) is None:
                methods = self._literal.setdefault(route.path, {})
            else:
                methods = patterns.setdefault(route.path, {})
            if route.method in methods:
                raise ValueError(f"route {route.method} {route.path} is listed twice")
            methods[route.method] = route
        for path, methods in patterns.items():
            self._patterns.append((_compile(path), methods))

    def match(self, method: str, path: str) -> Match:
        methods = self._literal.get(path)
        params: dict[str, str] = {}
        if methods is None:
            for pattern, candidates in self._patterns:
                found = pattern.fullmatch(path)
                if found is not None:
                    methods, params = candidates, found.groupdict()
                    break
            else:
                return Match(None, {})
        route = methods.get(method) or (methods.get("GET") if method == "HEAD" else None)
        if route is None:
            return Match(None, params, tuple(sorted(methods)))
        return Match(route, params)

    def methods(self, path: str) -> tuple[str, ...]:
        """The methods `path` is served with (for CORS preflight answers); () if it is unknown."""
        match = self.match("", path)
        return match.allowed


def _compile(path: str) -> re.Pattern[str]:
    out, position = [], 0
    for found in _PARAM.finditer(path):
        out.append(re.escape(path[position : found.start()]))
        segment = ".+" if found.group("kind") == "path" else "[^/]+"
        out.append(f"(?P<{found.group('name')}>{segment})")
        position = found.end()
    out.append(re.escape(path[position:]))
    return re.compile("".join(out))
