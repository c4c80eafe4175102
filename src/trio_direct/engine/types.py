"""What the rest of trio-direct says to an engine and hears back, independent of the gRPC API.

The adapters (`native`, `smg`, `vllm`) turn a `GenerateInput` into their wire request and their wire
responses into `GenerateChunk` deltas, so routing, the text pipeline and the HTTP layer never see
protobuf or the differences between the two APIs.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from trio_direct.engine.packed_ids import PackedIds

FinishReason = Literal["stop", "length", "abort"]
#: An engine API's name (its adapter's ``api``; the registry of APIs is `trio_direct.fleet.engine_apis`).
EngineApi = str


@dataclass(slots=True)
class SamplingOptions:
    """Sampling parameters; `None` means "engine default" (the SMG adapter fills semantic defaults)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool | None = None
    seed: int | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


@dataclass(slots=True, frozen=True)
class Bootstrap:
    """The prefill/decode rendezvous triple; both legs of one request carry the same one."""

    host: str
    port: int
    room: int


@dataclass(slots=True)
class GenerateInput:
    """One generation on one engine. `rid` must never be a prefix of another live rid."""

    rid: str
    input_ids: Sequence[int]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    stream: bool = True
    routed_dp_rank: int | None = None
    bootstrap: Bootstrap | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    original_text: str = ""
    #: Images as the client gave them (http(s) or ``data:`` URLs), in prompt order: the native
    #: API's ``GenerateRequest.image_data``. The prompt holds the model's placeholder for each.
    image_data: Sequence[str] = ()
    #: The request's priority (SGLang's `priority`; the native API carries it, SMG's has no field).
    priority: int | None = None
    #: W3C trace context (`traceparent`, `tracestate`) for the engine's own tracing (native API only).
    trace_headers: dict[str, str] | None = None
    #: vLLM's KV-connector parameters for this leg, a JSON object as text (vLLM API only): the
    #: prefill leg's "remote decode" request, or what the prefill's completion returned, for decode.
    kv_transfer_params: str | None = None
    #: `input_ids` already packed for the wire where the prompt was tokenized; the adapters use it
    #: only while `input_ids` is the very sequence it was made from (`PackedIds.payload_for`).
    packed_input_ids: PackedIds | None = None


@dataclass(slots=True)
class EmbedInput:
    """One embedding on one engine (a unary call). `rid` must never be a prefix of another live rid."""

    rid: str
    input_ids: Sequence[int]
    original_text: str = ""
    routed_dp_rank: int | None = None


@dataclass(frozen=True, slots=True)
class EmbedOutput:
    """The engine's vector for one input, and the prompt tokens it counted."""

    embedding: list[float]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and, when asked for, its top alternatives."""

    token_id: int
    #: None for a prompt's first token (nothing precedes it, so it has no logprob).
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class GenerateChunk:
    """New output of one generation since the previous chunk.

    `token_ids` is always a delta, whatever the engine's streaming mode; the counts are cumulative.
    The last chunk of a generation has `finish_reason` set.
    """

    token_ids: list[int]
    finish_reason: FinishReason | None = None
    matched_stop: int | str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    dp_rank: int | None = None
    abort_message: str | None = None
    abort_status_code: int | None = None
    #: One entry per token of `token_ids` when the request asked for logprobs.
    logprobs: list[TokenLogprob] | None = None
    #: The prompt's rows from `GenerateInput.logprob_start_len`, once (with the first chunk that has them).
    prompt_logprobs: list[TokenLogprob] | None = None
    #: On a vLLM prefill's last chunk: the KV-connector parameters its decode leg must carry (JSON).
    kv_transfer_params: str | None = None


class GenerateStream(Protocol):
    """The chunks of one open generation (what `EngineClient.generate` yields)."""

    def __aiter__(self) -> GenerateStream: ...

    async def __anext__(self) -> GenerateChunk:
        """The next chunk; raises the call's `EngineError` where the stream broke."""

    def next_nowait(self) -> GenerateChunk:
        """The next chunk if it already arrived; raises `trio.WouldBlock` when none has, and
        `StopAsyncIteration` after the last."""

    async def wait_written(self) -> None:
        """Return once the request is on the wire (or the call ended before it could be)."""

    # Optional (`ChunkStream` has them): `fail(error) -> bool` ends the stream for its reader with
    # `error` (a hung engine); `wake() -> bool` makes a waiting reader raise `StreamWakeup`.


class EngineClient(Protocol):
    """One engine, whichever API it speaks."""

    api: EngineApi
    name: str
    #: When a generation on this engine last delivered output (trio time; set by the frontend's
    #: engine calls): an engine streaming tokens is alive even when a health check queues too long.
    last_output_at: float

    def generate(self, request: GenerateInput) -> AbstractAsyncContextManager[GenerateStream]:
        """Open a generation; leaving the context early cancels it at the engine."""

    async def embed(self, request: EmbedInput) -> EmbedOutput:
        """One embedding (the engine's `Embed` RPC); cancelling the call cancels it at the engine."""

    async def connect(self) -> None:
        """Open the connection generations stream on now, rather than in the first generation."""

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool: ...

    async def health(self, *, timeout: float = 5.0) -> bool: ...

    async def model_info(self, *, timeout: float = 10.0) -> dict[str, Any]: ...

    async def server_info(self, *, timeout: float = 10.0) -> dict[str, Any]: ...

    async def load(self, dp_rank: int | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]: ...
