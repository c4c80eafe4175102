"""The routing flags as a user gives them: on the command line, in the environment, by default."""

from __future__ import annotations

import pytest

from trio_direct.config import ServeConfig, parse_serve_args, routing_settings
from trio_direct.core.request_context import MAX_SESSION_KEY, session_key
from trio_direct.routing.load_aware import PRESETS, cost_settings


def test_defaults_are_the_ttft_preset_with_load_polling_and_sessions_on():
    config = parse_serve_args([], environ={})
    assert config.router_preset == "ttft" and cost_settings(routing_settings(config)) == PRESETS["ttft"]
    assert config.router_prefill_load_scale is None  # "not given": the preset decides
    assert config.load_poll_interval == 1.0
    assert config.router_session_ttl == 300.0 and not config.router_affinity_from_user


def test_a_preset_and_an_explicit_weight_combine():
    config = parse_serve_args(["--router-preset", "dynamo", "--router-temperature", "0.2"], environ={})
    cost = cost_settings(routing_settings(config))
    assert (cost.prefill_load_scale, cost.temperature) == (1.0, 0.2)
    from_env = parse_serve_args([], environ={"TRIO_DIRECT_ROUTER_PREFILL_LOAD_SCALE": "4"})
    assert cost_settings(routing_settings(from_env)).prefill_load_scale == 4.0


@pytest.mark.parametrize("mode", ["least-load", "power-of-two", "kv", "round-robin", "random"])
def test_every_router_mode_is_accepted(mode):
    assert parse_serve_args(["--router-mode", mode], environ={}).router_mode == mode


def test_unknown_presets_and_modes_are_refused(capsys):
    for argv in (["--router-preset", "fast"], ["--router-mode", "least_load"]):
        with pytest.raises(SystemExit):
            parse_serve_args(argv, environ={})
    assert "invalid choice" in capsys.readouterr().err


def test_session_affinity_flags():
    config = parse_serve_args(["--router-session-ttl", "0", "--router-affinity-from-user"], environ={})
    assert config == ServeConfig(router_session_ttl=0.0, router_affinity_from_user=True)


def test_the_session_key_is_the_header_else_the_user_field_when_asked():
    assert session_key("chat-7", "alice") == "chat-7"
    assert session_key(None, "alice") is None
    assert session_key(None, "alice", from_user=True) == "alice"
    assert session_key("  ", "alice", from_user=True) == "alice"
    assert session_key(None, {"not": "a string"}, from_user=True) is None
    capped = session_key("x" * 10_000)
    assert capped is not None and len(capped) == MAX_SESSION_KEY
