"""Command-line options declared once, as the fields of a typed dataclass.

Every `trio-direct` subcommand takes its options from one dataclass whose fields are declared with
`option(...)`: the field's name is the flag (``max_tokens`` -> ``--max-tokens``), its annotation the
type the value is parsed to, its default the flag's default, and the `Option` beside it the help,
the choices (a tuple, a registry's function, or the annotation's ``Literal``), a metavar, other
spellings and a help group. From that one declaration `add_options` adds the argparse arguments
(and so the ``--help`` text), reads the environment defaults of a command that has them, and
`options_from_args` builds the dataclass back from what was parsed. A field the program sets
itself, never the command line, is declared with `internal(...)`; a field declared neither way is
an error, so nothing a command takes can be added past the declaration.

The rules each kind of field follows:

- ``bool``: a flag without a value; ``--no-NAME`` exists too where the default is on or the
  command reads the environment (so the environment's "on" can be turned off).
- ``list[T]``: a repeatable flag (``--x a --x b``); positional, one or more values. From the
  environment: a comma- or space-separated list.
- ``T | None``: the default None means "not given"; a given value is parsed as ``T``.
- ``Literal[...]``: the literals are the choices (unless the `Option` names others).
- ``float``: NaN is refused (``inf`` is accepted: "as fast as possible" for the mocks' speedups).

With an environment prefix (``serve``'s ``TRIO_DIRECT_``), each option's default is read from
``PREFIX + NAME`` (``TRIO_DIRECT_MAX_TOKENS``): the flag wins over the environment, the environment
over the default, and the help names the variable. A value there outside the choices, or one that
does not parse, stops the command with the variable's name.

This module is plain standard library and sits at the bottom of the package ladder, so every
layer (the mock engine's own `MockEngineConfig` included) can declare its options without
importing the command line.
"""

from __future__ import annotations

import argparse
import math
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal, NoReturn, TypeVar

__all__ = [
    "DeclaredOption",
    "OneLineErrorParser",
    "Option",
    "add_options",
    "declared_options",
    "flag_name",
    "internal",
    "option",
    "options_from_args",
    "parse_finite_float",
    "parse_options",
]

#: The `dataclasses.field` metadata key an `Option` is stored under.
_METADATA_KEY = "trio_direct.option"

#: The choices of an option: fixed, or read from a registry when the parser is built (so a name
#: registered before start-up is a choice too).
Choices = Sequence[str] | Callable[[], Sequence[str]]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option:
    """How one dataclass field appears on the command line (see the module docstring)."""

    help: str
    choices: Choices | None = None
    metavar: str | None = None
    #: Other spellings of the flag (e.g. Dynamo's ``--http-port`` for ``--port``).
    aliases: tuple[str, ...] = ()
    #: The title of the ``--help`` section the flag is listed under (None: the parser's own).
    group: str | None = None
    #: At most one of the group's exclusive options may be given.
    exclusive: bool = False
    #: Parses the typed text (the default comes from the annotation); raise ValueError or
    #: argparse.ArgumentTypeError for a bad value.
    parse: Callable[[str], Any] | None = None
    positional: bool = False
    #: A flag of the program's own (e.g. how a supervisor starts its children): not in ``--help``
    #: and never read from the environment.
    hidden: bool = False
    #: False: set by the program (`internal`), never on the command line.
    on_command_line: bool = True


def option(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    help: str,
    choices: Choices | None = None,
    metavar: str | None = None,
    aliases: Sequence[str] = (),
    group: str | None = None,
    exclusive: bool = False,
    parse: Callable[[str], Any] | None = None,
    positional: bool = False,
    hidden: bool = False,
) -> Any:
    """A dataclass field that is a command-line option (``factory`` for a mutable default)."""
    declared = Option(
        help=help,
        choices=choices,
        metavar=metavar,
        aliases=tuple(aliases),
        group=group,
        exclusive=exclusive,
        parse=parse,
        positional=positional,
        hidden=hidden,
    )
    if factory is not None:
        return dataclass_field(default_factory=factory, metadata={_METADATA_KEY: declared})
    return dataclass_field(default=default, metadata={_METADATA_KEY: declared})


def internal(default: Any, *, why: str) -> Any:
    """A dataclass field the program sets, which is no command-line option (``why`` says who sets it)."""
    return dataclass_field(default=default, metadata={_METADATA_KEY: Option(help=why, on_command_line=False)})


@dataclass(frozen=True, slots=True)
class DeclaredOption:
    """One field of an options dataclass, resolved: what `add_options` turns into an argument."""

    name: str
    option: Option
    #: "bool", "list" or "value".
    kind: Literal["bool", "list", "value"]
    #: Text -> value (for a list, of one element).
    parse: Callable[[str], Any]
    default: Any
    #: The `Literal` values of the annotation, when it is one.
    literal_choices: tuple[str, ...] | None

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    def choices(self) -> tuple[str, ...] | None:
        declared = self.option.choices
        if declared is None:
            return self.literal_choices
        return tuple(declared() if callable(declared) else declared)


def flag_name(field_name: str) -> str:
    """``max_tokens`` -> ``--max-tokens``."""
    return "--" + field_name.replace("_", "-")


def parse_finite_float(text: str) -> float:
    """A float that is a number (``inf`` included, NaN refused)."""
    value = float(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number")
    return value


def _parse_bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


_PARSERS: dict[Any, Callable[[str], Any]] = {bool: _parse_bool, int: int, float: parse_finite_float, str: str}


def declared_options(cls: type) -> Iterator[DeclaredOption]:
    """The command-line options of dataclass `cls`, in field order (`internal` fields left out).

    TypeError names a field declared without `option` or `internal`, or of a type with no parser.
    """
    if not (isinstance(cls, type) and is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    for spec in fields(cls):
        declared = spec.metadata.get(_METADATA_KEY)
        if not isinstance(declared, Option):
            raise TypeError(f"{cls.__name__}.{spec.name} is declared without option() or internal()")
        if not declared.on_command_line:
            continue
        default = spec.default_factory() if spec.default_factory is not MISSING else spec.default
        kind, element = _kind_of(hints[spec.name])
        literal_choices = None
        if typing.get_origin(element) is Literal:
            literal_choices = tuple(str(value) for value in typing.get_args(element))
            element = str
        parse = declared.parse or _PARSERS.get(element) or (element if callable(element) else None)
        if parse is None:
            raise TypeError(f"{cls.__name__}.{spec.name}: no parser for {element!r}; give option(parse=...)")
        yield DeclaredOption(spec.name, declared, kind, parse, default, literal_choices)


def _kind_of(hint: Any) -> tuple[Literal["bool", "list", "value"], Any]:
    """The kind of a field's annotation and the type one value parses to (``T | None`` -> ``T``)."""
    if hint is bool:
        return "bool", bool
    if typing.get_origin(hint) is list:
        return "list", typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        given = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(given) == 1:
            return "value", given[0]
    return "value", hint


class OneLineErrorParser(argparse.ArgumentParser):
    """A bad flag is one line on stderr and exit status 2 (argparse's usage dump is for --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _env_suffix(name: str) -> str:
    return name + "__environment"


def add_options(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Add one argument per option of dataclass `cls` to `parser` (defaults from the environment
    under `env_prefix`, when given; `environ` defaults to the process's)."""
    environ = os.environ if environ is None else environ
    groups: dict[str, Any] = {}
    exclusive: dict[str | None, Any] = {}
    for declared in declared_options(cls):
        spec = declared.option
        target: Any = parser
        if spec.group is not None:
            if spec.group not in groups:
                groups[spec.group] = parser.add_argument_group(spec.group)
            target = groups[spec.group]
        if spec.exclusive:
            if spec.group not in exclusive:
                exclusive[spec.group] = target.add_mutually_exclusive_group()
            target = exclusive[spec.group]
        env_name = None if env_prefix is None or spec.hidden else env_prefix + declared.name.upper()
        env_text = environ.get(env_name) if env_name is not None else None
        help_text = spec.help
        if spec.hidden:
            help_text = argparse.SUPPRESS
        elif env_name is not None:
            shown = "" if declared.kind != "value" else "; default %(default)s"
            help_text = f"{spec.help} [{env_name}{shown}]"
        names = (declared.flag, *spec.aliases)
        if declared.kind == "bool":
            default = declared.default if env_text is None else _parse_bool(env_text)
            negatable = declared.default is True or env_name is not None
            if negatable:
                target.add_argument(
                    *names, dest=declared.name, action=argparse.BooleanOptionalAction, default=default, help=help_text
                )
            else:
                target.add_argument(*names, dest=declared.name, action="store_true", default=default, help=help_text)
        elif declared.kind == "list":
            if spec.positional:
                target.add_argument(declared.name, nargs="+", type=declared.parse, metavar=spec.metavar, help=help_text)
                continue
            target.add_argument(
                *names, dest=declared.name, action="append", type=declared.parse, default=None,
                metavar=spec.metavar, help=help_text,
            )  # fmt: skip
            if env_text is not None:
                values = [declared.parse(item) for item in env_text.replace(",", " ").split()]
                parser.set_defaults(**{_env_suffix(declared.name): values})
        else:
            choices = declared.choices()
            default = declared.default
            if env_text is not None:
                default = _parse_environment(parser, env_name or "", env_text, declared.parse, choices)
            if spec.positional:
                target.add_argument(
                    declared.name, type=declared.parse, choices=choices, metavar=spec.metavar, help=help_text
                )
                continue
            target.add_argument(
                *names, dest=declared.name, type=declared.parse, default=default, choices=choices,
                metavar=spec.metavar, help=help_text,
            )  # fmt: skip


def _parse_environment(
    parser: argparse.ArgumentParser,
    env_name: str,
    text: str,
    parse: Callable[[str], Any],
    choices: tuple[str, ...] | None,
) -> Any:
    """An environment default, checked as argparse checks what is typed (it checks no default)."""
    try:
        value = parse(text)
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(f"{env_name}: invalid value {text!r} ({error})")
    if choices is not None and value not in choices:
        parser.error(f"{env_name}: invalid choice {text!r} (choose from {', '.join(choices)})")
    return value


def options_from_args(cls: type[T], args: argparse.Namespace, **program_set: Any) -> T:
    """The `cls` that `args` (parsed by a parser `add_options(parser, cls)` built) describe;
    `program_set` gives the `internal` fields."""
    values: dict[str, Any] = dict(program_set)
    for declared in declared_options(cls):
        value = getattr(args, declared.name)
        if declared.kind == "list":
            if value is None:
                value = getattr(args, _env_suffix(declared.name), None)
            value = list(value) if value is not None else declared.default
        values[declared.name] = value
    return cls(**values)


def parse_options(
    cls: type[T],
    argv: Sequence[str],
    *,
    prog: str,
    env_prefix: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Parse `argv` into a `cls` (exit status 2 and one line on stderr for a bad value)."""
    parser = OneLineErrorParser(prog=prog)
    add_options(parser, cls, env_prefix=env_prefix, environ=environ)
    return options_from_args(cls, parser.parse_args(list(argv)))
