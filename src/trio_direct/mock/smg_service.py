"""`sglang.grpc.scheduler.SglangScheduler` -- the SMG API -- on top of the mock engine.

Faithful to smg-grpc-servicer 0.14.1 serving sglang 0.5.2x (the ``smg-grpc-servicer`` package on
PyPI), so the
peer gateways (smg, sglang-router) can run against the mock: token ids in, delta chunks out with a
final chunk and then a ``complete`` repeating the last delta, errors as gRPC statuses, prefix
`Abort` that leaves a running stream silent, health probes that run a real one-token generation,
the fallback constants of `GetModelInfo`, and `SubscribeKvEvents` relaying the engine's KV batches
in process. Also `grpc.health.v1.Health`, which the SMG servicer registers.
"""

from __future__ import annotations

import hashlib
import io
import time
import zipfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio
from google.protobuf import struct_pb2, timestamp_pb2
from grpclib.health.v1 import health_pb2

from trio_direct._proto.smg import common_pb2 as common
from trio_direct._proto.smg import sglang_scheduler_pb2 as pb
from trio_direct.engine.transport.server import RpcMethod, ServerCall
from trio_direct.mock.engine import FAKE_BOOTSTRAP_HOST, Bootstrap, EngineInfo, MockEngine
from trio_direct.mock.kv_types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from trio_direct.mock.logprobs import TokenRow, token_rows
from trio_direct.mock.native_service import NOT_A_GENERATION_MODEL, NOT_AN_EMBEDDING_MODEL
from trio_direct.mock.pooling import EmbedSink
from trio_direct.mock.scheduler import Finish, MockRequest, RequestOutput

__all__ = ["HEALTH_SERVICE", "SERVICE", "SGLANG_VERSION", "SmgService", "health_methods"]

SERVICE = "sglang.grpc.scheduler.SglangScheduler"
HEALTH_SERVICE = "grpc.health.v1.Health"
#: The release the mock reports being.
SGLANG_VERSION = "0.5.23"
#: ``SGLANG_HEALTH_CHECK_TIMEOUT``'s default: a probe with no output by then is unhealthy.
HEALTH_CHECK_TIMEOUT = 20.0

# GetModelInfo's fallback constants (servicer 0.4 .. 0.14.1 never reads them from the model).
_FALLBACK_VOCAB_SIZE = 128256
_FALLBACK_PAD_TOKEN_ID = 0
_FALLBACK_BOS_TOKEN_ID = 1

_TOKENIZER_CHUNK = 1 << 20
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "vocab.json",
    "merges.txt",
)

#: smg_grpc_servicer/engine_status.py: HTTP status of a scheduler abort -> gRPC status.
_ABORT_STATUS = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    504: "DEADLINE_EXCEEDED",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


class _Invalid(Exception):
    """A ValueError while converting the request: INVALID_ARGUMENT."""


class SmgService:
    """The SMG API's RPCs as `RpcMethod`s over one `MockEngine`."""

    def __init__(self, engine: MockEngine, info: EngineInfo) -> None:
        self.engine = engine
        self.info = info
        self._calls: dict[str, list[_GenerateCall]] = {}
        self._last_receive = 0.0
        self._probes = 0

    def methods(self) -> list[RpcMethod]:
        handlers: dict[str, Callable[[ServerCall], None]] = {
            "Generate": self._generate,
            "Embed": self._embed,
            "Abort": self._abort,
            "HealthCheck": self._health_check,
            "GetModelInfo": self._get_model_info,
            "GetServerInfo": self._get_server_info,
            "GetLoads": self._get_loads,
            "FlushCache": self._flush_cache,
            "SubscribeKvEvents": self._subscribe_kv_events,
            "GetTokenizer": self._get_tokenizer,
        }
        modules = {pb.DESCRIPTOR.package: pb, common.DESCRIPTOR.package: common}
        service = pb.DESCRIPTOR.services_by_name["SglangScheduler"]
        return [
            RpcMethod(
                f"/{SERVICE}/{method.name}",
                method.server_streaming,
                getattr(modules[method.input_type.file.package], method.input_type.name),
                getattr(modules[method.output_type.file.package], method.output_type.name),
                handlers.get(method.name, _unimplemented),
            )
            for method in service.methods
        ]

    # --- Generate ------------------------------------------------------------------------------

    def _generate(self, call: ServerCall) -> None:
        req: pb.GenerateRequest = call.request
        self._last_receive = time.time()
        if self.info.is_embedding:
            call.fail("INVALID_ARGUMENT", NOT_A_GENERATION_MODEL)
            return
        try:
            requests = self._mock_requests(req)
        except _Invalid as exc:
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        bootstrap = None
        if req.HasField("disaggregated_params"):
            params = req.disaggregated_params
            bootstrap = Bootstrap(params.bootstrap_host, params.bootstrap_port, params.bootstrap_room)
        rids = [request.rid for request in requests]
        sink = _GenerateCall(self.engine, call, req.request_id, rids, req.stream, self._forget)
        if req.return_logprob:
            sink.logprobs = (req.top_logprobs_num, self.info.vocab_size)
            sink.prompt_rows = _input_logprobs(
                requests[0].input_ids, req.logprob_start_len, req.top_logprobs_num, self.info.vocab_size
            )
        self._calls.setdefault(req.request_id, []).append(sink)
        try:
            self.engine.submit(requests, sink, api="smg", bootstrap=bootstrap)
        except ValueError as exc:
            # The scheduler finishes an over-long prompt with FINISH_ABORT(400): INVALID_ARGUMENT.
            self._forget(sink)
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        if not call.done:
            call.on_cancel = sink.cancel

    def _mock_requests(self, req: pb.GenerateRequest) -> list[MockRequest]:
        if not req.HasField("tokenized"):
            raise _Invalid("Tokenized input must be provided")
        if req.return_hidden_states:
            raise _Invalid("return_hidden_states is not supported by this servicer")
        sp = req.sampling_params
        max_new_tokens = sp.max_new_tokens if sp.HasField("max_new_tokens") else None
        n = max(1, sp.n)
        rid = req.request_id
        # The servicer splits n>1 into "<rid>-<i>" (after a prefill-only "<rid>-prefix" the mock skips).
        rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        return [
            MockRequest(
                rid=sample,
                input_ids=list(req.tokenized.input_ids),
                max_new_tokens=max_new_tokens,
                min_new_tokens=sp.min_new_tokens,
                stop_token_ids=frozenset(sp.stop_token_ids),
                ignore_eos=sp.ignore_eos,
                stop_strings=tuple(sp.stop),
                variation=variation,  # the SMG API has no seed
                temperature=sp.temperature,
                script=self.info.scripts.tokens_for(list(req.tokenized.input_ids)) if self.info.scripts else None,
            )
            for sample, variation in zip(rids, self.info.sample_variations(None, n), strict=True)
        ]

    # --- Embed ---------------------------------------------------------------------------------

    def _embed(self, call: ServerCall) -> None:
        """A prefill-only scheduler request whose end answers the flat `EmbedResponse` (0.4.6+)."""
        req: pb.EmbedRequest = call.request
        self._last_receive = time.time()
        if not req.HasField("tokenized"):
            call.fail("INVALID_ARGUMENT", "Tokenized input must be provided")
            return
        if not self.info.is_embedding:
            call.fail("INVALID_ARGUMENT", NOT_AN_EMBEDDING_MODEL)
            return
        rid = req.request_id
        input_ids = list(req.tokenized.input_ids)

        def reply(vector: list[float], prompt_tokens: int) -> None:
            _reply(call, pb.EmbedResponse(embedding=vector, embedding_dim=len(vector), prompt_tokens=prompt_tokens))

        sink = EmbedSink(input_ids, self.info.embedding_dim, reply, call.fail)
        request = MockRequest(rid=rid, input_ids=input_ids, max_new_tokens=0, temperature=0.0)
        try:
            self.engine.submit([request], sink, api="smg")
        except ValueError as exc:
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        if not call.done:
            call.on_cancel = lambda: self.engine.cancel([rid])

    def _forget(self, sink: _GenerateCall) -> None:
        calls = self._calls.get(sink.request_id)
        if calls is not None and sink in calls:
            calls.remove(sink)
            if not calls:
                del self._calls[sink.request_id]

    # --- control -------------------------------------------------------------------------------

    def _abort(self, call: ServerCall) -> None:
        rid = call.request.request_id
        if rid.startswith("HEALTH_CHECK"):
            _reply(call, pb.AbortResponse(success=False, message=f"Request {rid} is a health check"))
            return
        # The servicer marks the request finished locally first: its stream gets nothing more.
        for sink in list(self._calls.get(rid, ())):
            sink.silence()
        self.engine.abort(rid, exact_first=False)
        _reply(call, pb.AbortResponse(success=True, message=f"Request {rid} aborted"))

    def _health_check(self, call: ServerCall) -> None:
        if self.engine.shutting_down:
            _reply(call, pb.HealthCheckResponse(healthy=False, message="Server is shutting down"))
            return
        self._probes += 1
        rid = f"HEALTH_CHECK_{time.time():.6f}_{self._probes}"
        probe = _HealthProbe(self.engine, call, rid)
        bootstrap = Bootstrap(FAKE_BOOTSTRAP_HOST, 0, 0) if self.engine.role != "aggregated" else None
        # An embedding model's probe is an embedding (prefill only), as the servicer's is.
        probe_tokens = 0 if self.info.is_embedding else 1
        request = MockRequest(rid=rid, input_ids=[0], max_new_tokens=probe_tokens, temperature=0.0)
        try:
            self.engine.submit([request], probe, api="smg", bootstrap=bootstrap)
        except ValueError as exc:
            _reply(call, pb.HealthCheckResponse(healthy=False, message=str(exc)))
            return
        if not call.done:
            call.on_cancel = probe.cancel
            self.engine.spawn(probe.expire, HEALTH_CHECK_TIMEOUT)

    def _flush_cache(self, call: ServerCall) -> None:
        if self.engine.flush_cache():
            _reply(call, common.FlushCacheResponse(success=True, message="Cache flushed successfully."))
        else:
            message = "Cache not flushed because there are pending requests."
            _reply(call, common.FlushCacheResponse(success=False, message=message))

    # --- info ----------------------------------------------------------------------------------

    def _get_model_info(self, call: ServerCall) -> None:
        info = self.info
        _reply(
            call,
            pb.GetModelInfoResponse(
                model_path=info.model_path,
                tokenizer_path=info.tokenizer_path,
                is_generation=not info.is_embedding,
                preferred_sampling_params="",
                weight_version="default",
                served_model_name=info.served_model_name,
                # Quirk kept from the servicer: the KV pool size, not the model's context.
                max_context_length=info.max_total_num_tokens,
                vocab_size=_FALLBACK_VOCAB_SIZE,
                supports_vision=False,
                model_type=info.model_type,
                eos_token_ids=[],
                pad_token_id=_FALLBACK_PAD_TOKEN_ID,
                bos_token_id=_FALLBACK_BOS_TOKEN_ID,
                max_req_input_len=info.max_req_input_len,
                architectures=info.architectures,
            ),
        )

    def _get_server_info(self, call: ServerCall) -> None:
        info = self.info
        server_args = struct_pb2.Struct()
        server_args.update(info.server_args)
        scheduler_info = struct_pb2.Struct()
        scheduler_info.update(info.scheduler_info)
        start = timestamp_pb2.Timestamp()
        start.FromNanoseconds(info.start_ns)
        _reply(
            call,
            pb.GetServerInfoResponse(
                server_args=server_args,
                scheduler_info=scheduler_info,
                active_requests=self.engine.live_requests,
                is_paused=False,
                last_receive_timestamp=self._last_receive,
                uptime_seconds=time.time() - info.start_time,
                sglang_version=SGLANG_VERSION,
                server_type="grpc",
                start_time=start,
                max_total_num_tokens=info.max_total_num_tokens,
            ),
        )

    def _get_loads(self, call: ServerCall) -> None:
        req: pb.GetLoadsRequest = call.request
        include = set(req.include) or {"all"}
        every = "all" in include
        mode = self.info.disaggregation_mode
        loads = []
        for rank, core in enumerate(self.engine.loads()):
            running = int(core.get("num_running_reqs", 0))
            waiting = int(core.get("num_waiting_reqs", 0))
            load = pb.SchedulerLoad(
                dp_rank=rank,
                num_running_reqs=running,
                num_waiting_reqs=waiting,
                num_total_reqs=running + waiting,
                num_used_tokens=int(core.get("num_used_tokens", 0)),
                max_total_num_tokens=self.info.max_total_num_tokens,
                token_usage=float(core.get("token_usage", 0.0)),
                gen_throughput=float(core.get("gen_throughput", 0.0)),
                cache_hit_rate=float(core.get("cache_hit_rate", 0.0)),
                utilization=float(core.get("utilization", 0.0)),
                max_running_requests=int(core.get("max_running_requests", 0)),
                num_waiting_uncached_tokens=int(core.get("num_waiting_uncached_tokens", 0)),
            )
            if every or "memory" in include:
                load.memory.CopyFrom(pb.MemoryMetrics(token_capacity=self.info.max_total_num_tokens))
            if every or "queues" in include:
                load.queues.CopyFrom(pb.QueueMetrics(waiting=waiting))
            if (every or "disagg" in include) and mode != "null":
                load.disaggregation.CopyFrom(pb.DisaggregationMetrics(mode=mode))
            loads.append(load)
        if req.HasField("dp_rank"):
            loads = [loads[req.dp_rank]] if 0 <= req.dp_rank < len(loads) else []
        count = len(loads) or 1
        aggregate = pb.AggregateMetrics(
            total_running_reqs=sum(load.num_running_reqs for load in loads),
            total_waiting_reqs=sum(load.num_waiting_reqs for load in loads),
            total_reqs=sum(load.num_total_reqs for load in loads),
            avg_token_usage=sum(load.token_usage for load in loads) / count,
            avg_throughput=sum(load.gen_throughput for load in loads) / count,
            avg_utilization=sum(load.utilization for load in loads) / count,
        )
        _reply(
            call,
            pb.GetLoadsResponse(
                timestamp=datetime.now(UTC).isoformat(),
                version=SGLANG_VERSION,
                dp_rank_count=self.engine.dp_size,
                loads=loads,
                aggregate=aggregate,
            ),
        )

    def _get_tokenizer(self, call: ServerCall) -> None:
        for chunk in tokenizer_chunks(Path(self.info.model_directory or self.info.tokenizer_path)):
            call.send(chunk)
        call.finish()

    # --- KV events -----------------------------------------------------------------------------

    def _subscribe_kv_events(self, call: ServerCall) -> None:
        req: common.SubscribeKvEventsRequest = call.request
        if not self.engine.has_kv_publisher:
            call.fail("UNIMPLEMENTED", "KV events are not enabled on this engine (--kv-events-config)")
            return
        if req.start_sequence_number != 0:
            call.fail("OUT_OF_RANGE", "Only live subscriptions are supported (start_sequence_number must be 0)")
            return
        relay = _KvRelay(call)
        call.on_cancel = self.engine.add_kv_listener(relay.batch)
        if req.load_records_before_first_batch:
            # The servicer answers at once with each rank's load (smg gives up on a silent stream).
            for rank, load in enumerate(self.engine.loads()):
                record = common.EngineLoad(
                    running_requests=int(load.get("num_running_reqs", 0)),
                    waiting_requests=int(load.get("num_waiting_reqs", 0)),
                    token_usage=float(load.get("token_usage", 0.0)),
                    max_running_requests=int(load.get("max_running_requests", 0)),
                    load_only=True,
                )
                call.send(common.KvEventBatch(timestamp=time.time(), dp_rank=rank, load=record))


class _GenerateCall:
    """One SMG Generate call: chunks and completes per sample ``index``."""

    __slots__ = (
        "_call",
        "_completes",
        "_engine",
        "_finished",
        "_ids",
        "_index",
        "_last",
        "_on_end",
        "_rows",
        "_silenced",
        "_stream",
        "_unsent_prompt_rows",
        "logprobs",
        "prompt_rows",
        "request_id",
    )

    def __init__(
        self,
        engine: MockEngine,
        call: ServerCall,
        request_id: str,
        sample_rids: list[str],
        stream: bool,
        on_end: Callable[[_GenerateCall], None],
    ) -> None:
        self.request_id = request_id
        self._engine = engine
        self._call = call
        self._index = {rid: i for i, rid in enumerate(sample_rids)}
        self._ids: dict[str, list[int]] = {rid: [] for rid in sample_rids}
        self._last: dict[str, RequestOutput] = {}
        self._completes: dict[int, pb.GenerateComplete] = {}
        self._finished: set[str] = set()
        self._stream = stream
        self._silenced = False
        self._on_end = on_end
        #: (top_n, vocab size) when the request asked for logprobs.
        self.logprobs: tuple[int, int] | None = None
        self._rows: dict[str, list[TokenRow]] = {rid: [] for rid in sample_rids}
        #: The prompt's rows from `logprob_start_len` when the request asked for them.
        self.prompt_rows: pb.InputLogProbs | None = None
        self._unsent_prompt_rows = set(sample_rids)

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        call = self._call
        if call.done or self._silenced:
            return
        finish = out.finish
        if finish is not None and finish.kind == "abort" and finish.status_code is not None:
            self._end_others(out.rid)
            self._end()
            call.fail(_ABORT_STATUS.get(finish.status_code, "INTERNAL"), finish.message or "Request aborted")
            return
        rid = out.rid
        index = self._index[rid]
        self._ids[rid].extend(out.new_token_ids)
        self._last[rid] = out
        rows = None
        if self.logprobs is not None:
            rows = token_rows(out.new_token_ids, *self.logprobs)
            self._rows[rid].extend(rows)
        # A stream's first chunk per sample carries the prompt's rows, and so does the `complete` built
        # from that same output (a one-step request); a `complete` that is not streamed always does.
        first_output = rid in self._unsent_prompt_rows
        self._unsent_prompt_rows.discard(rid)
        prompt_rows = self.prompt_rows if first_output or not self._stream else None
        if self._stream:
            chunk = pb.GenerateStreamChunk(
                token_ids=out.new_token_ids,
                prompt_tokens=out.prompt_tokens,
                completion_tokens=out.completion_tokens,
                cached_tokens=out.cached_tokens,
                index=index,
            )
            if rows is not None:
                chunk.output_logprobs.CopyFrom(_output_logprobs(rows))
            if prompt_rows is not None:
                chunk.input_logprobs.CopyFrom(prompt_rows)
            call.send(pb.GenerateResponse(request_id=self.request_id, chunk=chunk))
            if finish is not None:
                complete = _complete(out, finish, out.new_token_ids, index)
                if rows is not None:  # the servicer repeats the last chunk's rows
                    complete.output_logprobs.CopyFrom(_output_logprobs(rows))
                if prompt_rows is not None:
                    complete.input_logprobs.CopyFrom(prompt_rows)
                call.send(pb.GenerateResponse(request_id=self.request_id, complete=complete))
        elif finish is not None:
            self._completes[index] = _complete(out, finish, self._ids[rid], index)
            if self.logprobs is not None:
                self._completes[index].output_logprobs.CopyFrom(_output_logprobs(self._rows[rid]))
            if prompt_rows is not None:
                self._completes[index].input_logprobs.CopyFrom(prompt_rows)
        if finish is not None:
            self._finished.add(rid)
            if len(self._finished) == len(self._ids):
                for i in sorted(self._completes):  # non-stream: one complete per index
                    call.send(pb.GenerateResponse(request_id=self.request_id, complete=self._completes[i]))
                self._end()
                call.finish()

    def aborted(self, rid: str) -> None:
        # Caught by a prefix or abort-all cascade: an ordinary output with finish "abort".
        last = self._last.get(rid)
        prompt, completion, cached = (
            (last.prompt_tokens, last.completion_tokens, last.cached_tokens) if last else (0, 0, 0)
        )
        self.output(RequestOutput(rid, [], Finish("abort"), prompt, completion, cached), 0)

    def silence(self) -> None:
        """Abort named this request: nothing more is sent and the call ends OK."""
        self._silenced = True
        self._end()
        self._call.finish()

    def cancel(self) -> None:
        self._end()
        self._engine.cancel([rid for rid in self._ids if rid not in self._finished])

    def _end_others(self, rid: str) -> None:
        others = [other for other in self._ids if other != rid and other not in self._finished]
        if others:
            self._engine.cancel(others)

    def _end(self) -> None:
        self._on_end(self)


class _HealthProbe:
    """The servicer's HealthCheck: healthy as soon as the one-token probe produces output."""

    __slots__ = ("_answered", "_call", "_engine", "_rid")

    def __init__(self, engine: MockEngine, call: ServerCall, rid: str) -> None:
        self._engine = engine
        self._call = call
        self._rid = rid
        self._answered = trio.Event()

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        self._answer(True, "Health check passed")

    def aborted(self, rid: str) -> None:
        self._answer(False, "Health check request was aborted")

    def cancel(self) -> None:
        self._answered.set()
        self._engine.cancel([self._rid])

    async def expire(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            await self._answered.wait()
        if not self._answered.is_set():
            self._answer(False, f"Health check timed out after {timeout:g}s")
            self._engine.cancel([self._rid])

    def _answer(self, healthy: bool, message: str) -> None:
        if self._answered.is_set():
            return
        self._answered.set()
        _reply(self._call, pb.HealthCheckResponse(healthy=healthy, message=message))


class _KvRelay:
    """One SubscribeKvEvents stream: every rank's batches, one `KvBlock` per stored hash."""

    __slots__ = ("_call", "_event_id")

    def __init__(self, call: ServerCall) -> None:
        self._call = call
        self._event_id = 0

    def batch(self, dp_rank: int, seq: int, ts: float, events: Sequence[KvEvent]) -> None:
        converted = []
        for event in events:
            self._event_id += 1
            converted.append(kv_event(self._event_id, event))
        self._call.send(common.KvEventBatch(sequence_number=seq, timestamp=ts, events=converted, dp_rank=dp_rank))


def tokenizer_chunks(directory: Path) -> list[common.GetTokenizerChunk]:
    """`GetTokenizer`'s answer: the tokenizer files zipped, in 1 MiB chunks, the last with the SHA-256."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in _TOKENIZER_FILES:
            if (directory / name).is_file():
                archive.write(directory / name, name)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    chunks = [data[i : i + _TOKENIZER_CHUNK] for i in range(0, len(data), _TOKENIZER_CHUNK)] or [b""]
    return [
        common.GetTokenizerChunk(data=chunk, sha256=digest if i == len(chunks) - 1 else "")
        for i, chunk in enumerate(chunks)
    ]


def kv_event(event_id: int, event: KvEvent) -> common.KvCacheEvent:
    """One mock KV event as the SMG family's `KvCacheEvent` (one `KvBlock` per stored hash)."""
    if isinstance(event, BlockStored):
        size = event.block_size
        blocks = [
            common.KvBlock(block_hash=h, token_ids=event.token_ids[i * size : (i + 1) * size], block_size=size)
            for i, h in enumerate(event.block_hashes)
        ]
        stored = common.KvBlocksStored(blocks=blocks, tier=common.KV_CACHE_TIER_DEVICE, medium="GPU")
        if event.parent_block_hash is not None:
            stored.parent_block_hash = event.parent_block_hash
        return common.KvCacheEvent(event_id=event_id, stored=stored)
    if isinstance(event, BlockRemoved):
        removed = common.KvBlocksRemoved(
            block_hashes=event.block_hashes, tier=common.KV_CACHE_TIER_DEVICE, medium="GPU"
        )
        return common.KvCacheEvent(event_id=event_id, removed=removed)
    if isinstance(event, AllBlocksCleared):
        return common.KvCacheEvent(event_id=event_id, cleared=common.KvCacheCleared())
    raise TypeError(f"not a KV event: {event!r}")


def _output_logprobs(rows: list[TokenRow]) -> pb.OutputLogProbs:
    return pb.OutputLogProbs(
        token_logprobs=[lp for lp, _, _ in rows],
        token_ids=[token for _, token, _ in rows],
        top_logprobs=[
            pb.TopLogProbs(values=[lp for lp, _ in top], token_ids=[t for _, t in top]) for _, _, top in rows
        ],
    )


def _input_logprobs(prompt_ids: Sequence[int], start: int, top_n: int, vocab_size: int) -> pb.InputLogProbs | None:
    """SGLang's prompt rows: one per prompt token from ``start`` (None for -1, the default); the
    prompt's first token has no value (nothing precedes it) and no alternatives."""
    if start < 0 or start >= len(prompt_ids):
        return None
    rows = token_rows(list(prompt_ids[start:]), top_n, vocab_size)
    message = pb.InputLogProbs(token_ids=[token for _, token, _ in rows])
    for i, (lp, _, top) in enumerate(rows):
        first = start == 0 and i == 0
        message.token_logprobs.append(pb.InputTokenLogProb() if first else pb.InputTokenLogProb(value=lp))
        if top_n > 0:
            alternatives = [] if first else top
            message.top_logprobs.append(
                pb.TopLogProbs(values=[v for v, _ in alternatives], token_ids=[t for _, t in alternatives])
            )
    return message


def _complete(out: RequestOutput, finish: Finish, ids: Sequence[int], index: int) -> pb.GenerateComplete:
    reason = {"length": "length", "abort": "abort"}.get(finish.kind, "stop")
    complete = pb.GenerateComplete(
        output_ids=ids,
        finish_reason=reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        index=index,
    )
    if finish.kind == "stop":
        if isinstance(finish.matched, str):
            complete.matched_stop_str = finish.matched
        elif isinstance(finish.matched, int):
            complete.matched_token_id = finish.matched
    return complete


# --- grpc.health.v1 ----------------------------------------------------------------------------


def health_methods(services: Sequence[str] = ("", SERVICE)) -> list[RpcMethod]:
    """`grpc.health.v1.Health` reporting SERVING for ``services``, NOT_FOUND for others."""
    serving = frozenset(services)
    status = health_pb2.HealthCheckResponse

    def check(call: ServerCall) -> None:
        if call.request.service in serving:
            _reply(call, status(status=status.SERVING))
        else:
            call.fail("NOT_FOUND", "unknown service")

    def watch(call: ServerCall) -> None:
        known = call.request.service in serving
        call.send(status(status=status.SERVING if known else status.SERVICE_UNKNOWN))

    path = f"/{HEALTH_SERVICE}"
    return [
        RpcMethod(f"{path}/Check", False, health_pb2.HealthCheckRequest, status, check),
        RpcMethod(f"{path}/Watch", True, health_pb2.HealthCheckRequest, status, watch),
    ]


def _reply(call: ServerCall, message: Any) -> None:
    call.send(message)
    call.finish()


def _unimplemented(call: ServerCall) -> None:
    call.fail("UNIMPLEMENTED", "")
