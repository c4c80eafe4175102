"""Extension points are registries: unknown names fail at start-up listing the known ones, and the
command line's choices come from the registries (engine APIs, routing policies)."""

from __future__ import annotations

import pytest

from trio_direct.cli import main
from trio_direct.fleet.engine_apis import UnknownEngineApi, engine_api, engine_api_choices, engine_api_names
from trio_direct.routing.policies import UnknownRoutingPolicy, routing_policy, routing_policy_names
from trio_direct.routing.policy import RoutingPolicy


@pytest.mark.parametrize(
    ("flag", "known"),
    [("--router-mode", routing_policy_names()), ("--engine-api", engine_api_choices())],
)
def test_serve_with_an_unknown_name_exits_2_listing_the_choices(flag, known, capsys, monkeypatch):
    monkeypatch.delenv("TRIO_DIRECT_ROUTER_MODE", raising=False)
    monkeypatch.delenv("TRIO_DIRECT_ENGINE_API", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main(["serve", flag, "nope"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "nope" in err
    assert all(name in err for name in known)


def test_an_unknown_router_mode_from_the_environment_fails_at_start_up(capsys, monkeypatch):
    monkeypatch.setenv("TRIO_DIRECT_ROUTER_MODE", "kv-ish")
    with pytest.raises(SystemExit) as exit_:
        main(["serve"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "TRIO_DIRECT_ROUTER_MODE" in err and all(name in err for name in routing_policy_names())


def test_the_registries_hold_the_built_in_names_in_probe_order():
    assert engine_api_names() == ("native", "smg", "vllm")
    assert engine_api_choices() == ("auto", "native", "smg", "vllm")
    assert routing_policy_names() == ("round-robin", "random", "kv", "least-load", "power-of-two")
    assert engine_api("smg").room_bits < engine_api("native").room_bits
    assert engine_api("vllm").handoff == "connector" and engine_api("vllm").kv_feed == "grpc"


def test_unknown_names_raise_listing_the_known_ones_rather_than_falling_back():
    with pytest.raises(UnknownEngineApi, match="native, smg, vllm"):
        engine_api("grpc")
    with pytest.raises(UnknownRoutingPolicy, match="round-robin, random, kv"):
        routing_policy("roundrobin")
    with pytest.raises(UnknownRoutingPolicy):
        RoutingPolicy("cache-aware")  # was served as round-robin, silently
