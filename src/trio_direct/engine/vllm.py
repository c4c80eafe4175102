"""Adapter for vLLM's gRPC API (`vllm.grpc.engine.VllmEngine`, served by ``smg-grpc-servicer``).

What smg-grpc-servicer 0.14.1 sends from inside a stock vLLM: token ids in; a streamed request gets
one chunk per engine step whose `token_ids` *and* `completion_tokens` are deltas (vLLM's
``RequestOutputKind.DELTA``), then, when the sequence finishes, a `complete` that repeats the last
delta (so a streamed `complete` adds no tokens); a request that is not streamed gets only the
`complete`, with every output id. Errors arrive as gRPC statuses. `Abort` takes exact request ids
and answers nothing. Prefill/decode goes through vLLM's KV connector: the request carries the
connector's parameters as JSON (`kv_transfer_params_json`) and a prefill's `complete` returns the
parameters its decode leg needs.

proto3 cannot tell unset from zero, so semantic defaults are sent where the field has no presence
(the servicer maps ``top_p`` and ``repetition_penalty`` 0 to 1, and ``top_k`` 0 means "all").
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from google.protobuf import json_format

from trio_direct._proto.smg import common_pb2 as common
from trio_direct._proto.vllm import vllm_engine_pb2 as pb
from trio_direct.engine.chunk_stream import ChunkStream
from trio_direct.engine.errors import EngineInvalidArgument
from trio_direct.engine.logprob_rows import output_rows, prompt_rows
from trio_direct.engine.packed_ids import packed_request
from trio_direct.engine.transport import EngineChannel, MessageStream
from trio_direct.engine.types import (
    EmbedInput,
    EmbedOutput,
    EngineApi,
    FinishReason,
    GenerateChunk,
    GenerateInput,
    SamplingOptions,
    TokenLogprob,
)

SERVICE = "vllm.grpc.engine.VllmEngine"
_PREFIX = f"/{SERVICE}/"
GENERATE = _PREFIX + "Generate"
EMBED = _PREFIX + "Embed"
ABORT = _PREFIX + "Abort"
HEALTH_CHECK = _PREFIX + "HealthCheck"
GET_MODEL_INFO = _PREFIX + "GetModelInfo"
GET_SERVER_INFO = _PREFIX + "GetServerInfo"
GET_LOADS = _PREFIX + "GetLoads"
GET_TOKENIZER = _PREFIX + "GetTokenizer"
FLUSH_CACHE = _PREFIX + "FlushCache"
SUBSCRIBE_KV_EVENTS = _PREFIX + "SubscribeKvEvents"

#: `SamplingParams.seed` is an int32: a larger seed is folded into its range (still deterministic).
_SEED_RANGE = 2**31
#: The finish reasons a GenerateComplete may name; "error" and any unknown one end as an abort.
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sampling_params(
    options: SamplingOptions, *, top_logprobs: int | None = None, prompt_logprobs: int | None = None
) -> pb.SamplingParams:
    def given(value, default):
        return default if value is None else value

    params = pb.SamplingParams(
        top_p=given(options.top_p, 1.0),
        top_k=max(0, given(options.top_k, 0)),  # SGLang's -1 ("all") is vLLM's 0
        min_p=given(options.min_p, 0.0),
        frequency_penalty=given(options.frequency_penalty, 0.0),
        presence_penalty=given(options.presence_penalty, 0.0),
        repetition_penalty=given(options.repetition_penalty, 1.0),
        min_tokens=given(options.min_new_tokens, 0),
        stop=options.stop,
        stop_token_ids=options.stop_token_ids,
        skip_special_tokens=options.skip_special_tokens,
        spaces_between_special_tokens=options.spaces_between_special_tokens,
        ignore_eos=bool(options.ignore_eos),
        n=1,  # the frontend runs each choice as its own request (own rid, own routing, own Abort)
    )
    if options.temperature is not None:
        params.temperature = options.temperature
    if options.max_new_tokens is not None:
        params.max_tokens = options.max_new_tokens
    if options.seed is not None:
        params.seed = options.seed % _SEED_RANGE
    if top_logprobs is not None:
        params.logprobs = top_logprobs
    if prompt_logprobs is not None:
        params.prompt_logprobs = prompt_logprobs
    if options.json_schema is not None:
        params.json_schema = options.json_schema
    elif options.regex is not None:
        params.regex = options.regex
    elif options.ebnf is not None:
        params.grammar = options.ebnf
    elif options.structural_tag is not None:
        params.structural_tag = options.structural_tag
    return params


#: The model's generation-config defaults `GetModelInfo.default_sampling_params_json` may name.
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(raw: str) -> dict[str, float]:
    """`GetModelInfo.default_sampling_params_json` as the `SamplingOptions` values it sets.

    vLLM's own server applies the model's generation config to what a request leaves unset; its
    gRPC servicer does not (an unset temperature is 1.0 there), but reports those defaults, so the
    adapter fills them in. Anything unreadable gives no defaults."""
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {
        key: value
        for key in SAMPLING_DEFAULT_KEYS
        if isinstance(value := parsed.get(key), int | float) and not isinstance(value, bool)
    }


def _with_defaults(options: SamplingOptions, defaults: dict[str, float]) -> SamplingOptions:
    def pick(value: float | None, key: str) -> float | None:
        return defaults.get(key) if value is None else value

    top_k = options.top_k if options.top_k is not None else defaults.get("top_k")
    return replace(
        options,
        temperature=pick(options.temperature, "temperature"),
        top_p=pick(options.top_p, "top_p"),
        top_k=None if top_k is None else int(top_k),
        min_p=pick(options.min_p, "min_p"),
        repetition_penalty=pick(options.repetition_penalty, "repetition_penalty"),
    )


#: Where `GenerateRequest` holds the prompt's ids: `tokenized.input_ids`.
_IDS_PATH = (
    pb.GenerateRequest.DESCRIPTOR.fields_by_name["tokenized"].number,
    pb.TokenizedInput.DESCRIPTOR.fields_by_name["input_ids"].number,
)


def generate_request(
    request: GenerateInput, defaults: dict[str, float] | None = None, *, ids: bool = True
) -> pb.GenerateRequest:
    """The wire request; ``defaults`` (`sampling_defaults`) fill the sampling fields left unset
    (`ids` false: without the prompt's ids, which `packed_request` adds)."""
    if request.image_data:
        # The servicer takes images as pixel values a gateway's processor made, or as media
        # references only where the worker runs its own processor (`mm_processor`): not served here.
        raise EngineInvalidArgument("the vLLM API takes no image URLs from this frontend")
    options = _with_defaults(request.sampling, defaults) if defaults else request.sampling
    logprobs = request.top_logprobs_num if request.return_logprob else None
    # vLLM scores the whole prompt or none of it; the decoder drops the rows before the start.
    wants_prompt_rows = request.return_logprob and request.logprob_start_len >= 0
    message = pb.GenerateRequest(
        request_id=request.rid,
        tokenized=pb.TokenizedInput(original_text=request.original_text, input_ids=request.input_ids if ids else ()),
        sampling_params=sampling_params(
            options, top_logprobs=logprobs, prompt_logprobs=logprobs if wants_prompt_rows else None
        ),
        stream=request.stream,
    )
    if request.routed_dp_rank is not None:
        message.data_parallel_rank = request.routed_dp_rank
    if request.kv_transfer_params is not None:
        message.kv_transfer_params_json = request.kv_transfer_params
    return message


def embed_request(request: EmbedInput) -> pb.EmbedRequest:
    """vLLM's `EmbedRequest` has no DP-rank field: the engine places the request itself."""
    return pb.EmbedRequest(
        request_id=request.rid,
        tokenized=pb.TokenizedInput(original_text=request.original_text, input_ids=request.input_ids),
    )


class _ChunkDecoder:
    """Sums the delta counts into the cumulative ones `GenerateChunk` carries; a streamed
    `complete` repeats the last delta and adds nothing.

    The prompt's rows (`input_logprobs`) come with a stream's first chunk and with the `complete`
    built from the same engine output (a request that finishes in one step has both), or only with
    the `complete` of a request that is not streamed: they are passed on once, from
    ``prompt_start`` on (vLLM always scores the prompt from its first token)."""

    __slots__ = ("received", "finished", "stream", "prompt_start", "prompt_rows_seen")

    def __init__(self, stream: bool, prompt_start: int = 0) -> None:
        self.received = 0
        self.finished = False
        self.stream = stream
        self.prompt_start = max(0, prompt_start)
        self.prompt_rows_seen = False

    def _prompt_rows(self, rows: pb.InputLogProbs) -> list[TokenLogprob] | None:
        if self.prompt_rows_seen:
            return None
        self.prompt_rows_seen = True
        return prompt_rows(rows)[self.prompt_start :]

    def decode(self, message: pb.GenerateResponse) -> GenerateChunk | None:
        kind = message.WhichOneof("response")
        if kind == "chunk":
            chunk = message.chunk
            self.received += len(chunk.token_ids)
            return GenerateChunk(
                token_ids=list(chunk.token_ids),
                prompt_tokens=chunk.prompt_tokens,
                completion_tokens=self.received,
                cached_tokens=chunk.cached_tokens,
                logprobs=output_rows(chunk.output_logprobs) if chunk.HasField("output_logprobs") else None,
                prompt_logprobs=self._prompt_rows(chunk.input_logprobs) if chunk.HasField("input_logprobs") else None,
            )
        if kind == "complete":
            return self._complete(message.complete)
        return None  # an empty message: nothing new

    def _complete(self, complete: pb.GenerateComplete) -> GenerateChunk:
        self.finished = True
        ids = [] if self.stream else list(complete.output_ids)
        self.received += len(ids)
        matched = complete.WhichOneof("matched_stop")
        reason = _FINISH_REASONS.get(complete.finish_reason, "abort")
        chunk = GenerateChunk(
            token_ids=ids,
            finish_reason=reason,
            matched_stop=getattr(complete, matched) if matched else None,
            prompt_tokens=complete.prompt_tokens,
            completion_tokens=self.received,
            cached_tokens=complete.cached_tokens,
        )
        if ids and complete.HasField("output_logprobs"):
            chunk.logprobs = output_rows(complete.output_logprobs)
        if complete.HasField("input_logprobs"):
            chunk.prompt_logprobs = self._prompt_rows(complete.input_logprobs)
        if complete.HasField("kv_transfer_params_json"):
            chunk.kv_transfer_params = complete.kv_transfer_params_json
        if reason == "abort":
            chunk.abort_message = (
                "request aborted by the engine"
                if complete.finish_reason == "abort"
                else f"the engine ended the request with finish reason {complete.finish_reason!r}"
            )
        return chunk


def _as_dict(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


class VllmEngineClient:
    """An engine reached over vLLM's gRPC API."""

    api: EngineApi = "vllm"

    def __init__(self, channel: EngineChannel, *, defaults: dict[str, float] | None = None) -> None:
        self.channel = channel
        self.name = channel.name
        self.last_output_at = -math.inf
        #: The model's sampling defaults (`sampling_defaults`), applied to what a request leaves unset.
        self.defaults = defaults or {}

    @asynccontextmanager
    async def generate(self, request: GenerateInput) -> AsyncIterator[ChunkStream]:
        message = packed_request(request, partial(generate_request, defaults=self.defaults), _IDS_PATH)
        async with self.channel.open_stream(GENERATE, message, pb.GenerateResponse, timeout=None) as stream:
            decoder = _ChunkDecoder(request.stream, request.logprob_start_len)
            yield ChunkStream(stream, decoder, self.name)

    async def embed(self, request: EmbedInput) -> EmbedOutput:
        reply = await self.channel.unary_work(EMBED, embed_request(request), pb.EmbedResponse, timeout=None)
        return EmbedOutput(list(reply.embedding), reply.prompt_tokens or len(request.input_ids))

    async def connect(self) -> None:
        await self.channel.connect_for_streams()

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool:
        """vLLM aborts exact ids and answers nothing: an answer means the Abort was taken."""
        await self.channel.unary(ABORT, pb.AbortRequest(request_ids=[rid]), pb.AbortResponse, timeout=timeout)
        return True

    async def health(self, *, timeout: float = 5.0) -> bool:
        reply = await self.channel.unary(HEALTH_CHECK, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=timeout)
        return reply.healthy

    async def model_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.channel.unary(
            GET_MODEL_INFO, pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout=timeout
        )
        return _as_dict(reply)

    async def server_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.channel.unary(
            GET_SERVER_INFO, pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=timeout
        )
        return _as_dict(reply)

    async def load(self, dp_rank: int | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]:
        request = pb.GetLoadsRequest() if dp_rank is None else pb.GetLoadsRequest(dp_rank=dp_rank)
        reply = await self.channel.unary(GET_LOADS, request, pb.GetLoadsResponse, timeout=timeout)
        return [_as_dict(load) for load in reply.loads]

    async def flush_cache(self, *, timeout: float = 30.0) -> tuple[bool, str]:
        """Drop the engine's prefix cache (`FlushCache`): (success, the engine's message). The
        engine waits up to `timeout` for its running requests before it gives up."""
        request = common.FlushCacheRequest(timeout_s=timeout)
        reply = await self.channel.unary(FLUSH_CACHE, request, common.FlushCacheResponse, timeout=timeout + 5.0)
        return reply.success, reply.message

    def kv_events(self, start_sequence_number: int = 0) -> AbstractAsyncContextManager[MessageStream]:
        """`SubscribeKvEvents`: the engine's KV batches (every DP rank's), from ``start_sequence_number``
        on when the engine still holds them (0: live only). Open for the body of the ``async with``."""
        request = common.SubscribeKvEventsRequest(start_sequence_number=start_sequence_number)
        return self.channel.open_stream(SUBSCRIBE_KV_EVENTS, request, common.KvEventBatch, timeout=None)

    async def tokenizer_archive(self, *, max_bytes: int, timeout: float = 60.0) -> tuple[bytes, str]:
        """The engine's tokenizer files as one zip archive and the SHA-256 the engine gave for it
        (`GetTokenizer`), for a frontend that cannot read the tokenizer where the engine does.
        `ValueError` when the archive grows past `max_bytes`. (The same call as the SMG adapter's:
        whatever loads tokenizers from engines asks either API alike.)"""
        data = bytearray()
        digest = ""
        async with self.channel.open_stream(
            GET_TOKENIZER, common.GetTokenizerRequest(), common.GetTokenizerChunk, timeout=timeout
        ) as stream:
            async for chunk in stream:
                data += chunk.data
                if len(data) > max_bytes:
                    raise ValueError(f"the engine's tokenizer archive is larger than {max_bytes} bytes")
                digest = chunk.sha256 or digest
        return bytes(data), digest
