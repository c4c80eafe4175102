"""CONTRIBUTING.md's five recipes, followed step by step with a toy, so they stay true.

Each test registers its toy the way the recipe says (in a copy of the registry, restored after)
and serves through it: a route answered by the HTTP app, a routing decision, a parsed tool call,
a probed engine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from trio_direct.config import ServeConfig, parse_serve_args
from trio_direct.core import errors
from trio_direct.fleet import engine_apis
from trio_direct.fleet.card import native_card
from trio_direct.fleet.probe import probe_engine
from trio_direct.http.app import create_app
from trio_direct.http.routing_table import HttpRoute, RouteTable
from trio_direct.openai.bodies import decode_body
from trio_direct.options import option
from trio_direct.parsers.tools import assemble
from trio_direct.parsers.tools.json_calls import HermesParser
from trio_direct.parsers.tools.registry import TOOL_CALL_FORMATS
from trio_direct.parsers.tools.stream import ToolCallParser
from trio_direct.routing import policies
from trio_direct.routing.block_hash import RoutingKey
from trio_direct.routing.policy import Candidates, RoutingPolicy
from trio_direct.surfaces.routes import ROUTES

CONTRIBUTING = (Path(__file__).parent.parent / "CONTRIBUTING.md").read_text()


def test_contributing_has_the_five_recipes():
    for title in (
        "Add an API surface",
        "Add a routing policy",
        "Add a parser",
        "Add an engine API",
        "Add a command-line flag or command",
    ):
        assert f"## {title}" in CONTRIBUTING


# ---- an API surface ------------------------------------------------------------------------------


class _EchoRequest(msgspec.Struct):
    text: str


async def _echo(exchange: Any) -> None:
    request = decode_body(exchange.body, _EchoRequest)
    if not request.text:
        raise errors.invalid_request("text must not be empty", param="text")
    await exchange.json(200, json.dumps({"echo": request.text}).encode())


async def _call(app: Any, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    sent: list[dict] = []
    requested = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        return requested.pop() if requested else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [(b"content-type", b"application/json")]}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_a_new_surface_is_one_handler_and_one_row_of_the_route_table():
    table = RouteTable([*ROUTES.routes, HttpRoute("POST", "/v1/echo", _echo, needs_frontend=False)])
    app = create_app(lambda: None, ServeConfig(), routes=table)
    status, body = await _call(app, "POST", "/v1/echo", b'{"text": "hi"}')
    assert (status, json.loads(body)) == (200, {"echo": "hi"})
    status, body = await _call(app, "POST", "/v1/echo", b'{"text": ""}')
    assert status == 400 and json.loads(body)["error"]["param"] == "text"  # OpenAI's envelope by default


# ---- a routing policy ----------------------------------------------------------------------------


class _LastWorker:
    """The toy policy: always the last healthy worker."""

    def choose(self, workers):
        return workers[-1]


def test_a_new_routing_policy_is_one_registration(monkeypatch):
    monkeypatch.setattr(policies, "_REGISTRY", dict(policies._REGISTRY))
    policies.register(policies.RoutingPolicyKind("last-worker", simple=_LastWorker))
    assert parse_serve_args(["--router-mode", "last-worker"], environ={}).router_mode == "last-worker"
    candidates = Candidates(aggregated=["e0", "e1", "e2"], prefill=[], decode=[], key=RoutingKey)
    assert RoutingPolicy("last-worker").choose(candidates).decode == "e2"


# ---- a parser ------------------------------------------------------------------------------------


class _AngleCalls(HermesParser):
    """The toy format: Hermes' JSON object between `<call>` and `</call>`."""

    format = "toy_angle"
    MARKERS = ("<call>",)
    _END = "</call>"


def test_a_new_tool_call_parser_is_a_subclass_with_a_format_and_markers():
    parser = _AngleCalls(None)
    text = 'Sure. <call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
    deltas = [parser.feed(text[i : i + 7]) for i in range(0, len(text), 7)] + [parser.finish()]
    content, calls = assemble(deltas)
    assert content == "Sure."
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_every_tool_call_parser_in_the_package_is_registered():
    """Step 2 of the recipe: a format class that is not listed in the registry cannot be selected."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    shipped = {
        cls
        for cls in subclasses(ToolCallParser)
        if cls.__module__.startswith("trio_direct.parsers.tools") and "format" in vars(cls)
    }
    assert shipped - set(TOOL_CALL_FORMATS.values()) == set()


# ---- an engine API -------------------------------------------------------------------------------


class _ToyClient:
    """The toy engine API's client: answers the probe's two calls from fixed payloads."""

    api = "toy"

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.name = channel.name
        self.last_output_at = float("-inf")

    async def model_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        return {"model_path": "toy/model", "is_generation": True}

    async def server_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        return {"dp_size": 1, "page_size": 16, "disaggregation_mode": "null"}


class _Channels:
    def get(self, host: str, port: int) -> Any:
        return SimpleNamespace(name=f"{host}:{port}")


async def test_a_new_engine_api_is_one_registration(monkeypatch):
    monkeypatch.setattr(engine_apis, "_REGISTRY", dict(engine_apis._REGISTRY))
    engine_apis.register(
        engine_apis.EngineApi(
            name=_ToyClient.api,
            probe_client=_ToyClient,
            read_card=lambda url, host, port, model, server: replace(
                native_card(url, host, port, model, server), api="toy"
            ),
            serving_client=lambda _channel, _card, _info, probe: probe,
            handoff="bootstrap",
            kv_feed="zmq",
        )
    )
    assert parse_serve_args(["--engine-api", "toy"], environ={}).engine_api == "toy"
    probed = await probe_engine("grpc://127.0.0.1:1", _Channels(), api="toy")  # type: ignore[arg-type]
    assert isinstance(probed.client, _ToyClient) and probed.card.model_path == "toy/model"
    assert probed.card.api == "toy"
    assert engine_apis.engine_api_names()[-1] == "toy"  # `auto` tries it last


def test_an_engine_api_name_is_taken_once():
    with pytest.raises(ValueError, match="already taken"):
        engine_apis.register(engine_apis.engine_api("native"))


# ---- a command-line flag or command ---------------------------------------------------------------


@dataclass(slots=True)
class _ServeWithAToyFlag(ServeConfig):
    """Step 1 on `serve`: one more field at the end of `ServeConfig` (here in a subclass)."""

    toy_level: int = option(3, help="how toy the toy is")


def test_recipe_a_flag_is_one_field(capsys):
    from trio_direct.config import ENV_PREFIX
    from trio_direct.options import OneLineErrorParser, add_options, parse_options

    config = parse_options(_ServeWithAToyFlag, ["--toy-level", "5"], prog="serve", env_prefix=ENV_PREFIX, environ={})
    assert config.toy_level == 5 and config.port == ServeConfig().port
    from_env = parse_options(
        _ServeWithAToyFlag, [], prog="serve", env_prefix=ENV_PREFIX, environ={"TRIO_DIRECT_TOY_LEVEL": "7"}
    )
    assert from_env.toy_level == 7
    parser = OneLineErrorParser(prog="serve")
    add_options(parser, _ServeWithAToyFlag, env_prefix=ENV_PREFIX, environ={})
    help_text = " ".join(parser.format_help().split())
    assert "--toy-level TOY_LEVEL how toy the toy is [TRIO_DIRECT_TOY_LEVEL; default 3]" in help_text


@dataclass(slots=True)
class _GreetOptions:
    """Step 2: a command's options."""

    greeting: str = option("hello", help="what to say (default %(default)s)")
    times: int = option(1, parse=int, help="how often")
    loud: bool = option(False, help="in capitals")


def test_recipe_a_command_is_a_dataclass_and_one_row(monkeypatch, capsys):
    from trio_direct import cli

    said: list[_GreetOptions] = []

    def run(options: _GreetOptions, _internal: None) -> int:
        if options.times < 1:  # step 3: settings the parser cannot check
            print("trio-direct greet: error: --times must be at least 1", file=sys.stderr)
            return 2
        said.append(options)
        return 0

    greet = cli.Command("greet", summary="say hello", description="Say hello.", options=lambda: _GreetOptions, run=run)
    monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "greet": greet})

    assert cli.main(["greet", "--greeting", "hi", "--loud"]) == 0
    assert said == [_GreetOptions(greeting="hi", times=1, loud=True)]
    with pytest.raises(SystemExit):
        cli.main(["greet", "--help"])
    assert "--greeting GREETING" in capsys.readouterr().out
    for argv in (["greet", "--times", "many"], ["greet", "--times", "0"]):
        status: object
        try:
            status = cli.main(argv)
        except SystemExit as exit:
            status = exit.code
        assert status == 2
        assert len(capsys.readouterr().err.splitlines()) == 1
