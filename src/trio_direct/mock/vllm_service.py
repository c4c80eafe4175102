"""`vllm.grpc.engine.VllmEngine` -- vLLM's gRPC API -- on top of the mock engine.

Faithful to smg-grpc-servicer 0.14.1 running inside vLLM (the ``smg-grpc-servicer[vllm]`` plugin):
token ids (or text) in; a streamed request gets delta chunks whose `completion_tokens` is the
chunk's own count, then a `complete` repeating the last delta; a request that is not streamed gets
one `complete` with every id; errors are gRPC statuses; `Abort` takes exact ids and answers an empty
message, and the aborted stream ends with a `complete` whose finish reason is ``abort``.

Prefill/decode follows vLLM's connectors: a request on a ``--role prefill`` engine (reported as
``kv_role: kv_producer``) whose `kv_transfer_params_json` asks for a remote decode
(``do_remote_decode``) finishes once its prompt is in, and its `complete` returns the parameters
the decode leg must carry (``do_remote_prefill``, the engine's bootstrap address and a room);
the KV waits for the decode leg behind that room (the mock's bootstrap TCP rendezvous, standing in
for NIXL). A ``--role decode`` engine (``kv_consumer``) pulls it before decoding.

`SubscribeKvEvents` streams the engine's KV batches under each DP rank's own sequence numbers, and
resumes a subscriber from its `start_sequence_number` while the batches since are still held (the
last `_HISTORY` per rank); an older cursor is refused with OUT_OF_RANGE, the answer the Python relay
gives to every resume, on which a subscriber rebuilds from a fresh subscription.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from trio_direct._proto.smg import common_pb2 as common
from trio_direct._proto.vllm import vllm_engine_pb2 as pb
from trio_direct.engine.transport.server import RpcMethod, ServerCall
from trio_direct.mock.engine import Bootstrap, EngineInfo, MockEngine, record_request
from trio_direct.mock.kv_types import KvEvent
from trio_direct.mock.logprobs import TokenRow, token_rows
from trio_direct.mock.native_service import NOT_A_GENERATION_MODEL, NOT_AN_EMBEDDING_MODEL
from trio_direct.mock.pooling import EmbedSink
from trio_direct.mock.scheduler import Finish, MockRequest, RequestOutput
from trio_direct.mock.smg_service import health_methods, kv_event, tokenizer_chunks

__all__ = ["ACCOUNTING_METHOD", "CONNECTOR", "SERVICE", "VllmService"]

SERVICE = "vllm.grpc.engine.VllmEngine"
#: The mock's KV connector, as GetServerInfo names it: NIXL's parameter shape over the mock's
#: bootstrap rendezvous.
CONNECTOR = "MockConnector"
#: Not part of the contract: the mock's request accounting as a JSON Struct, for tests (the
#: native API's GetServerInfo carries it as ``mock_accounting``; this API has no free-form field).
ACCOUNTING_METHOD = "/trio_direct.mock.Accounting/Get"
#: The version the mock reports in GetLoads.
VLLM_VERSION = "0.19.0"
#: KV batches held per DP rank for subscribers that resume.
_HISTORY = 4096
_ROLES = {"aggregated": "", "prefill": "kv_producer", "decode": "kv_consumer"}


class _Invalid(Exception):
    """A ValueError while converting the request: INVALID_ARGUMENT."""


class VllmService:
    """vLLM's gRPC API as `RpcMethod`s over one `MockEngine`."""

    def __init__(self, engine: MockEngine, info: EngineInfo) -> None:
        self.engine = engine
        self.info = info
        self.engine_id = f"mock-{info.start_ns:x}"
        self._calls: dict[str, list[_GenerateCall]] = {}
        self._last_receive = 0.0
        #: Per DP rank, the last `_HISTORY` batches: (seq, KvEventBatch).
        self._history: dict[int, deque[common.KvEventBatch]] = {}
        self._subscribers: list[Callable[[common.KvEventBatch], None]] = []
        self.sampling_defaults = _sampling_defaults(
            Path(info.model_directory or info.tokenizer_path) / "generation_config.json"
        )
        if engine.has_kv_publisher:
            engine.add_kv_listener(self._kv_batch)

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
        service = pb.DESCRIPTOR.services_by_name["VllmEngine"]
        methods = [
            RpcMethod(
                f"/{SERVICE}/{method.name}",
                method.server_streaming,
                getattr(modules[method.input_type.file.package], method.input_type.name),
                getattr(modules[method.output_type.file.package], method.output_type.name),
                handlers.get(method.name, _unimplemented),
            )
            for method in service.methods
        ]
        methods += health_methods(("", SERVICE))
        if self.info.expose_accounting:
            methods.append(RpcMethod(ACCOUNTING_METHOD, False, struct_pb2.Struct, struct_pb2.Struct, self._accounting))
        return methods

    # --- Generate ------------------------------------------------------------------------------

    def _generate(self, call: ServerCall) -> None:
        req: pb.GenerateRequest = call.request
        self._last_receive = time.time()
        if self.info.is_embedding:
            call.fail("INVALID_ARGUMENT", NOT_A_GENERATION_MODEL)
            return
        try:
            requests = self._mock_requests(req)
            bootstrap, pull, handoff = self._connector(req)
        except _Invalid as exc:
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        rids = [request.rid for request in requests]
        sp = req.sampling_params
        for rid in rids:
            record_request(self.engine.accounting, rid, {
                "prompt_tokens": len(requests[0].input_ids),
                "constraint": sp.WhichOneof("constraint"),
                "logprobs": sp.logprobs if sp.HasField("logprobs") else None,
                "kv_transfer_params": json.loads(req.kv_transfer_params_json)
                if req.HasField("kv_transfer_params_json") else None,
            })  # fmt: skip
        sink = _GenerateCall(self.engine, call, req.request_id, rids, req.stream, self._forget, handoff)
        if sp.HasField("logprobs"):
            sink.logprobs = (max(0, sp.logprobs), self.info.vocab_size)
        if sp.HasField("prompt_logprobs"):
            sink.prompt_rows = _input_logprobs(requests[0].input_ids, max(0, sp.prompt_logprobs), self.info.vocab_size)
        self._calls.setdefault(req.request_id, []).append(sink)
        routed = req.data_parallel_rank if req.HasField("data_parallel_rank") else None
        try:
            self.engine.submit(
                requests,
                sink,
                api="vllm",
                routed_dp_rank=routed,
                bootstrap=bootstrap,
                pull=pull,
                local=bootstrap is None,
            )
        except ValueError as exc:
            # vLLM's input processor refuses an over-long prompt before it starts: INVALID_ARGUMENT.
            self._forget(sink)
            call.fail("INVALID_ARGUMENT", str(exc))
            return
        if not call.done:
            call.on_cancel = sink.cancel

    def _mock_requests(self, req: pb.GenerateRequest) -> list[MockRequest]:
        kind = req.WhichOneof("input")
        if kind == "tokenized":
            input_ids = list(req.tokenized.input_ids)
        elif kind == "text" and self.info.tokenizer is not None:
            input_ids = list(self.info.tokenizer.encode(req.text, add_special_tokens=True).ids)
        else:
            raise _Invalid("Either tokenized input or text must be provided")
        if not input_ids:
            raise _Invalid("The prompt cannot be empty")
        sp = req.sampling_params
        n = max(1, sp.n)
        rid = req.request_id
        seed = sp.seed if sp.HasField("seed") else None
        return [
            MockRequest(
                rid=sample,
                input_ids=input_ids,
                max_new_tokens=sp.max_tokens if sp.HasField("max_tokens") else None,
                min_new_tokens=sp.min_tokens,
                stop_token_ids=frozenset(sp.stop_token_ids),
                ignore_eos=sp.ignore_eos,
                stop_strings=tuple(sp.stop),
                seed=seed,
                variation=variation,
                temperature=sp.temperature if sp.HasField("temperature") else 1.0,
                script=self.info.scripts.tokens_for(input_ids) if self.info.scripts else None,
            )
            # vLLM names the samples of an n > 1 request after it; Abort of the request ends them all.
            for sample, variation in zip(
                [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)],
                self.info.sample_variations(seed, n),
                strict=True,
            )
        ]

    def _connector(self, req: pb.GenerateRequest) -> tuple[Bootstrap | None, bool, dict[str, Any] | None]:
        """The request's PD leg from its connector parameters: (rendezvous, pulled prefill, the
        parameters a prefill's `complete` hands on)."""
        if not req.HasField("kv_transfer_params_json"):
            return None, False, None  # run whole, whatever the role (as vLLM does)
        try:
            params = json.loads(req.kv_transfer_params_json)
        except ValueError as exc:
            raise _Invalid(f"Invalid kv_transfer_params_json: {exc}") from None
        if not isinstance(params, dict):
            raise _Invalid("kv_transfer_params_json must be a JSON object")
        role = self.engine.role
        if role == "prefill" and params.get("do_remote_decode"):
            args = self.info.server_args
            room = random.getrandbits(63)
            host, port = str(args.get("host", "127.0.0.1")), int(args["disaggregation_bootstrap_port"])
            handoff = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.engine_id,
                "remote_host": host,
                "remote_port": port,
                "remote_room": room,
            }
            return Bootstrap(host, port, room), True, handoff
        if role == "decode" and params.get("do_remote_prefill"):
            try:
                bootstrap = Bootstrap(
                    str(params["remote_host"]), int(params["remote_port"]), int(params["remote_room"])
                )
            except (KeyError, TypeError, ValueError):
                raise _Invalid(f"{CONNECTOR} needs remote_host, remote_port and remote_room") from None
            return bootstrap, False, None
        raise _Invalid(f"kv_transfer_params_json does not fit this engine's kv_role {_ROLES[role]!r}")

    # --- Embed ---------------------------------------------------------------------------------

    def _embed(self, call: ServerCall) -> None:
        req: pb.EmbedRequest = call.request
        self._last_receive = time.time()
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
            self.engine.submit([request], sink, api="vllm", local=True)
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
        for rid in call.request.request_ids:
            # Exact ids; the samples of an n > 1 request are named after it and go with it.
            samples = [sample for sink in self._calls.get(rid, ()) for sample in sink.sample_rids]
            for sample in samples or [rid]:
                self.engine.abort(sample, exact_first=False)
        _reply(call, pb.AbortResponse())

    def _health_check(self, call: ServerCall) -> None:
        if self.engine.shutting_down:
            _reply(call, pb.HealthCheckResponse(healthy=False, message="Engine is shutting down"))
        else:
            _reply(call, pb.HealthCheckResponse(healthy=True, message="Health check passed"))

    def _flush_cache(self, call: ServerCall) -> None:
        if self.engine.flush_cache():
            _reply(call, common.FlushCacheResponse(success=True, message="Cache flushed successfully."))
        else:
            message = "Cache not flushed because there are pending requests."
            _reply(call, common.FlushCacheResponse(success=False, message=message))

    def _accounting(self, call: ServerCall) -> None:
        struct = struct_pb2.Struct()
        struct.update(json.loads(json.dumps(self.engine.accounting.to_json())))
        _reply(call, struct)

    # --- info ----------------------------------------------------------------------------------

    def _get_model_info(self, call: ServerCall) -> None:
        info = self.info
        _reply(
            call,
            pb.GetModelInfoResponse(
                model_path=info.model_path,
                is_generation=not info.is_embedding,
                max_context_length=info.context_length,
                vocab_size=info.vocab_size,
                supports_vision=False,
                served_model_name=info.served_model_name,
                tokenizer_path=info.tokenizer_path,
                model_type=info.model_type,
                architectures=info.architectures,
                eos_token_ids=info.eos_token_ids,
                # The servicer reports vLLM's max_model_len for both.
                max_req_input_len=info.context_length,
                default_sampling_params_json=self.sampling_defaults,
            ),
        )

    def _get_server_info(self, call: ServerCall) -> None:
        role = self.engine.role
        args = self.info.server_args
        _reply(
            call,
            pb.GetServerInfoResponse(
                active_requests=self.engine.live_requests,
                is_paused=False,
                last_receive_timestamp=self._last_receive,
                uptime_seconds=time.time() - self.info.start_time,
                server_type="vllm-grpc",
                kv_connector="" if role == "aggregated" else CONNECTOR,
                kv_role=_ROLES[role],
                kv_engine_id="" if role == "aggregated" else self.engine_id,
                data_parallel_size=self.engine.dp_size,
                kv_cache_dtype="auto",
                block_size=int(args.get("page_size", 1)),
                model_dtype="torch.bfloat16",
                # As the servicer: the operator's pairing protocol from the engine's environment.
                pairing_protocol=os.environ.get("SMG_PAIRING_PROTOCOL", ""),
                max_num_seqs=int(args.get("max_running_requests", 0)),
            ),
        )

    def _get_loads(self, call: ServerCall) -> None:
        req: pb.GetLoadsRequest = call.request
        loads = []
        for rank, core in enumerate(self.engine.loads()):
            running = int(core.get("num_running_reqs", 0))
            waiting = int(core.get("num_waiting_reqs", 0))
            loads.append(
                pb.SchedulerLoad(
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
            )
        if req.HasField("dp_rank"):
            loads = [loads[req.dp_rank]] if 0 <= req.dp_rank < len(loads) else []
        _reply(
            call,
            pb.GetLoadsResponse(
                timestamp=datetime.now(UTC).isoformat(),
                version=VLLM_VERSION,
                dp_rank_count=self.engine.dp_size,
                loads=loads,
            ),
        )

    def _get_tokenizer(self, call: ServerCall) -> None:
        for chunk in tokenizer_chunks(Path(self.info.model_directory or self.info.tokenizer_path)):
            call.send(chunk)
        call.finish()

    # --- KV events -----------------------------------------------------------------------------

    def _kv_batch(self, dp_rank: int, seq: int, ts: float, events: Sequence[KvEvent]) -> None:
        batch = common.KvEventBatch(
            sequence_number=seq,
            timestamp=ts,
            events=[kv_event(0, event) for event in events],
            dp_rank=dp_rank,
        )
        history = self._history.setdefault(dp_rank, deque(maxlen=_HISTORY))
        history.append(batch)
        for send in list(self._subscribers):
            send(batch)

    def _subscribe_kv_events(self, call: ServerCall) -> None:
        req: common.SubscribeKvEventsRequest = call.request
        if not self.engine.has_kv_publisher:
            call.fail(
                "UNIMPLEMENTED",
                "KV cache events not enabled. Start vLLM with --kv-events-config "
                '\'{"enable_kv_cache_events": true, "publisher": "zmq"}\'',
            )
            return
        start = req.start_sequence_number
        if start:
            held = [list(history) for history in self._history.values()]
            if any(batches and batches[0].sequence_number > start for batches in held):
                call.fail("OUT_OF_RANGE", f"KV events before sequence {start} are no longer held; resubscribe from 0")
                return
            for batches in held:
                for batch in batches:
                    if batch.sequence_number >= start:
                        call.send(batch)
        self._subscribers.append(call.send)

        def unsubscribe() -> None:
            if call.send in self._subscribers:
                self._subscribers.remove(call.send)

        call.on_cancel = unsubscribe


class _GenerateCall:
    """One Generate call: delta chunks, then a `complete` per sample ``index``."""

    __slots__ = (
        "_call",
        "_engine",
        "_finished",
        "_handoff",
        "_ids",
        "_index",
        "_on_end",
        "_rows",
        "_stream",
        "_unsent_prompt_rows",
        "logprobs",
        "prompt_rows",
        "request_id",
        "sample_rids",
    )

    def __init__(
        self,
        engine: MockEngine,
        call: ServerCall,
        request_id: str,
        sample_rids: list[str],
        stream: bool,
        on_end: Callable[[_GenerateCall], None],
        handoff: dict[str, Any] | None,
    ) -> None:
        self.request_id = request_id
        self.sample_rids = sample_rids
        self._engine = engine
        self._call = call
        self._index = {rid: i for i, rid in enumerate(sample_rids)}
        self._ids: dict[str, list[int]] = {rid: [] for rid in sample_rids}
        self._rows: dict[str, list[TokenRow]] = {rid: [] for rid in sample_rids}
        self._finished: dict[str, pb.GenerateComplete] = {}
        self._stream = stream
        self._on_end = on_end
        self._handoff = handoff
        #: (top_n, vocab size) when the request asked for logprobs.
        self.logprobs: tuple[int, int] | None = None
        #: The prompt's rows when the request asked for them (`SamplingParams.prompt_logprobs`).
        self.prompt_rows: pb.InputLogProbs | None = None
        self._unsent_prompt_rows = set(sample_rids)

    def output(self, out: RequestOutput, dp_rank: int) -> None:
        call = self._call
        if call.done:
            return
        finish = out.finish
        if finish is not None and finish.kind == "abort" and finish.status_code is not None:
            # An engine-side failure (a KV transfer that did not happen): the servicer's gRPC status.
            self._cancel_others(out.rid)
            self._on_end(self)
            call.fail("INTERNAL" if finish.status_code >= 500 else "INVALID_ARGUMENT", finish.message or "aborted")
            return
        rid = out.rid
        index = self._index[rid]
        self._ids[rid].extend(out.new_token_ids)
        rows = token_rows(out.new_token_ids, *self.logprobs) if self.logprobs is not None else None
        if rows is not None:
            self._rows[rid].extend(rows)
        # As the servicer: a stream's first chunk per sample carries the prompt's rows, and so does a
        # `complete` built from that same engine output (a one-step request); an unstreamed `complete` always.
        first_output = rid in self._unsent_prompt_rows
        self._unsent_prompt_rows.discard(rid)
        prompt_rows = self.prompt_rows if first_output or not self._stream else None
        if self._stream:
            chunk = pb.GenerateStreamChunk(
                token_ids=out.new_token_ids,
                prompt_tokens=out.prompt_tokens,
                completion_tokens=len(out.new_token_ids),  # the servicer's delta count
                cached_tokens=out.cached_tokens,
                index=index,
            )
            if rows is not None:
                chunk.output_logprobs.CopyFrom(_output_logprobs(rows))
            if prompt_rows is not None:
                chunk.input_logprobs.CopyFrom(prompt_rows)
            call.send(pb.GenerateResponse(chunk=chunk))
        if finish is None:
            return
        # Streamed: the complete repeats the last delta. Not streamed: it carries every id.
        ids = out.new_token_ids if self._stream else self._ids[rid]
        complete = _complete(out, finish, ids, index, self._handoff)
        if rows is not None:  # streamed: the last delta's rows, as the servicer repeats them; else all
            complete.output_logprobs.CopyFrom(_output_logprobs(rows if self._stream else self._rows[rid]))
        if prompt_rows is not None:
            complete.input_logprobs.CopyFrom(prompt_rows)
        self._finished[rid] = complete
        if self._stream:
            call.send(pb.GenerateResponse(complete=complete))
        if len(self._finished) == len(self._ids):
            if not self._stream:
                for rid in self.sample_rids:
                    call.send(pb.GenerateResponse(complete=self._finished[rid]))
            self._on_end(self)
            call.finish()

    def aborted(self, rid: str) -> None:
        """An Abort ended the sample: it finishes with reason ``abort``, as vLLM's output does."""
        self.output(RequestOutput(rid, [], Finish("abort"), 0, len(self._ids[rid]), 0), 0)

    def cancel(self) -> None:
        self._on_end(self)
        self._engine.cancel([rid for rid in self.sample_rids if rid not in self._finished])

    def _cancel_others(self, rid: str) -> None:
        others = [other for other in self.sample_rids if other != rid and other not in self._finished]
        if others:
            self._engine.cancel(others)


def _sampling_defaults(path: Path) -> str:
    """The servicer's `default_sampling_params_json`: the generation config's sampling keys."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    if not isinstance(config, dict):
        return ""
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    found = {key: config[key] for key in keys if config.get(key) is not None}
    return json.dumps(found, separators=(",", ":")) if found else ""


def _output_logprobs(rows: list[TokenRow]) -> pb.OutputLogProbs:
    return pb.OutputLogProbs(
        token_logprobs=[lp for lp, _, _ in rows],
        token_ids=[token for _, token, _ in rows],
        top_logprobs=[
            pb.TopLogProbs(values=[lp for lp, _ in top], token_ids=[t for _, t in top]) for _, _, top in rows
        ],
    )


def _input_logprobs(prompt_ids: Sequence[int], top_n: int, vocab_size: int) -> pb.InputLogProbs:
    """The servicer's prompt rows: one per prompt token, the first with no value (nothing precedes
    it) and, when alternatives are asked for, an empty top list."""
    rows = token_rows(list(prompt_ids), top_n, vocab_size)
    message = pb.InputLogProbs(token_ids=[token for _, token, _ in rows])
    for i, (lp, _, top) in enumerate(rows):
        message.token_logprobs.append(pb.InputTokenLogProb() if i == 0 else pb.InputTokenLogProb(value=lp))
        if top_n > 0:
            alternatives = [] if i == 0 else top
            message.top_logprobs.append(
                pb.TopLogProbs(values=[v for v, _ in alternatives], token_ids=[t for _, t in alternatives])
            )
    return message


def _complete(
    out: RequestOutput, finish: Finish, ids: Sequence[int], index: int, handoff: dict[str, Any] | None
) -> pb.GenerateComplete:
    complete = pb.GenerateComplete(
        output_ids=ids,
        finish_reason={"length": "length", "abort": "abort"}.get(finish.kind, "stop"),
        prompt_tokens=out.prompt_tokens,
        completion_tokens=len(ids),
        cached_tokens=out.cached_tokens,
        index=index,
    )
    if finish.kind == "stop":
        if isinstance(finish.matched, str):
            complete.matched_stop_str = finish.matched
        elif isinstance(finish.matched, int):
            complete.matched_token_id = finish.matched
    if handoff is not None and finish.kind != "abort":
        complete.kv_transfer_params_json = json.dumps(handoff)
    return complete


def _reply(call: ServerCall, message: Any) -> None:
    call.send(message)
    call.finish()


def _unimplemented(call: ServerCall) -> None:
    call.fail("UNIMPLEMENTED", "")
