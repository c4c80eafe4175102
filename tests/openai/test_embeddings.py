"""`/v1/embeddings` bodies: what is accepted and refused, and the response as the `openai` SDK reads it."""

from __future__ import annotations

import base64
import json
import math
import struct

import httpx
import openai
import pytest

from trio_direct.core.errors import ApiError
from trio_direct.openai.embeddings import (
    MAX_INPUTS,
    decode_embedding_request,
    embedding_inputs,
    embeddings_body,
    float32_base64,
    truncate_normalized,
)


def body(**fields) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("hello", ["hello"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_every_input_shape_of_the_reference_is_one_vector_per_item(given, inputs):
    request = decode_embedding_request(body(input=given))
    assert embedding_inputs(request) == inputs
    assert request.encoding_format == "float" and request.dimensions is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input[1]"),
        ({"input": ["a", 1]}, "input[1]"),
        ({"input": [[1], []]}, "input[1]"),
        ({"input": [1, -2]}, "input[1]"),
        ({"input": [[1, -2]]}, "input[0][1]"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "dimensions": "64"}, "dimensions"),
        ({"input": {"text": "x", "image": "y"}}, "input"),
        ({}, "input"),
    ],
)
def test_bad_inputs_are_400s_naming_the_parameter(fields, param):
    with pytest.raises(ApiError) as caught:
        decode_embedding_request(body(**fields))
    assert caught.value.status == 400 and caught.value.param == param, caught.value


def test_base64_is_little_endian_float32_as_the_sdk_decodes_it():
    vector = [0.5, -1.25, 3.0, 1e-3]
    encoded = float32_base64(vector)
    assert base64.b64decode(encoded) == struct.pack("<4f", *vector)
    assert list(struct.unpack("<4f", base64.b64decode(encoded))) == pytest.approx(vector)


def test_a_matryoshka_cut_is_normalised_again():
    cut = truncate_normalized([3.0, 4.0, 12.0], 2)
    assert cut == pytest.approx([0.6, 0.8])
    assert math.fsum(x * x for x in cut) == pytest.approx(1.0)


def sdk_reading(body_bytes: bytes) -> openai.OpenAI:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body_bytes, headers={"content-type": "application/json"})

    return openai.OpenAI(
        api_key="k",
        base_url="http://frontend.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),  # type: ignore[arg-type]  # the SDK takes a legacy httpx.Client too (checked at run time); its types name only httpx2
    )


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_the_sdk_reads_the_body_in_both_encodings(encoding_format):
    vectors = [[0.6, 0.8], [1.0, 0.0]]
    client = sdk_reading(embeddings_body("m", vectors, prompt_tokens=7, encoding_format=encoding_format))
    if encoding_format == "float":
        reply = client.embeddings.create(model="m", input=["a", "b"], encoding_format="float")
    else:
        reply = client.embeddings.create(model="m", input=["a", "b"])  # the SDK's default asks for base64
    assert [item.index for item in reply.data] == [0, 1]
    assert [item.embedding for item in reply.data] == [pytest.approx(v) for v in vectors]
    assert (reply.model, reply.usage.prompt_tokens, reply.usage.total_tokens) == ("m", 7, 7)
    raw = json.loads(embeddings_body("m", vectors, 7, encoding_format))
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    client.close()
