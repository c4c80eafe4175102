"""Adapter for SGLang's native gRPC API (`sglang.runtime.v1.SglangService`, `--grpc-port`).

What sglang 0.5.23's gRPC servicer (``python/sglang/srt/entrypoints/grpc_bridge.py``) sends: every
`meta_info` value is a JSON document
(Python ``json.dumps``, so ``NaN``/``Infinity`` may appear: decode leniently with ``json.loads``);
`output_ids` are cumulative unless the engine runs with ``--incremental-streaming-output``;
`finished` is true only on the last message.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.chunk_stream import ChunkStream
from trio_direct.engine.packed_ids import packed_request
from trio_direct.engine.transport import EngineChannel
from trio_direct.engine.types import (
    EmbedInput,
    EmbedOutput,
    EngineApi,
    GenerateChunk,
    GenerateInput,
    SamplingOptions,
    TokenLogprob,
)

log = logging.getLogger(__name__)

_SERVICE = "/sglang.runtime.v1.SglangService/"
GENERATE = _SERVICE + "Generate"
EMBED = _SERVICE + "Embed"
ABORT = _SERVICE + "Abort"
HEALTH_CHECK = _SERVICE + "HealthCheck"
GET_MODEL_INFO = _SERVICE + "GetModelInfo"
GET_SERVER_INFO = _SERVICE + "GetServerInfo"
GET_LOAD = _SERVICE + "GetLoad"
FLUSH_CACHE = _SERVICE + "FlushCache"

_OPTIONAL_SAMPLING = (
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "max_new_tokens", "min_new_tokens", "ignore_eos", "json_schema", "regex",
)  # fmt: skip


def sampling_params(options: SamplingOptions) -> pb.SamplingParams:
    """Only what is set goes on the wire: the engine applies its own defaults to the rest."""
    params = pb.SamplingParams()
    for name in _OPTIONAL_SAMPLING:
        value = getattr(options, name)
        if value is not None:
            setattr(params, name, value)
    if options.seed is not None:
        params.seed = options.seed
    if options.stop:
        params.stop.extend(options.stop)
    if options.stop_token_ids:
        params.stop_token_ids.extend(options.stop_token_ids)
    if options.ebnf is not None:
        params.guided_decoding.ebnf = options.ebnf
    elif options.structural_tag is not None:
        params.guided_decoding.structural_tag = options.structural_tag
    return params


#: Where `GenerateRequest` holds the prompt's ids: its own field.
_IDS_PATH = (pb.GenerateRequest.DESCRIPTOR.fields_by_name["input_ids"].number,)


def generate_request(request: GenerateInput, *, ids: bool = True) -> pb.GenerateRequest:
    """The wire request (`ids` false: without the prompt's ids, which `packed_request` adds)."""
    message = pb.GenerateRequest(
        input_ids=request.input_ids if ids else (),
        sampling_params=sampling_params(request.sampling),
        stream=request.stream,
        rid=request.rid,
    )
    if request.return_logprob:
        message.return_logprob = True
        message.top_logprobs_num = request.top_logprobs_num
        message.logprob_start_len = request.logprob_start_len
    if request.routed_dp_rank is not None:
        message.routed_dp_rank = request.routed_dp_rank
    if request.image_data:
        message.image_data.extend(request.image_data)
    if request.priority is not None:
        message.priority = request.priority
    if request.trace_headers:
        message.trace_headers.update(request.trace_headers)
    if request.bootstrap is not None:
        bootstrap = request.bootstrap
        message.disaggregated_params.bootstrap_host = bootstrap.host
        message.disaggregated_params.bootstrap_port = bootstrap.port
        message.disaggregated_params.bootstrap_room = bootstrap.room
    return message


def embed_request(request: EmbedInput) -> pb.EmbedRequest:
    """The native `EmbedRequest` has no DP-rank field: the engine places the request itself."""
    return pb.EmbedRequest(input_ids=request.input_ids, rid=request.rid)


def embed_output(reply: pb.EmbedResponse, request: EmbedInput) -> EmbedOutput:
    """`prompt_tokens` from `meta_info` (a JSON document, as for generation), else the input length."""
    prompt_tokens = _count(reply.meta_info.get("prompt_tokens")) or len(request.input_ids)
    return EmbedOutput(list(reply.embedding), prompt_tokens)


def decode_meta_info(meta_info: Any) -> dict[str, Any]:
    """JSON-decode every value; a value that is not JSON is kept as its raw string."""
    decoded = {}
    for key, raw in meta_info.items():
        try:
            decoded[key] = json.loads(raw)
        except ValueError:
            decoded[key] = raw
    return decoded


class _ChunkDecoder:
    """Turns one call's messages into delta chunks, converting cumulative `output_ids` if needed."""

    __slots__ = ("cumulative", "seen", "logprobs_seen", "finished", "prompt_rows_seen")

    def __init__(self, cumulative: bool) -> None:
        self.cumulative = cumulative
        self.seen = 0
        self.logprobs_seen = 0
        self.finished = False
        self.prompt_rows_seen = False

    def _logprobs(self, raw_tokens: str, raw_top: str | None) -> list[TokenLogprob]:
        rows = _logprob_rows(raw_tokens, raw_top)
        if self.cumulative:  # the lists repeat every row so far, like output_ids
            rows = rows[self.logprobs_seen :]
        self.logprobs_seen += len(rows)
        return rows

    def decode(self, message: pb.GenerateResponse) -> GenerateChunk | None:
        # Called once per engine message: slicing the repeated field makes the list in C, and the
        # counts (plain digits from SGLang) are parsed inline, `_count` only for anything else.
        ids = message.output_ids[self.seen :] if self.cumulative else message.output_ids[:]
        self.seen += len(ids)
        meta = message.meta_info
        if not meta:
            chunk = GenerateChunk(ids)
        else:  # only the keys a router reads, decoded without a JSON parse per value
            # `key in meta` and `meta[key]` cost half what `meta.get(key)` does on protobuf's map
            # (which parses its arguments as keywords): ~1.4 µs less per message (hence the noqa).
            prompt = meta["prompt_tokens"] if "prompt_tokens" in meta else None  # noqa: SIM401
            completion = meta["completion_tokens"] if "completion_tokens" in meta else None  # noqa: SIM401
            cached = meta["cached_tokens"] if "cached_tokens" in meta else None  # noqa: SIM401
            reasoning = meta["reasoning_tokens"] if "reasoning_tokens" in meta else None  # noqa: SIM401
            rank = meta["dp_rank"] if "dp_rank" in meta else None  # noqa: SIM401
            chunk = GenerateChunk(
                ids,
                None,
                None,
                int(prompt) if prompt is not None and prompt.isdecimal() else _count(prompt),
                int(completion) if completion is not None and completion.isdecimal() else _count(completion),
                int(cached) if cached is not None and cached.isdecimal() else _count(cached),
                int(reasoning) if reasoning is not None and reasoning.isdecimal() else _count(reasoning),
                None if rank is None or rank == "null" else _count(rank),
            )
            finish = meta["finish_reason"] if "finish_reason" in meta else None  # noqa: SIM401
            if finish is not None and finish != "null":
                _apply_finish(chunk, _lenient_json(finish))
            if "output_token_logprobs" in meta:
                chunk.logprobs = self._logprobs(meta["output_token_logprobs"], meta.get("output_top_logprobs"))
            if "input_token_logprobs" in meta and not self.prompt_rows_seen:  # cumulative streams repeat them
                self.prompt_rows_seen = True
                chunk.prompt_logprobs = _logprob_rows(meta["input_token_logprobs"], meta.get("input_top_logprobs"))
        if message.finished:
            self.finished = True
            if chunk.finish_reason is None:
                # The engine's generator ended without a finish chunk (its stream just closed).
                chunk.finish_reason = "stop"
        return chunk


def _logprob_rows(raw_tokens: str, raw_top: str | None) -> list[TokenLogprob]:
    """SGLang's ``[logprob, token_id, text]`` rows (and per-token top lists) as `TokenLogprob`s."""
    tokens = _lenient_json(raw_tokens) or []
    tops = (_lenient_json(raw_top) if raw_top else None) or [None] * len(tokens)
    rows = []
    for (logprob, token_id, *_), top in zip(tokens, tops, strict=False):
        alternatives = tuple((entry[1], entry[0]) for entry in top or ())
        rows.append(TokenLogprob(token_id, logprob, alternatives))
    return rows


def _count(raw: str | None) -> int:
    """An integer `meta_info` value (JSON text); anything else counts as 0."""
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        value = _lenient_json(raw)
        return int(value) if isinstance(value, (int, float)) and value == value and abs(value) != float("inf") else 0


def _lenient_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _apply_finish(chunk: GenerateChunk, finish: Any) -> None:
    if not isinstance(finish, dict):
        return
    kind = finish.get("type")
    if kind == "stop":
        chunk.finish_reason = "stop"
        # JSON from the engine: a token id (SGLang may wrap it in a list) or a stop string; not checked
        matched: Any = finish.get("matched")
        chunk.matched_stop = matched[0] if isinstance(matched, list) and matched else matched
    elif kind == "length":
        chunk.finish_reason = "length"
    elif kind == "abort":
        chunk.finish_reason = "abort"
        chunk.abort_message = finish.get("message")
        chunk.abort_status_code = finish.get("status_code")


class NativeEngineClient:
    """An engine reached over the native API.

    `incremental` is the engine's ``incremental_streaming_output`` (from the probe). When unknown it
    is read from GetServerInfo on first use; a cumulative engine is converted to deltas and logged
    once, because it costs O(n²) bytes over a long stream.
    """

    api: EngineApi = "native"

    def __init__(self, channel: EngineChannel, *, incremental: bool | None = None) -> None:
        self.channel = channel
        self.name = channel.name
        self.incremental = incremental
        self._warned_cumulative = False
        self.last_output_at = -math.inf

    @asynccontextmanager
    async def generate(self, request: GenerateInput) -> AsyncIterator[ChunkStream]:
        if self.incremental is None:
            self.incremental = bool((await self.server_info()).get("incremental_streaming_output"))
        cumulative = request.stream and not self.incremental
        if cumulative and not self._warned_cumulative:
            self._warned_cumulative = True
            log.warning(
                "engine %s streams cumulative output_ids; run it with --incremental-streaming-output",
                self.name,
            )
        message = packed_request(request, generate_request, _IDS_PATH)
        async with self.channel.open_stream(GENERATE, message, pb.GenerateResponse, timeout=None) as stream:
            yield ChunkStream(stream, _ChunkDecoder(cumulative), self.name)

    async def embed(self, request: EmbedInput) -> EmbedOutput:
        reply = await self.channel.unary_work(EMBED, embed_request(request), pb.EmbedResponse, timeout=None)
        return embed_output(reply, request)

    async def connect(self) -> None:
        await self.channel.connect_for_streams()

    async def abort(self, rid: str, *, timeout: float = 5.0) -> bool:
        reply = await self.channel.unary(ABORT, pb.AbortRequest(rid=rid), pb.AbortResponse, timeout=timeout)
        return reply.success

    async def health(self, *, timeout: float = 5.0) -> bool:
        reply = await self.channel.unary(HEALTH_CHECK, pb.HealthCheckRequest(), pb.HealthCheckResponse, timeout=timeout)
        return reply.healthy

    async def model_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.channel.unary(
            GET_MODEL_INFO, pb.GetModelInfoRequest(), pb.GetModelInfoResponse, timeout=timeout
        )
        info = json.loads(reply.json_info) if reply.json_info else {}
        info.setdefault("model_path", reply.model_path)
        return info

    async def server_info(self, *, timeout: float = 10.0) -> dict[str, Any]:
        reply = await self.channel.unary(
            GET_SERVER_INFO, pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=timeout
        )
        return json.loads(reply.json_info) if reply.json_info else {}

    async def load(self, dp_rank: int | None = None, *, timeout: float = 5.0) -> list[dict[str, Any]]:
        request = pb.GetLoadRequest() if dp_rank is None else pb.GetLoadRequest(dp_rank=dp_rank)
        reply = await self.channel.unary(GET_LOAD, request, pb.GetLoadResponse, timeout=timeout)
        loads = json.loads(reply.json_info) if reply.json_info else []
        return loads if isinstance(loads, list) else [loads]

    async def flush_cache(self, *, timeout: float = 30.0) -> tuple[bool, str]:
        """Drop the engine's prefix cache (`FlushCache`): (success, the engine's message). The
        native request has no wait: an engine with requests running declines."""
        reply = await self.channel.unary(FLUSH_CACHE, pb.FlushCacheRequest(), pb.FlushCacheResponse, timeout=timeout)
        return reply.success, reply.message
