"""Decoding a JSON request body into a request `msgspec.Struct`, the same way for every API.

Malformed JSON, a body nested too deeply, bytes that are not UTF-8, a body that is no object, wrong
types and missing fields are 400s; a top-level ``null`` means "not given" and is dropped. Only the
words differ between APIs: each passes its `BodyRules` (its messages, and how it phrases msgspec's
validation error with the field's path as `param`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from trio_direct.core.errors import ApiError, invalid_request

__all__ = ["BodyRules", "convert_object", "decode_object"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BodyRules:
    """One API's wording of a bad body."""

    malformed_json: str
    too_deep: str
    #: msgspec's validation message -> the API's 400 (naming the field as `param`).
    validation_error: Callable[[str], ApiError]


def decode_object(body: bytes, rules: BodyRules) -> dict[str, Any]:
    """The body as a JSON object (top-level nulls dropped: not given); a 400 for anything else."""
    try:
        raw = msgspec.json.decode(body)
    except msgspec.DecodeError:  # ValidationError (e.g. 1e400) is a DecodeError too
        raise invalid_request(rules.malformed_json) from None
    except RecursionError:
        raise invalid_request(rules.too_deep) from None
    except UnicodeDecodeError as error:  # msgspec decodes strings as UTF-8 and lets this through
        raise invalid_request(f"The request body is not valid UTF-8 (at byte {error.start}).") from None
    if not isinstance(raw, dict):
        raise invalid_request("The request body must be a JSON object.")
    return {key: value for key, value in raw.items() if value is not None}


def convert_object(raw: dict[str, Any], schema: type[T], rules: BodyRules) -> T:
    """An already decoded body as a `schema` instance; a 400 in the API's words otherwise."""
    try:
        return msgspec.convert(raw, schema)
    except msgspec.ValidationError as exc:
        raise rules.validation_error(str(exc)) from None
    except RecursionError:
        raise invalid_request(rules.too_deep) from None
