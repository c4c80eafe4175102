"""Decoding a JSON request body into any request `msgspec.Struct`, with `openai.requests`' rules.

The same rules as chat and completions, for every other surface's schema: malformed JSON, a body
that is no object, wrong types and missing fields are OpenAI 400s naming the `param`; a top-level
`null` means "not given".
"""

from __future__ import annotations

from typing import Any, TypeVar

from trio_direct.core import json_body
from trio_direct.openai.requests import BODY_RULES

__all__ = ["convert_object", "decode_body"]

T = TypeVar("T")


def decode_body(body: bytes, schema: type[T]) -> T:
    """`body` as a `schema` instance; raises `ApiError` (400) on any problem."""
    return json_body.convert_object(json_body.decode_object(body, BODY_RULES), schema, BODY_RULES)


def convert_object(raw: dict[str, Any], schema: type[T]) -> T:
    """An already decoded body (`null` values dropped) as a `schema` instance; `ApiError` (400)."""
    return json_body.convert_object(raw, schema, BODY_RULES)
