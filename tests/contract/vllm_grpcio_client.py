"""A client of vLLM's gRPC API written only against `smg-grpc-proto`'s own generated grpcio stubs.

Run as ``python vllm_grpcio_client.py HOST:PORT``: it drives a `VllmEngine` server through every RPC
the frontend uses, checks each answer against the published contract's semantics (as
smg-grpc-servicer 0.14.1 gives them), and prints one JSON summary. It runs in its own process
because `smg_grpc_proto` registers the same protobuf names (`smg.grpc.common.*`) as trio-direct's
own generated code, and one process cannot hold both.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import threading
import zipfile

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

pb = vllm_engine_pb2


def generate(stub, request_id: str, *, stream: bool, **sampling) -> list:
    request = pb.GenerateRequest(
        request_id=request_id,
        tokenized=pb.TokenizedInput(input_ids=[11, 12, 13, 14, 15, 16, 17, 18]),
        sampling_params=pb.SamplingParams(**sampling),
        stream=stream,
    )
    return list(stub.Generate(request, timeout=30))


def main(address: str) -> dict:
    channel = grpc.insecure_channel(address)
    stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
    summary: dict = {}

    model = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert model.is_generation and model.served_model_name and model.max_context_length > 0, model
    server = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    assert server.server_type == "vllm-grpc" and server.data_parallel_size == 1 and server.block_size >= 1, server
    summary["served_model_name"] = model.served_model_name
    summary["kv_role"] = server.kv_role

    # KV events on their own stream, read in a thread while generations run.
    batches: list = []
    subscription = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(), timeout=60)

    def read_events() -> None:
        try:
            batches.extend(subscription)  # what arrived stays when the stream ends with an error
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                raise

    reader = threading.Thread(target=read_events, daemon=True)
    reader.start()

    # Streamed: delta chunks (delta completion_tokens), then a complete repeating the last delta.
    streamed = generate(stub, "contract-stream", stream=True, max_tokens=5, logprobs=2, ignore_eos=True)
    chunks = [m.chunk for m in streamed if m.WhichOneof("response") == "chunk"]
    completes = [m.complete for m in streamed if m.WhichOneof("response") == "complete"]
    assert len(completes) == 1 and streamed[-1].WhichOneof("response") == "complete", streamed
    assert sum(len(c.token_ids) for c in chunks) == 5 and all(c.completion_tokens == len(c.token_ids) for c in chunks)
    assert list(completes[0].output_ids) == list(chunks[-1].token_ids) and completes[0].finish_reason == "length"
    assert all(len(c.output_logprobs.token_ids) == len(c.token_ids) for c in chunks)
    assert all(len(top.token_ids) == 2 for c in chunks for top in c.output_logprobs.top_logprobs)
    streamed_ids = [t for c in chunks for t in c.token_ids]

    # Not streamed: one complete per sample with every id; the constraint oneof is accepted.
    unary = generate(stub, "contract-unary", stream=False, max_tokens=5, n=2, json_schema='{"type": "object"}')
    assert [m.WhichOneof("response") for m in unary] == ["complete", "complete"], unary
    assert sorted(m.complete.index for m in unary) == [0, 1]
    assert all(len(m.complete.output_ids) == m.complete.completion_tokens <= 5 for m in unary)

    # Text input, a seed: the same seed gives the same tokens.
    seeded = [generate(stub, f"contract-seed-{i}", stream=False, max_tokens=6, seed=7) for i in range(2)]
    assert list(seeded[0][0].complete.output_ids) == list(seeded[1][0].complete.output_ids)
    text = list(
        stub.Generate(
            pb.GenerateRequest(
                request_id="contract-text",
                text="Hello there",
                stream=False,
                sampling_params=pb.SamplingParams(max_tokens=2),
            ),
            timeout=30,
        )
    )
    assert text[-1].complete.prompt_tokens > 0

    # Abort by exact id: the running stream ends with finish reason "abort".
    long_stream = stub.Generate(
        pb.GenerateRequest(
            request_id="contract-abort",
            tokenized=pb.TokenizedInput(input_ids=[21, 22, 23]),
            sampling_params=pb.SamplingParams(max_tokens=20000, ignore_eos=True),
            stream=True,
        ),
        timeout=60,
    )
    first = next(long_stream)
    assert first.WhichOneof("response") == "chunk"
    assert stub.Abort(pb.AbortRequest(request_ids=["contract-abort"]), timeout=10) == pb.AbortResponse()
    rest = list(long_stream)
    assert rest and rest[-1].WhichOneof("response") == "complete" and rest[-1].complete.finish_reason == "abort", rest[
        -2:
    ]
    summary["aborted_after_tokens"] = sum(len(m.chunk.token_ids) for m in [first, *rest] if m.HasField("chunk"))

    loads = stub.GetLoads(pb.GetLoadsRequest(), timeout=10)
    assert loads.dp_rank_count == 1 and [load.dp_rank for load in loads.loads] == [0], loads
    health = stub.HealthCheck(pb.HealthCheckRequest(), timeout=10)
    assert health.healthy, health

    parts = list(stub.GetTokenizer(common_pb2.GetTokenizerRequest(), timeout=30))
    archive = b"".join(p.data for p in parts)
    assert parts[-1].sha256 == hashlib.sha256(archive).hexdigest()
    names = zipfile.ZipFile(io.BytesIO(archive)).namelist()
    assert "tokenizer.json" in names, names

    try:
        stub.Embed(pb.EmbedRequest(request_id="contract-embed", tokenized=pb.TokenizedInput(input_ids=[1])), timeout=10)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    else:
        raise AssertionError("a generation model answered Embed")

    subscription.cancel()
    reader.join(10)
    stored = [e for b in batches for e in b.events if e.WhichOneof("data") == "stored"]
    assert stored and all(b.HasField("dp_rank") and b.dp_rank == 0 for b in batches), batches[:2]
    sequences = [b.sequence_number for b in batches]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences), sequences
    assert all(len(block.token_ids) == block.block_size for e in stored for block in e.stored.blocks)
    summary.update(streamed_ids=streamed_ids, kv_batches=len(batches), stored_events=len(stored))
    channel.close()
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
