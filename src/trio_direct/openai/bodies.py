"""Decoding a JSON request body into any request `msgspec.Struct`, with `openai.requests`' rules.

The same rules as chat and completions, for every other surface's schema: malformed JSON, a body
that is no object, wrong types and missing fields are OpenAI 400s naming the `param`; a top-level
`null` means "not given".
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from trio_direct.core.errors import invalid_request
from trio_direct.openai.requests import _TOO_DEEP, decode_object, validation_error

__all__ = ["convert_object", "decode_body"]

T = TypeVar("T")


def decode_body(body: bytes, schema: type[T]) -> T:
    """`body` as a `schema` instance; raises `ApiError` (400) on any problem."""
    return convert_object(decode_object(body), schema)


def convert_object(raw: dict[str, Any], schema: type[T]) -> T:
    """An already decoded body (`null` values dropped) as a `schema` instance; `ApiError` (400)."""
    try:
        return msgspec.convert(raw, schema)
    except msgspec.ValidationError as exc:
        raise validation_error(str(exc)) from None
    except RecursionError:
        raise invalid_request(_TOO_DEEP) from None
