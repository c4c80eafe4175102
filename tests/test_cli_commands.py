"""Every `trio-direct` subcommand is declared one way: a dataclass of `option()` fields.

- Each registered command's parser holds exactly its dataclass's options (and nothing written by
  hand), and parsing no flags gives the dataclass's own defaults.
- The flags, defaults, choices and metavars are those of the hand-written parsers they replaced:
  tests/data/cli_flags_v0.json was read from them (choices that come from a registry are compared
  with the registry), and ``--help`` lists the same flags.
- A bad value is one line on stderr and exit status 2, for every command.
- Only `serve` reads the environment (``TRIO_DIRECT_*``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from trio_direct.cli import COMMANDS, build_parser, main
from trio_direct.fleet.engine_apis import engine_api_choices
from trio_direct.options import declared_options, option, options_from_args
from trio_direct.routing.policies import routing_policy_names

BEFORE = json.loads((Path(__file__).parent / "data" / "cli_flags_v0.json").read_text())
REGISTRIES = {"registry:engine_api_choices": engine_api_choices, "registry:routing_policy_names": routing_policy_names}
#: What a command needs on its command line to parse at all (probe's engines are positional).
REQUIRED = {"probe": ["127.0.0.1:1"]}


@pytest.fixture(autouse=True)
def _no_serve_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("TRIO_DIRECT_"):
            monkeypatch.delenv(name)


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    [subcommands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return subcommands.choices[name]


def _rows(parser: argparse.ArgumentParser) -> dict[str, dict]:
    """Each argument as the v0 snapshot recorded it."""
    rows = {}
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        rows[" ".join(action.option_strings) or action.dest] = {
            "dest": action.dest,
            "default": repr(action.default),
            "choices": list(action.choices) if action.choices else None,
            "nargs": action.nargs,
            "metavar": action.metavar,
            "action": type(action).__name__,
            "hidden": action.help == argparse.SUPPRESS,
        }
    return rows


def test_every_command_is_registered():
    assert list(COMMANDS) == ["serve", "probe", "bench", "mock-engine"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_commands_parser_is_its_dataclass(name):
    command = COMMANDS[name]
    options = command.options()
    internal = command.internal_flags() if command.internal_flags is not None else None
    declared = [d.name for cls in (options, internal) if cls is not None for d in declared_options(cls)]
    dests = [row["dest"] for row in _rows(_subparser(name)).values()]
    assert dests == declared  # every argument comes from a field, in field order, and nothing else

    args = _subparser(name).parse_args(REQUIRED.get(name, []))
    built: object = options_from_args(options, args)
    expected = options(**({"urls": REQUIRED[name]} if name in REQUIRED else {}))
    assert built == expected  # no flags: the dataclass's own defaults


@pytest.mark.parametrize("name", list(COMMANDS))
def test_flags_defaults_and_choices_are_those_of_v0(name):
    now = _rows(_subparser(name))
    for flags, row in BEFORE[name].items():
        assert flags in now, f"{name} lost {flags}"
        expected = dict(row)
        if isinstance(expected["choices"], str):
            expected["choices"] = list(REGISTRIES[expected["choices"]]())
        assert now[flags] == expected, flags
    if name != "serve":  # serve gains flags (appended to ServeConfig); the others are as they were
        assert set(now) == set(BEFORE[name])


@pytest.mark.parametrize("name", ["mock-engine", "bench", "probe"])
def test_help_lists_the_same_flags_as_v0(name, capsys):
    with pytest.raises(SystemExit) as exit:
        main([name, "--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    usage = text.split("\n\n", 1)[0]
    listed = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", usage)) - {"--help"}
    before = {flag for flags in BEFORE[name] for flag in flags.split() if flag.startswith("--")}
    assert listed == before
    described = {flag for line in re.findall(r"^  (--\S.*?)(?:  |$)", text, re.MULTILINE) for flag in line.split(", ")}
    assert {flag.split()[0] for flag in described} - {"--help"} == before


BAD_VALUES = [
    ["serve", "--port", "eighty"],
    ["serve", "--router-mode", "nope"],
    ["serve", "--engine-api", "nope"],
    ["serve", "--workers", "0"],
    ["probe", "--timeout", "soon", "127.0.0.1:1"],
    ["probe", "--engine-api", "nope", "127.0.0.1:1"],
    ["mock-engine", "--dp-size", "two"],
    ["mock-engine", "--api", "grpc"],
    ["mock-engine", "--dp-size", "0"],
    ["bench", "--concurrency", "0"],
    ["bench", "--trace", "t.jsonl", "--synthetic"],
    ["bench", "--start", "-1"],
]


@pytest.mark.parametrize("argv", BAD_VALUES, ids=" ".join)
def test_a_bad_value_is_one_line_on_stderr_and_exit_status_2(argv, capsys):
    status: object
    try:
        status = main(argv)
    except SystemExit as exit:
        status = exit.code
    assert status == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"trio-direct {argv[0]}: error: "), captured.err
    assert captured.out == ""


def test_an_unknown_choice_lists_the_registered_ones(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--router-mode", "nope"])
    err = capsys.readouterr().err
    assert all(mode in err for mode in routing_policy_names())


def test_a_bad_value_from_a_real_process_is_one_line_and_status_2():
    result = subprocess.run(
        [sys.executable, "-m", "trio_direct", "bench", "--mock-speedup", "0"], capture_output=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        "trio-direct bench: error: argument --mock-speedup: must be > 0 (see trio-direct bench --help)"
    ]


def test_only_serve_reads_the_environment(monkeypatch):
    monkeypatch.setenv("TRIO_DIRECT_PORT", "9100")
    monkeypatch.setenv("TRIO_DIRECT_TIMEOUT", "1")
    assert _subparser("serve").parse_args([]).port == 9100
    assert _subparser("mock-engine").parse_args([]).port == 0
    assert _subparser("probe").parse_args(["h:1"]).timeout == 10.0
    assert _subparser("bench").parse_args([]).timeout == 600.0


def test_a_field_declared_without_option_is_refused():
    @dataclass
    class Loose:
        declared: int = option(1, help="a flag")
        forgotten: int = 2

    with pytest.raises(TypeError, match=r"Loose\.forgotten is declared without option\(\)"):
        list(declared_options(Loose))


def test_the_mock_engine_command_runs_with_the_mock_engines_own_config():
    from trio_direct.mock.server import MockEngineConfig

    assert COMMANDS["mock-engine"].options() is MockEngineConfig
    # launch_command is set by the program, not a flag; every other field is one.
    flags = {d.name for d in declared_options(MockEngineConfig)}
    assert {f.name for f in fields(MockEngineConfig)} - flags == {"launch_command"}
