"""`sglang.runtime.v1.SglangService` -- the native gRPC API -- on top of the mock engine.

Faithful to what the shipped sglang 0.5.23 server puts on the wire (its gRPC bridge,
``python/sglang/srt/entrypoints/grpc_bridge.py``):
`meta_info` values are Python ``json.dumps`` documents, streams are cumulative unless the engine
runs with ``--incremental-streaming-output``, ``finished`` is true only on a call's last message,
an `Abort` ends a live stream with ``CANCELLED "Request aborted: <rid>"`` and a client cancel
aborts the request in the scheduler. Handlers are synchronous (`ServerCall`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.engine.transport.server import RpcMethod, ServerCall
from trio_direct.mock.engine import Bootstrap, EngineInfo, MockEngine, record_request
from trio_direct.mock.logprobs import TokenRow, token_rows
from trio_direct.mock.pooling import EmbedSink, image_prompt_tokens
from trio_direct.mock.scheduler import Finish, MockRequest, RequestOutput

__all__ = [
    "NOT_AN_EMBEDDING_MODEL",
    "NOT_A_GENERATION_MODEL",
    "NO_IMAGE_INPUT",
    "SERVICE",
    "NativeService",
    "finish_reason_json",
    "grpc_features",
]

SERVICE = "sglang.runtime.v1.SglangService"

#: SGLang's ``SamplingParams.max_new_tokens`` default, used when a request sets none.
DEFAULT_MAX_NEW_TOKENS = 128


class _Invalid(Exception):
    """A request-shape error: INVALID_ARGUMENT with SGLang's message."""


class _Internal(Exception):
    """An engine-side refusal: INTERNAL with the exception text, as the Rust bridge maps it."""


def grpc_features(multimodal: bool = False) -> dict[str, list[str]]:
    """0.5.23's ``grpc_features``: no media, or with ``--multimodal`` images as URLs and data URLs."""
    images = ["url", "data_url"] if multimodal else []
    return {"image_inputs": images, "video_inputs": [], "audio_inputs": []}


#: SGLang's refusal of an embedding request to a generation model.
NOT_AN_EMBEDDING_MODEL = (
    "This model does not appear to be an embedding model by default. "
    "Please add `--is-embedding` when launching the server or try another model."
)
#: The mock's refusal of a generation request to an embedding model.
NOT_A_GENERATION_MODEL = "This model is an embedding model (--is-embedding): it does not generate."
#: The mock's refusal of images sent to an engine without ``--multimodal``.
NO_IMAGE_INPUT = "This model does not accept image input."


def finish_reason_json(finish: Finish | None) -> dict[str, Any] | None:
    """SGLang's ``finish_reason`` shapes (§6.3)."""
    if finish is None:
        return None
    if finish.kind == "stop":
        return {"type": "stop", "matched": finish.matched}
    if finish.kind == "length":
        return {"type": "length", "length": finish.length}
    return {"type": "abort", "message": finish.message, "status_code": finish.status_code, "err_type": None}


class NativeService:
    """The native API's RPCs as `RpcMethod`s over one `MockEngine`."""

    def __init__(self, engine: MockEngine, info: EngineInfo) -> None:
        self.engine = engine
        self.info = info

    def methods(self) -> list[RpcMethod]:
        handlers: dict[str, Callable[[ServerCall], None]] = {
            "Generate": self._generate,
            "Embed": self._embed,
            "Abort": self._abort,
            "HealthCheck": self._health_check,
            "GetModelInfo": self._get_model_info,
            "GetServerInfo": self._get_server_info,
            "GetLoad": self._get_load,
            "ListModels": self._list_models,
            "FlushCache": self._flush_cache,
            "WatchEngineState": self._watch_engine_state,
        }
        if self.info.tokenizer is not None:
            handlers["Tokenize"] = self._tokenize
            handlers["Detokenize"] = self._detokenize
        service = pb.DESCRIPTOR.services_by_name["SglangService"]
        return [
            RpcMethod(
                f"/{SERVICE}/{method.name}",
                method.server_streaming,
                getattr(pb, method.input_type.name),
                getattr(pb, method.output_type.name),
                handlers.get(method.name, _unimplemented),
            )
            for method in service.methods
        ]

    # --- Generate ------------------------------------------------------------------------------

    def _generate(self, call: ServerCall) -> None:
        req: pb.GenerateRequest = call.request
        if self.info.is_embedding:
            call.fail("INVALID_ARGUMENT", NOT_A_GENERATION_MODEL)
            return
        if req.image_data and not self.info.multimodal:
            call.fail("INVALID_ARGUMENT", NO_IMAGE_INPUT)
            return
        try:
            requests = self._mock_requests(req)
        except _Invalid as exc:
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        except _Internal as exc:
            call.fail("INTERNAL", str(exc))
            return
        for request in requests:
            record_request(self.engine.accounting, request.rid, {
                "priority": req.priority if req.HasField("priority") else None,
                "trace_headers": dict(req.trace_headers),
                "prompt_tokens": len(req.input_ids),
            })  # fmt: skip
        bootstrap = None
        if req.HasField("disaggregated_params"):
            params = req.disaggregated_params
            bootstrap = Bootstrap(params.bootstrap_host, params.bootstrap_port, params.bootstrap_room)
        sink = _GenerateCall(
            self.engine,
            call,
            [request.rid for request in requests],
            stream=req.stream,
            incremental=self.info.incremental_streaming_output,
            report_rank=self.engine.dp_size > 1,
            logprobs=_logprob_spec(req, self.info.vocab_size) if req.return_logprob else None,
        )
        try:
            self.engine.submit(
                requests,
                sink,
                api="native",
                routed_dp_rank=req.routed_dp_rank if req.HasField("routed_dp_rank") else None,
                bootstrap=bootstrap,
            )
        except ValueError as exc:
            call.fail("INTERNAL", str(exc))
            return
        if not call.done:
            call.on_cancel = sink.cancel

    def _mock_requests(self, req: pb.GenerateRequest) -> list[MockRequest]:
        """The scheduler requests for one Generate: one per sample (n>1 gets fresh rids, §6.9)."""
        sp = req.sampling_params
        _check_guided_decoding(sp)
        if req.HasField("max_thinking_tokens"):
            raise _Internal("max_thinking_tokens requires the server to be launched with --enable-strict-thinking")
        max_new_tokens = sp.max_new_tokens if sp.HasField("max_new_tokens") else DEFAULT_MAX_NEW_TOKENS
        min_new_tokens = sp.min_new_tokens if sp.HasField("min_new_tokens") else 0
        n = sp.n if sp.HasField("n") else 1
        if n < 1:
            raise _Internal(f"n must be at least 1, got {n}.")
        if n == 1:
            rids = [req.rid if req.HasField("rid") else str(uuid.uuid4())]
        else:
            rids = [uuid.uuid4().hex for _ in range(n)]
        seed = sp.seed if sp.HasField("seed") else None
        variations = self.info.sample_variations(seed, n)
        script = self.info.scripts.tokens_for(list(req.input_ids)) if self.info.scripts else None
        input_ids = image_prompt_tokens(req.image_data, self.info.vocab_size) + list(req.input_ids)
        return [
            MockRequest(
                rid=rid,
                input_ids=input_ids,
                max_new_tokens=max_new_tokens,
                min_new_tokens=min_new_tokens,
                stop_token_ids=frozenset(sp.stop_token_ids),
                ignore_eos=sp.ignore_eos,
                stop_strings=tuple(sp.stop),
                seed=seed,
                variation=variation,
                temperature=sp.temperature if sp.HasField("temperature") else 1.0,
                script=script,
            )
            for rid, variation in zip(rids, variations, strict=True)
        ]

    # --- Embed ---------------------------------------------------------------------------------

    def _embed(self, call: ServerCall) -> None:
        """A prefill-only scheduler request whose end answers the vector (`mock.pooling`)."""
        req: pb.EmbedRequest = call.request
        if not self.info.is_embedding:
            call.fail("INVALID_ARGUMENT", NOT_AN_EMBEDDING_MODEL)
            return
        rid = req.rid if req.HasField("rid") else uuid.uuid4().hex
        input_ids = list(req.input_ids)

        def reply(vector: list[float], prompt_tokens: int) -> None:
            meta = {"id": json.dumps(rid), "prompt_tokens": json.dumps(prompt_tokens), "weight_version": '"default"'}
            _reply(call, pb.EmbedResponse(embedding=vector, meta_info=meta))

        sink = EmbedSink(input_ids, self.info.embedding_dim, reply, call.fail)
        request = MockRequest(rid=rid, input_ids=input_ids, max_new_tokens=0, temperature=0.0)
        try:
            self.engine.submit([request], sink, api="native")
        except ValueError as exc:
            call.fail("INTERNAL", str(exc))
            return
        if not call.done:
            call.on_cancel = lambda: self.engine.cancel([rid])

    # --- control -------------------------------------------------------------------------------

    def _abort(self, call: ServerCall) -> None:
        req: pb.AbortRequest = call.request
        if not req.rid and not req.abort_all:
            call.fail("INVALID_ARGUMENT", "Abort requires a non-empty rid unless abort_all is true")
            return
        self.engine.abort(req.rid, abort_all=req.abort_all, exact_first=True)
        _reply(call, pb.AbortResponse(success=True))

    def _health_check(self, call: ServerCall) -> None:
        _reply(call, pb.HealthCheckResponse(healthy=not self.engine.shutting_down))

    def _flush_cache(self, call: ServerCall) -> None:
        if self.engine.flush_cache():
            _reply(call, pb.FlushCacheResponse(success=True, message="Cache flushed successfully."))
        else:
            message = "Cache not flushed because there are pending requests."
            _reply(call, pb.FlushCacheResponse(success=False, message=message))

    # --- info ----------------------------------------------------------------------------------

    def model_info_json(self) -> dict[str, Any]:
        """``GetModelInfo.json_info`` (§7.2)."""
        info = self.info
        args = info.server_args
        return {
            "model_path": info.model_path,
            "served_model_name": info.served_model_name,
            "tokenizer_path": info.tokenizer_path,
            "is_generation": not info.is_embedding,
            "weight_version": "default",
            "load_format": args.get("load_format", "auto"),
            "reasoning_parser": args.get("reasoning_parser"),
            "tool_call_parser": args.get("tool_call_parser"),
            "disaggregation_mode": info.disaggregation_mode,
            "model_type": info.model_type,
            "architectures": info.architectures,
        }

    def server_info_json(self) -> dict[str, Any]:
        """``GetServerInfo.json_info`` (§7.1): server args, scheduler report, KV-event descriptor."""
        info = self.info
        payload = dict(info.server_args)
        payload.update(info.scheduler_info)
        payload["kv_events"] = info.kv_events
        payload["kv_event_sources"] = info.kv_event_sources
        payload["grpc_features"] = grpc_features(info.multimodal)
        if info.expose_accounting:
            payload["mock_accounting"] = self.engine.accounting.to_json()
        return payload

    def _get_model_info(self, call: ServerCall) -> None:
        _reply(call, self._model_info())

    def _model_info(self) -> pb.GetModelInfoResponse:
        json_info = json.dumps(self.model_info_json())
        return pb.GetModelInfoResponse(model_path=self.info.model_path, json_info=json_info)

    def _get_server_info(self, call: ServerCall) -> None:
        _reply(call, self._server_info())

    def _server_info(self) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(json_info=json.dumps(self.server_info_json(), default=str))

    def _get_load(self, call: ServerCall) -> None:
        req: pb.GetLoadRequest = call.request
        loads = self.load_json()
        if req.HasField("dp_rank"):
            loads = [loads[req.dp_rank]] if 0 <= req.dp_rank < len(loads) else []
        _reply(call, pb.GetLoadResponse(json_info=json.dumps(loads)))

    def load_json(self) -> list[dict[str, Any]]:
        """``GetLoad.json_info``: one `LoadSnapshot.to_dict()`-shaped object per DP rank (§7.3)."""
        now = time.time()
        mode = self.info.disaggregation_mode
        loads = []
        for rank, core in enumerate(self.engine.loads()):
            load: dict[str, Any] = {
                "timestamp": now,
                "dp_rank": rank,
                "num_running_reqs": 0,
                "num_waiting_reqs": 0,
                "num_waiting_uncached_tokens": 0,
                "num_used_tokens": 0,
                "num_total_tokens": self.info.max_total_num_tokens,
                "num_prealloc_ready_tokens": 0,
                "max_total_num_tokens": self.info.max_total_num_tokens,
                "max_running_requests": self.info.server_args.get("max_running_requests"),
                "token_usage": 0.0,
                "gen_throughput": 0.0,
                "cache_hit_rate": 0.0,
                "utilization": 0.0,
                "total_prefill_uncached_tokens": 0,
                "total_prefill_busy_us": 0,
            }
            load.update(core)
            load["dp_rank"] = rank
            load.setdefault("num_active_tokens", load["num_used_tokens"])
            load["queues"] = {
                "waiting": load["num_waiting_reqs"],
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            }
            if mode != "null":
                load["disaggregation"] = {
                    "mode": mode,
                    "prefill_bootstrap_queue_reqs": 0,
                    "prefill_inflight_queue_reqs": 0,
                    "decode_prealloc_queue_reqs": 0,
                    "decode_transfer_queue_reqs": 0,
                    "decode_retracted_queue_reqs": 0,
                    "kv_transfer_speed_gb_s": 0.0,
                    "kv_transfer_latency_ms": 0.0,
                }
            loads.append(load)
        return loads

    def _list_models(self, call: ServerCall) -> None:
        card = pb.ModelCard(
            id=self.info.served_model_name, root=self.info.model_path, max_model_len=self.info.context_length
        )
        _reply(call, pb.ListModelsResponse(models=[card]))

    def _watch_engine_state(self, call: ServerCall) -> None:
        # One snapshot, then held open: the mock's state never changes while it serves.
        call.send(
            pb.EngineStateSnapshot(
                instance_id=self.info.start_ns,
                revision=1,
                healthy=not self.engine.shutting_down,
                is_pause=False,
                model_info=self._model_info(),
                server_info=self._server_info(),
            )
        )

    # --- tokenizer -----------------------------------------------------------------------------

    def _tokenize(self, call: ServerCall) -> None:
        req: pb.TokenizeRequest = call.request
        add_special = req.add_special_tokens if req.HasField("add_special_tokens") else True
        ids = self.info.tokenizer.encode(req.text, add_special_tokens=add_special).ids
        _reply(
            call,
            pb.TokenizeResponse(
                tokens=ids, count=len(ids), max_model_len=self.info.context_length, input_text=req.text
            ),
        )

    def _detokenize(self, call: ServerCall) -> None:
        req: pb.DetokenizeRequest = call.request
        if any(token < 0 for token in req.tokens):
            call.fail("INVALID_ARGUMENT", "Detokenize tokens must be non-negative")
            return
        _reply(call, pb.DetokenizeResponse(text=self.info.tokenizer.decode(list(req.tokens))))


class _GenerateCall:
    """One Generate call's view of its samples: builds the GenerateResponse messages."""

    __slots__ = (
        "_call",
        "_engine",
        "_finishes",
        "_ids",
        "_incremental",
        "_index",
        "_last",
        "_logprobs",
        "_report_rank",
        "_rows",
        "_sent_first",
        "_started",
        "_stream",
        "_unsent",
        "_unsent_rows",
    )

    def __init__(
        self,
        engine: MockEngine,
        call: ServerCall,
        sample_rids: list[str],
        *,
        stream: bool,
        incremental: bool,
        report_rank: bool,
        logprobs: _LogprobSpec | None = None,
    ) -> None:
        self._engine = engine
        self._call = call
        self._index = {sample: i for i, sample in enumerate(sample_rids)}
        self._ids: dict[str, list[int]] = {sample: [] for sample in sample_rids}
        self._finishes: dict[str, Finish] = {}
        self._last: dict[str, tuple[RequestOutput, int]] = {}
        self._sent_first: set[str] = set()
        self._started = time.monotonic()
        self._stream = stream
        self._incremental = incremental
        self._report_rank = report_rank
        #: rid -> its last message handed to the call, which may still be waiting to be written.
        self._unsent: dict[str, pb.GenerateResponse] = {}
        self._logprobs = logprobs
        #: rid -> every logprob row so far, and the rows of its unsent message.
        self._rows: dict[str, list[TokenRow]] = {sample: [] for sample in sample_rids}
        self._unsent_rows: dict[str, list[TokenRow]] = {}

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        call = self._call
        if call.done:
            return
        rid = out.rid
        self._ids[rid].extend(out.new_token_ids)
        self._last[rid] = (out, dp_rank)
        rows = self._new_rows(rid, out.new_token_ids)
        finish = out.finish
        if finish is not None:
            self._finishes[rid] = finish
        all_done = len(self._finishes) == len(self._ids)
        if self._stream:
            if self._incremental and (tail := call.unsent_tail()) is self._unsent.get(rid) and tail is not None:
                # Like SGLang's incremental streaming: deltas that queued behind a slow reader go
                # out coalesced into one message.
                tail.output_ids.extend(out.new_token_ids)
                tail.meta_info.update(self._meta(out, dp_rank))
                tail.finished = all_done
                if rows is not None and self._logprobs is not None:  # rows is None exactly when logprobs are off
                    self._unsent_rows[rid].extend(rows)
                    tail.meta_info.update(_logprob_meta(self._unsent_rows[rid], self._logprobs.top_n))
            else:
                ids = out.new_token_ids if self._incremental else self._ids[rid]
                message = pb.GenerateResponse(output_ids=ids, meta_info=self._meta(out, dp_rank), finished=all_done)
                if rows is not None and self._logprobs is not None:
                    sent_rows = list(rows) if self._incremental else list(self._rows[rid])
                    self._unsent_rows[rid] = sent_rows
                    message.meta_info.update(_logprob_meta(sent_rows, self._logprobs.top_n))
                self._unsent[rid] = message
                call.send(message)
            if all_done:
                call.finish()
            return
        if finish is not None and finish.kind == "abort" and (finish.status_code or 0) >= 400:
            # A non-stream engine-side abort surfaces as the TokenizerManager's exception.
            self._end_others(rid)
            call.fail("INTERNAL", finish.message or "Request aborted")
            return
        if all_done:
            order = sorted(self._ids, key=self._index.__getitem__)
            for i, sample in enumerate(order):
                last, rank = self._last[sample]
                full = RequestOutput(
                    sample,
                    self._ids[sample],
                    last.finish,
                    last.prompt_tokens,
                    last.completion_tokens,
                    last.cached_tokens,
                )
                last_message = i == len(order) - 1
                meta_info = self._meta(full, rank)
                if self._logprobs is not None:
                    meta_info.update(_logprob_meta(self._rows[sample], self._logprobs.top_n))
                call.send(pb.GenerateResponse(output_ids=self._ids[sample], meta_info=meta_info, finished=last_message))
            call.finish()

    def _new_rows(self, rid: str, token_ids: list[int]) -> list[TokenRow] | None:
        if self._logprobs is None:
            return None
        rows = token_rows(token_ids, self._logprobs.top_n, self._logprobs.vocab_size)
        self._rows[rid].extend(rows)
        return rows

    def aborted(self, rid: str) -> None:
        if self._call.done:
            return
        self._end_others(rid)
        self._call.fail("CANCELLED", f"Request aborted: {rid}")

    def cancel(self) -> None:
        """The client went away (or its deadline passed): abort what is still running."""
        self._engine.cancel([rid for rid in self._ids if rid not in self._finishes])

    def _end_others(self, rid: str) -> None:
        # The bridge closes the request's generator, whose cleanup aborts the other samples.
        others = [other for other in self._ids if other != rid and other not in self._finishes]
        if others:
            self._engine.cancel(others)

    def _meta(self, out: RequestOutput, dp_rank: int) -> dict[str, str]:
        dumps = json.dumps
        rid = out.rid
        meta = {
            "id": dumps(rid),
            "finish_reason": dumps(finish_reason_json(out.finish)),
            "prompt_tokens": dumps(out.prompt_tokens),
            "weight_version": '"default"',
            "num_retractions": "0",
            "completion_tokens": dumps(out.completion_tokens),
            "cached_tokens": dumps(out.cached_tokens),
            "reasoning_tokens": "0",
            "dp_rank": dumps(dp_rank) if self._report_rank else "null",
        }
        if out.finish is not None:
            meta["e2e_latency"] = dumps(time.monotonic() - self._started)
        if rid not in self._sent_first:
            self._sent_first.add(rid)
            meta["response_sent_to_client_ts"] = dumps(time.time())
            if self._logprobs is not None and self._logprobs.input_meta:
                meta.update(self._logprobs.input_meta)  # the prompt's rows, with the first message
        return meta


@dataclass(frozen=True, slots=True)
class _LogprobSpec:
    top_n: int
    vocab_size: int
    #: ``input_token_logprobs`` (and ``input_top_logprobs``) of the prompt from ``logprob_start_len``;
    #: empty when the request asked for none (-1, the default).
    input_meta: dict[str, str] = field(default_factory=dict)


def _logprob_spec(req: pb.GenerateRequest, vocab_size: int) -> _LogprobSpec:
    """SGLang's prompt logprobs: one row per prompt token from ``logprob_start_len``; the prompt's
    first token has none (null), as nothing precedes it."""
    top_n = req.top_logprobs_num
    start = req.logprob_start_len if req.HasField("logprob_start_len") else -1
    if start < 0 or start >= len(req.input_ids):
        return _LogprobSpec(top_n, vocab_size)
    rows = token_rows(list(req.input_ids[start:]), top_n, vocab_size)
    first_is_start = start == 0
    tokens = [[None if first_is_start and i == 0 else lp, tok, None] for i, (lp, tok, _) in enumerate(rows)]
    meta = {"input_token_logprobs": json.dumps(tokens)}
    if top_n > 0:
        tops = [
            None if first_is_start and i == 0 else [[lp, t, None] for lp, t in top]
            for i, (_, _, top) in enumerate(rows)
        ]
        meta["input_top_logprobs"] = json.dumps(tops)
    return _LogprobSpec(top_n, vocab_size, meta)


def _logprob_meta(rows: list[TokenRow], top_n: int) -> dict[str, str]:
    """SGLang's logprob keys: ``[logprob, token_id, text]`` triples (text null: no detokenizer)."""
    meta = {
        "output_token_logprobs": json.dumps([[lp, token, None] for lp, token, _ in rows]),
        "output_token_logprobs_length": json.dumps(len(rows)),
    }
    if top_n > 0:
        meta["output_top_logprobs"] = json.dumps([[[lp, t, None] for lp, t in top] for _, _, top in rows])
    return meta


def _check_guided_decoding(sp: pb.SamplingParams) -> None:
    """The server-side validation of constraints (§6.5); the mock then ignores them."""
    guided = sp.HasField("guided_decoding")
    if sp.HasField("json_schema") and not sp.json_schema:
        raise _Invalid("legacy json_schema must not be empty")
    if sp.HasField("regex") and not sp.regex:
        raise _Invalid("legacy regex must not be empty")
    if guided and (sp.HasField("json_schema") or sp.HasField("regex")):
        raise _Invalid("legacy json_schema/regex cannot be combined with guided_decoding")
    if not guided:
        return
    constraint = sp.guided_decoding.WhichOneof("constraint")
    if constraint is None:
        raise _Invalid("guided decoding constraint must be specified")
    if constraint == "choice":
        values = sp.guided_decoding.choice.values
        if not values:
            raise _Invalid("guided choice must not be empty")
        if not all(values):
            raise _Invalid("guided choice must contain only non-empty values")
        return
    if not getattr(sp.guided_decoding, constraint):
        raise _Invalid(f"guided {constraint} must not be empty")


def _reply(call: ServerCall, message: Any) -> None:
    call.send(message)
    call.finish()


def _unimplemented(call: ServerCall) -> None:
    call.fail("UNIMPLEMENTED", "")
