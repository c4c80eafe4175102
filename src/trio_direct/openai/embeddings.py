"""OpenAI's embeddings API (`POST /v1/embeddings`): the request schema, its validation, and the body.

`input` is a string, a list of strings, a list of token ids or a list of lists of token ids, as in
OpenAI's reference (at most `MAX_INPUTS` of them). `encoding_format` "base64" is each vector's
little-endian float32 bytes in base64, which the `openai` SDK asks for by default and decodes
itself. `dimensions` is validated here only for its range; whether the model may be cut to it is
the model's business (`surfaces.embeddings`). Errors are OpenAI 400s naming the `param`.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections.abc import Sequence
from typing import Literal

import msgspec

from trio_direct.core.errors import invalid_request
from trio_direct.openai.bodies import decode_body
from trio_direct.openai.requests import INT32_MAX, _token_ids_ok

__all__ = [
    "MAX_INPUTS",
    "EmbeddingRequest",
    "decode_embedding_request",
    "embedding_inputs",
    "embeddings_body",
    "float32_base64",
    "truncate_normalized",
]

#: OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048

EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """`POST /v1/embeddings`. `user` is the routing affinity key with ``--router-affinity-from-user``."""

    model: str
    input: str | list[str | int | list[int]]
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None
    user: str | None = None


def decode_embedding_request(body: bytes) -> EmbeddingRequest:
    """Parse and validate an embeddings body; raises `ApiError` (400) on any problem."""
    request = decode_body(body, EmbeddingRequest)
    _check_input(request.input)
    if request.dimensions is not None and not 1 <= request.dimensions <= INT32_MAX:
        raise invalid_request(
            f"Invalid value for 'dimensions': expected a positive integer, but got {request.dimensions}.",
            param="dimensions",
        )
    return request


def embedding_inputs(request: EmbeddingRequest) -> list[str | list[int]]:
    """The inputs of a (validated) request, one entry per vector: text or token ids."""
    given = request.input
    if isinstance(given, str):
        return [given]
    if isinstance(given[0], int):
        return [given]  # type: ignore[list-item]
    return list(given)  # type: ignore[arg-type]


_SHAPES = "a string, an array of strings, an array of token ids, or an array of arrays of token ids"


def _check_input(given: str | list[str | int | list[int]]) -> None:
    if isinstance(given, str):
        if not given.strip():
            raise invalid_request("Invalid value for 'input': the input must not be empty.", param="input")
        return
    if not given:
        raise invalid_request("Invalid value for 'input': expected at least one input.", param="input")
    if _token_ids_ok(given):  # one prompt of token ids, checked at C speed
        return
    kind = type(given[0])
    if kind is not int and len(given) > MAX_INPUTS:
        raise invalid_request(
            f"Invalid value for 'input': at most {MAX_INPUTS} inputs are allowed, got {len(given)}.", param="input"
        )
    for i, item in enumerate(given):
        param = f"input[{i}]"
        if type(item) is not kind:
            raise invalid_request(f"Invalid type for '{param}': the input must be {_SHAPES}.", param=param)
        if isinstance(item, int):
            _check_token_id(item, param)
        elif isinstance(item, str):
            if not item.strip():
                raise invalid_request(f"Invalid value for '{param}': the input must not be empty.", param=param)
        elif not item:
            raise invalid_request(f"Invalid value for '{param}': the input must not be empty.", param=param)
        elif not _token_ids_ok(item):
            for j, token_id in enumerate(item):
                _check_token_id(token_id, f"{param}[{j}]")


def _check_token_id(token_id: int, param: str) -> None:
    if not 0 <= token_id <= INT32_MAX:
        raise invalid_request(f"Invalid value for '{param}': token ids must be non-negative, got {token_id}.", param)


# ----------------------------------------------------------------------------------------------
# The response


def truncate_normalized(vector: Sequence[float], dimensions: int) -> list[float]:
    """A Matryoshka vector cut to its first `dimensions` and L2-normalised again, as SGLang's
    pooler does for `dimensions`."""
    head = list(vector[:dimensions])
    norm = math.sqrt(math.fsum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


def float32_base64(vector: Sequence[float]) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


class _Embedding(msgspec.Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: list[float] | str


class _EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class _EmbeddingList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[_Embedding]
    model: str
    usage: _EmbeddingUsage


_encoder = msgspec.json.Encoder()


def embeddings_body(
    model: str, vectors: Sequence[Sequence[float]], prompt_tokens: int, encoding_format: EncodingFormat = "float"
) -> bytes:
    """The `list` of `embedding` objects, in input order, with OpenAI's usage (prompt tokens only)."""
    encode = float32_base64 if encoding_format == "base64" else list
    data = [_Embedding(index=i, embedding=encode(vector)) for i, vector in enumerate(vectors)]
    return _encoder.encode(_EmbeddingList(data=data, model=model, usage=_EmbeddingUsage(prompt_tokens, prompt_tokens)))
