"""Argument types from the request's tool schemas, for formats that write values untyped.

XML-style formats (Qwen3-Coder, GLM-4.5) write every value as bare text between tags; only
the tool's JSON schema says whether `3` is the number 3 or the string "3".
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["ToolSchemas", "coerce_value", "declared_types", "item_schema", "member_schema"]


class ToolSchemas:
    """Parameter schemas by function name, from OpenAI `tools` (missing or odd entries skipped)."""

    __slots__ = ("_properties",)

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        self._properties: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            if not isinstance(tool, Mapping):
                continue
            function = tool.get("function", tool)  # also accept a bare function definition
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            self._properties[function["name"]] = properties if isinstance(properties, Mapping) else {}

    def types_of(self, function: str, parameter: str) -> tuple[str, ...]:
        """The JSON types the schema allows for a parameter; `()` when it does not say."""
        schema = self._properties.get(function, {}).get(parameter)
        return declared_types(schema) if isinstance(schema, Mapping) else ()

    def parameters(self, function: str) -> Mapping[str, Any] | None:
        """The function's arguments object as a schema (its `properties`), for formats whose values
        nest; `None` for a function the request does not declare."""
        properties = self._properties.get(function)
        return None if properties is None else {"type": "object", "properties": properties}


def member_schema(schema: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    """The subschema of an object's member `key`: its `properties` entry, one found in a union
    branch, or `additionalProperties`; `None` when the schema does not say."""
    if schema is None:
        return None
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and isinstance(properties.get(key), Mapping):
        return properties[key]
    for union in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(union) or ():
            if isinstance(option, Mapping):
                found = member_schema(option, key)
                if found is not None:
                    return found
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def item_schema(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The subschema of an array's items (`items`, or one in a union branch); `None` when unsaid."""
    if schema is None:
        return None
    items = schema.get("items")
    if isinstance(items, Mapping):
        return items
    for union in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(union) or ():
            if isinstance(option, Mapping):
                found = item_schema(option)
                if found is not None:
                    return found
    return None


def declared_types(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """JSON types a (sub)schema allows, in declaration order: `type`, `enum`, unions, shapes."""
    found: list[str] = []
    declared = schema.get("type")
    if isinstance(declared, str):
        found.append(declared)
    elif isinstance(declared, list):
        found.extend(t for t in declared if isinstance(t, str))
    if not found and isinstance(schema.get("enum"), list):
        for value in schema["enum"]:
            found.append(_json_type_name(value))
    for union in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(union) or ():
            if isinstance(option, Mapping):
                found.extend(declared_types(option))
    if not found and "properties" in schema:
        found.append("object")
    if not found and "items" in schema:
        found.append("array")
    return tuple(dict.fromkeys(t.lower() for t in found))


def coerce_value(raw: str, types: tuple[str, ...], *, infer: bool) -> Any:
    """The JSON value for bare text `raw`, given the types its parameter allows.

    The first declared type that `raw` fits wins; text that fits none stays a string (never
    dropped). With no declared types, `infer=True` reads `raw` as JSON when it is valid JSON
    (GLM writes non-strings with `tojson`), `infer=False` keeps it a string (Qwen3-Coder).
    """
    text = raw.strip()
    for kind in types:
        if kind == "string":
            continue  # the fallback, once nothing more specific fits
        converted = _convert(text, kind)
        if converted is not _NO:
            return converted
    if text == "null" and types and "string" not in types:
        return None  # how `tojson` writes a missing optional value
    if types or not infer:
        return raw
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return raw


_NO: Any = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity would not serialize back


def _convert(text: str, kind: str) -> Any:
    if kind == "null":
        return None if text in ("null", "None") else _NO
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _NO)
    if kind in ("integer", "number"):
        if not _NUMBER.fullmatch(text):
            return _NO
        if _INTEGER.fullmatch(text):
            return int(text)
        number = float(text)
        if not math.isfinite(number):
            return _NO
        if kind == "integer":
            return int(number) if number.is_integer() else _NO
        return number
    if kind in ("object", "array"):
        wanted = dict if kind == "object" else list
        for load in (json.loads, ast.literal_eval):
            try:
                value = load(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, wanted):
                try:
                    json.dumps(value, allow_nan=False)
                except (TypeError, ValueError):
                    continue
                return value
        return _NO
    return _NO  # an unknown type name: let the string fallback decide


_INTEGER: Final = re.compile(r"[-+]?\d+")
_NUMBER: Final = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "string"
