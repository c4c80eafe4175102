"""What the mock makes of embedding requests and images (sans-IO, deterministic).

`--is-embedding`: an embedding request is a prefill-only scheduler request (it costs prefill time,
KV pages and a batch slot like any prompt, then ends without a token), and its vector is a pure
function of the prompt: L2-normalised, of the model config's `hidden_size` dimensions, the same
for the same input on any engine.

`--multimodal`: each image of a request (`image_data`) stands for `IMAGE_PROMPT_TOKENS` prompt
tokens, placed before the prompt's own tokens and derived from the image's text (URL or data URL),
so a repeated image hits the prefix cache and a different one does not; `prompt_tokens` counts
them, as a real engine counts what an image placeholder expands to.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Sequence

import xxhash

from trio_direct.mock.scheduler import RequestOutput

__all__ = ["DEFAULT_EMBEDDING_DIM", "IMAGE_PROMPT_TOKENS", "EmbedSink", "embedding_vector", "image_prompt_tokens"]

#: Prompt tokens the mock counts for each image.
IMAGE_PROMPT_TOKENS = 16
#: Embedding size when the model config has no `hidden_size`.
DEFAULT_EMBEDDING_DIM = 1024


def embedding_vector(input_ids: Sequence[int], dim: int) -> list[float]:
    """A unit vector that depends only on `input_ids` (Gaussian coordinates, seeded by their hash)."""
    seed = xxhash.xxh3_64_intdigest(array("q", input_ids).tobytes())
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [x / norm for x in vector]


def image_prompt_tokens(images: Sequence[str], vocab_size: int) -> list[int]:
    """`IMAGE_PROMPT_TOKENS` token ids per image, in order, derived from each image's text."""
    tokens: list[int] = []
    for image in images:
        base = xxhash.xxh3_64_intdigest(image.encode("utf-8", "surrogatepass"))
        tokens.extend((base + k * 0x9E3779B1) % vocab_size for k in range(IMAGE_PROMPT_TOKENS))
    return tokens


class EmbedSink:
    """One `Embed` call's view of its prefill-only scheduler request (a `RequestSink`): the vector
    once the prefill finished, or the failure, through the service's `reply` and `fail`."""

    __slots__ = ("_dim", "_done", "_fail", "_input_ids", "_reply")

    def __init__(
        self,
        input_ids: Sequence[int],
        dim: int,
        reply: Callable[[list[float], int], None],
        fail: Callable[[str, str], None],
    ) -> None:
        self._input_ids = input_ids
        self._dim = dim
        self._reply = reply
        self._fail = fail
        self._done = False

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        if self._done or out.finish is None:
            return
        self._done = True
        if out.finish.kind == "abort":
            status = "INVALID_ARGUMENT" if out.finish.status_code == 400 else "INTERNAL"
            self._fail(status, out.finish.message or "Request aborted")
            return
        self._reply(embedding_vector(self._input_ids, self._dim), out.prompt_tokens)

    def aborted(self, rid: str) -> None:
        if not self._done:
            self._done = True
            self._fail("CANCELLED", f"Request aborted: {rid}")
