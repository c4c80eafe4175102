"""Adapter for SGLang's SMG API (`sglang.grpc.scheduler.SglangScheduler`, `--smg-grpc-mode`).

What SGLang's SMG servicers (``smg-grpc-servicer`` on PyPI, and the older in-tree ones) send: token
ids in, chunk `token_ids` always deltas;
smg-grpc-servicer sends a final chunk and then a `complete` that repeats the last delta (so the
`complete`'s ids must not be counted again), while older in-tree servicers send the last delta only in
`complete`; servicers up to smg-grpc-proto 0.4.5 report errors in-band in field 4 (`GenerateError`),
newer ones as gRPC statuses. proto3 cannot tell unset from zero, so semantic defaults are always sent.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from google.protobuf import empty_pb2, json_format, unknown_fields

from trio_direct._proto.smg import common_pb2 as common
from trio_direct._proto.smg import sglang_scheduler_pb2 as pb
from trio_direct.engine.chunk_stream import ChunkStream
from trio_direct.engine.errors import EngineInternal, EngineInvalidArgument
from trio_direct.engine.logprob_rows import output_rows, prompt_rows
from trio_direct.engine.packed_ids import packed_request
from trio_direct.engine.transport import EngineChannel
from trio_direct.engine.types import (
    EmbedInput,
    EmbedOutput,
    EngineApi,
    FinishReason,
    GenerateChunk,
    GenerateInput,
    SamplingOptions,
)

_SERVICE = "/sglang.grpc.scheduler.SglangScheduler/"
GENERATE = _SERVICE + "Generate"
EMBED = _SERVICE + "Embed"
ABORT = _SERVICE + "Abort"
HEALTH_CHECK = _SERVICE + "HealthCheck"
GET_MODEL_INFO = _SERVICE + "GetModelInfo"
GET_SERVER_INFO = _SERVICE + "GetServerInfo"
GET_LOADS = _SERVICE + "GetLoads"
FLUSH_CACHE = _SERVICE + "FlushCache"
GET_TOKENIZER = _SERVICE + "GetTokenizer"

#: The SMG room field is int32 (the native one is int64).
MAX_ROOM = 2**31 - 1
_LEGACY_ERROR_FIELD = 4
#: The finish reasons a GenerateComplete may name; any other counts as "stop".
_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def sampling_params(options: SamplingOptions) -> pb.SamplingParams:
    def given(value, default):
        return default if value is None else value

    params = pb.SamplingParams(
        temperature=given(options.temperature, 1.0),
        top_p=given(options.top_p, 1.0),
        top_k=given(options.top_k, -1),
        min_p=given(options.min_p, 0.0),
        frequency_penalty=given(options.frequency_penalty, 0.0),
        presence_penalty=given(options.presence_penalty, 0.0),
        repetition_penalty=given(options.repetition_penalty, 1.0),
        stop=options.stop,
        stop_token_ids=options.stop_token_ids,
        skip_special_tokens=options.skip_special_tokens,
        spaces_between_special_tokens=options.spaces_between_special_tokens,
        n=1,
        min_new_tokens=given(options.min_new_tokens, 0),
        ignore_eos=bool(options.ignore_eos),
    )
    if options.max_new_tokens is not None:
        params.max_new_tokens = options.max_new_tokens
    if options.json_schema is not None:
        params.json_schema = options.json_schema
    elif options.regex is not None:
        params.regex = options.regex
    elif options.ebnf is not None:
        params.ebnf_grammar = options.ebnf
    elif options.structural_tag is not None:
        params.structural_tag = options.structural_tag
    return params


#: Where `GenerateRequest` holds the prompt's ids: `tokenized.input_ids`.
_IDS_PATH = (
    pb.GenerateRequest.DESCRIPTOR.fields_by_name["tokenized"].number,
    pb.TokenizedInput.DESCRIPTOR.fields_by_name["input_ids"].number,
)


def generate_request(request: GenerateInput, *, ids: bool = True) -> pb.GenerateRequest:
    """The wire request (`ids` false: without the prompt's ids, which `packed_request` adds)."""
    if request.image_data:
        # The SMG servicers read images only as pixel values a gateway's image processor made
        # (`MultimodalInputs.pixel_values`); `image_urls` is read only by an encoder-disaggregated
        # deployment. Sent as URLs they would be dropped silently.
        raise EngineInvalidArgument("the SMG API takes no image URLs: serve image input from the native API")
    message = pb.GenerateRequest(
        request_id=request.rid,
        tokenized=pb.TokenizedInput(original_text=request.original_text, input_ids=request.input_ids if ids else ()),
        sampling_params=sampling_params(request.sampling),
        return_logprob=request.return_logprob,
        logprob_start_len=request.logprob_start_len,
        top_logprobs_num=request.top_logprobs_num,
        stream=request.stream,
    )
    if request.routed_dp_rank is not None:
        message.data_parallel_rank = request.routed_dp_rank
    if request.bootstrap is not None:
        bootstrap = request.bootstrap
        if not 0 <= bootstrap.room <= MAX_ROOM:
            raise ValueError(f"bootstrap room {bootstrap.room} does not fit the SMG API's int32")
        message.disaggregated_params.bootstrap_host = bootstrap.host
        message.disaggregated_params.bootstrap_port = bootstrap.port
        message.disaggregated_params.bootstrap_room = bootstrap.room
    return message


def embed_request(request: EmbedInput) -> pb.EmbedRequest:
    message = pb.EmbedRequest(
        request_id=request.rid,
        tokenized=pb.TokenizedInput(original_text=request.original_text, input_ids=request.input_ids),
    )
    if request.routed_dp_rank is not None:
        message.data_parallel_rank = request.routed_dp_rank
    return message


def embed_output(reply: pb.EmbedResponse, request: EmbedInput) -> EmbedOutput:
    """The flat `EmbedResponse` (smg-grpc-proto 0.4.6+; errors arrive as gRPC statuses)."""
    return EmbedOutput(list(reply.embedding), reply.prompt_tokens or len(request.input_ids))


class _ChunkDecoder:
    """Accumulates chunk deltas; takes from `complete` only the tail the chunks did not carry."""

    __slots__ = ("received", "finished", "engine", "prompt_rows_seen")

    def __init__(self, engine: str) -> None:
        self.received = 0
        self.finished = False
        self.engine = engine
        self.prompt_rows_seen = False

    def decode(self, message: pb.GenerateResponse) -> GenerateChunk | None:
        kind = message.WhichOneof("response")
        if kind == "chunk":
            chunk = message.chunk
            self.received += len(chunk.token_ids)
            self.prompt_rows_seen = self.prompt_rows_seen or chunk.HasField("input_logprobs")
            return GenerateChunk(
                token_ids=list(chunk.token_ids),
                prompt_tokens=chunk.prompt_tokens,
                completion_tokens=chunk.completion_tokens,
                cached_tokens=chunk.cached_tokens,
                reasoning_tokens=chunk.reasoning_tokens,
                logprobs=output_rows(chunk.output_logprobs) if chunk.HasField("output_logprobs") else None,
                prompt_logprobs=prompt_rows(chunk.input_logprobs) if chunk.HasField("input_logprobs") else None,
            )
        if kind == "complete":
            return self._complete(message.complete)
        _raise_legacy_error(message, self.engine)
        return None

    def _complete(self, complete: pb.GenerateComplete) -> GenerateChunk:
        self.finished = True
        missing = complete.completion_tokens - self.received
        ids = list(complete.output_ids[len(complete.output_ids) - missing :]) if missing > 0 else []
        self.received += len(ids)
        matched = complete.WhichOneof("matched_stop")
        chunk = GenerateChunk(
            token_ids=ids,
            finish_reason=_FINISH_REASONS.get(complete.finish_reason, "stop"),
            matched_stop=getattr(complete, matched) if matched else None,
            prompt_tokens=complete.prompt_tokens,
            completion_tokens=complete.completion_tokens,
            cached_tokens=complete.cached_tokens,
            reasoning_tokens=complete.reasoning_tokens,
        )
        if complete.HasField("output_logprobs") and ids:
            rows = output_rows(complete.output_logprobs)
            chunk.logprobs = rows[len(rows) - len(ids) :]  # the rows of the tail taken from `complete`
        if complete.HasField("input_logprobs") and not self.prompt_rows_seen:
            chunk.prompt_logprobs = prompt_rows(complete.input_logprobs)
        if chunk.finish_reason == "abort":
            chunk.abort_message = "request aborted by the engine"
        return chunk


def _raise_legacy_error(message: pb.GenerateResponse, engine: str) -> None:
    """Old servicers (smg-grpc-proto <= 0.4.5) put `GenerateError{message, http_status_code}` in field 4."""
    for field in unknown_fields.UnknownFieldSet(message):
        if field.field_number == _LEGACY_ERROR_FIELD and field.wire_type == 2:
            parts = {
                f.field_number: f.data for f in unknown_fields.UnknownFieldSet(empty_pb2.Empty.FromString(field.data))
            }
            text = parts.get(1, b"").decode("utf-8", "replace")
            status = parts.get(2, b"").decode("utf-8", "replace")
            raise EngineInternal(f"{text} (http status {status})" if status else text, engine=engine)


def _plain(struct_dict: dict[str, Any]) -> dict[str, Any]:
    """Struct numbers arrive as doubles: give integral ones back as ints (page_size 1.0 -> 1)."""
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in struct_dict.items()}


class SmgEngineClient:
    """An engine reached over the SMG API."""

    api: EngineApi = "smg"

    def __init__(self, channel: EngineChannel) -> None:
        self.channel = channel
        self.name = channel.name
        self.last_output_at = -math.inf

    @asynccontextmanager
    async def generate(self, request: GenerateInput) -> AsyncIterator[ChunkStream]:
        message = packed_request(request, generate_request, _IDS_PATH)
        async with self.channel.open_stream(GENERATE, message, pb.GenerateResponse, timeout=None) as stream:
            yield ChunkStream(stream, _ChunkDecoder(self.name), self.name)

    async def embed(self, request: EmbedInput) -> EmbedOutput:
        reply = await self.channel.unary_work(EMBED, embed_request(request), pb.EmbedResponse, timeout=None)
        return embed_output(reply, request)

    async def connect(self) -> None:
        await self.channel.connect_for_streams()

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool:
        request = pb.AbortRequest(request_id=rid, reason="client disconnected")
        reply = await self.channel.unary(ABORT, request, pb.AbortResponse, timeout=timeout)
        return reply.success

    async def health(self, *, timeout: float = 5.0) -> bool:
        reply = await self.channel.unary(HEALTH_CHECK, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=timeout)
        return reply.healthy

    async def model_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.channel.unary(
            GET_MODEL_INFO, pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout=timeout
        )
        return json_format.MessageToDict(
            reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )

    async def server_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        """Server args and scheduler info flattened into one dict, like the native API's JSON."""
        reply = await self.channel.unary(
            GET_SERVER_INFO, pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=timeout
        )
        info = _plain(json_format.MessageToDict(reply.server_args))
        info.update(_plain(json_format.MessageToDict(reply.scheduler_info)))
        info["server_type"] = reply.server_type
        return info

    async def load(self, dp_rank: int | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]:
        request = pb.GetLoadsRequest() if dp_rank is None else pb.GetLoadsRequest(dp_rank=dp_rank)
        reply = await self.channel.unary(GET_LOADS, request, pb.GetLoadsResponse, timeout=timeout)
        return [
            json_format.MessageToDict(load, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            for load in reply.loads
        ]

    async def flush_cache(self, *, timeout: float = 30.0) -> tuple[bool, str]:
        """Drop the engine's prefix cache (`FlushCache`): (success, the engine's message). The
        engine waits up to `timeout` for its running requests before it gives up."""
        request = common.FlushCacheRequest(timeout_s=timeout)
        reply = await self.channel.unary(FLUSH_CACHE, request, common.FlushCacheResponse, timeout=timeout + 5.0)
        return reply.success, reply.message

    async def tokenizer_archive(self, *, max_bytes: int, timeout: float = 60.0) -> tuple[bytes, str]:
        """The engine's tokenizer folder as a ZIP archive (`GetTokenizer`), and the SHA-256 the
        engine gives for it. `ValueError` when the archive grows past `max_bytes`."""
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
