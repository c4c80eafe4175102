"""The vLLM-API adapter against scripted servicers: delta counts, the streamed complete that repeats
the last delta, the constraint oneof, connector parameters and the probe's card."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trio_direct._proto.vllm import vllm_engine_pb2 as pb
from trio_direct.engine import vllm
from trio_direct.engine.errors import EngineInvalidArgument
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.fleet.card import CardError
from trio_direct.fleet.engine_apis import engine_card

TYPES = {
    vllm.GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    vllm.ABORT: (False, pb.AbortRequest, pb.AbortResponse),
}


def chunk(ids):
    # smg-grpc-servicer: completion_tokens is the chunk's own (delta) count
    return pb.GenerateResponse(
        chunk=pb.GenerateStreamChunk(token_ids=ids, prompt_tokens=3, completion_tokens=len(ids), cached_tokens=1)
    )


def complete(ids, reason="stop", **extra):
    return pb.GenerateResponse(
        complete=pb.GenerateComplete(
            output_ids=ids, finish_reason=reason, prompt_tokens=3, completion_tokens=len(ids), cached_tokens=1, **extra
        )
    )


def replies(*messages):
    def handler(call):
        for message in messages:
            call.send(message)
        call.finish()

    return handler


@pytest.fixture
async def engine(fake_engine_factory):
    return await fake_engine_factory(TYPES)


async def collect(engine, request):
    client = vllm.VllmEngineClient(engine.channel())
    try:
        async with client.generate(request) as chunks:
            return [c async for c in chunks]
    finally:
        client.channel.close()


async def test_streamed_deltas_are_summed_and_the_repeating_complete_adds_nothing(engine):
    engine.handlers[vllm.GENERATE] = replies(chunk([5, 6]), chunk([7]), complete([7], matched_token_id=2))
    chunks = await collect(engine, GenerateInput(rid="r", input_ids=[1, 2, 3]))
    assert [c.token_ids for c in chunks] == [[5, 6], [7], []]
    assert [c.completion_tokens for c in chunks] == [2, 3, 3]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].matched_stop == 2


async def test_a_request_not_streamed_takes_every_id_from_its_complete(engine):
    engine.handlers[vllm.GENERATE] = replies(complete([5, 6, 7], "length"))
    chunks = await collect(engine, GenerateInput(rid="r", input_ids=[1, 2, 3], stream=False))
    assert [(c.token_ids, c.completion_tokens, c.finish_reason) for c in chunks] == [([5, 6, 7], 3, "length")]


async def test_an_error_finish_ends_as_an_abort_with_the_reason(engine):
    engine.handlers[vllm.GENERATE] = replies(chunk([5]), complete([5], "error"))
    last = (await collect(engine, GenerateInput(rid="r", input_ids=[1])))[-1]
    assert last.finish_reason == "abort" and "'error'" in (last.abort_message or "")


async def test_a_prefill_complete_hands_on_its_connector_parameters(engine):
    params = json.dumps({"do_remote_prefill": True, "remote_block_ids": [1, 2]})
    engine.handlers[vllm.GENERATE] = replies(chunk([5]), complete([5], kv_transfer_params_json=params))
    last = (await collect(engine, GenerateInput(rid="r", input_ids=[1])))[-1]
    assert last.kv_transfer_params == params


def prompt_rows(ids):
    """The servicer's `InputLogProbs`: the first token has no value."""
    values = [pb.InputTokenLogProb()] + [pb.InputTokenLogProb(value=-0.5 * i) for i in range(1, len(ids))]
    return pb.InputLogProbs(token_logprobs=values, token_ids=ids)


async def test_the_prompts_rows_pass_on_once_from_the_start_asked_for(engine):
    rows = prompt_rows([1, 2, 3])
    # A one-step request: the first chunk and the complete come from the same engine output, both with the rows.
    with_rows = pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[5], input_logprobs=rows))
    engine.handlers[vllm.GENERATE] = replies(with_rows, complete([5], input_logprobs=rows))
    asked = GenerateInput(rid="r", input_ids=[1, 2, 3], return_logprob=True, logprob_start_len=0)
    chunks = await collect(engine, asked)
    assert [[(r.token_id, r.logprob) for r in c.prompt_logprobs or ()] for c in chunks] == [
        [(1, None), (2, -0.5), (3, -1.0)],
        [],
    ]
    engine.handlers[vllm.GENERATE] = replies(complete([5, 6], input_logprobs=rows))
    unary = replace(asked, stream=False, logprob_start_len=1)
    [only] = await collect(engine, unary)
    assert [r.token_id for r in only.prompt_logprobs or ()] == [2, 3]


def test_prompt_logprobs_are_asked_for_only_with_prompt_rows():
    plain = vllm.generate_request(GenerateInput(rid="r", input_ids=[1], return_logprob=True, top_logprobs_num=2))
    assert plain.sampling_params.logprobs == 2 and not plain.sampling_params.HasField("prompt_logprobs")
    asked = GenerateInput(rid="r", input_ids=[1], return_logprob=True, top_logprobs_num=2, logprob_start_len=0)
    assert vllm.generate_request(asked).sampling_params.prompt_logprobs == 2


async def test_abort_sends_the_exact_id(engine):
    seen = []

    def abort(call):
        seen.extend(call.request.request_ids)
        call.send(pb.AbortResponse())
        call.finish()

    engine.handlers[vllm.ABORT] = abort
    client = vllm.VllmEngineClient(engine.channel())
    try:
        assert await client.abort("rid-1")
    finally:
        client.channel.close()
    assert seen == ["rid-1"]


def test_sampling_defaults_constraints_and_logprobs_go_on_the_wire():
    plain = vllm.sampling_params(SamplingOptions())
    assert not plain.HasField("temperature") and not plain.HasField("max_tokens") and not plain.HasField("seed")
    assert (plain.top_p, plain.top_k, plain.repetition_penalty, plain.n) == (1.0, 0, 1.0, 1)
    assert plain.WhichOneof("constraint") is None and not plain.HasField("logprobs")
    options = SamplingOptions(
        temperature=0.0, top_k=-1, max_new_tokens=7, seed=2**40 + 5, json_schema='{"type":"object"}'
    )
    params = vllm.sampling_params(options, top_logprobs=0)
    assert params.HasField("temperature") and params.temperature == 0.0
    assert (params.top_k, params.max_tokens, params.seed) == (0, 7, 5)
    assert params.WhichOneof("constraint") == "json_schema" and params.json_schema == '{"type":"object"}'
    assert params.HasField("logprobs") and params.logprobs == 0
    assert vllm.sampling_params(SamplingOptions(regex="a+")).regex == "a+"
    assert vllm.sampling_params(SamplingOptions(ebnf="root ::= 'x'")).grammar == "root ::= 'x'"
    assert vllm.sampling_params(SamplingOptions(structural_tag="{}")).WhichOneof("constraint") == "structural_tag"


def test_the_request_carries_dp_rank_and_connector_parameters_and_refuses_images():
    request = GenerateInput(rid="r", input_ids=[1, 2], routed_dp_rank=1, kv_transfer_params='{"do_remote_decode":true}')
    message = vllm.generate_request(request)
    assert message.WhichOneof("input") == "tokenized" and list(message.tokenized.input_ids) == [1, 2]
    assert message.data_parallel_rank == 1 and json.loads(message.kv_transfer_params_json) == {"do_remote_decode": True}
    assert not vllm.generate_request(GenerateInput(rid="r", input_ids=[1])).HasField("kv_transfer_params_json")
    with pytest.raises(EngineInvalidArgument):
        vllm.generate_request(GenerateInput(rid="r", input_ids=[1], image_data=["http://x/y.png"]))


MODEL_INFO = {
    "model_path": "/models/llama",
    "served_model_name": "llama",
    "tokenizer_path": "/models/llama",
    "max_context_length": 8192,
    "max_req_input_len": 8192,
    "is_generation": True,
}


@pytest.mark.parametrize(
    ("kv_role", "role"),
    [("", "aggregated"), ("kv_both", "aggregated"), ("kv_producer", "prefill"), ("kv_consumer", "decode")],
)
def test_the_card_reads_role_layout_and_pairing_from_server_info(kv_role, role):
    server_info = {
        "kv_connector": "NixlConnector" if kv_role else "",
        "kv_role": kv_role,
        "data_parallel_size": 2,
        "block_size": 16,
        "kv_cache_dtype": "auto",
        "model_dtype": "torch.bfloat16",
        "attention_backend": "",
        "pairing_protocol": "",
    }
    card = engine_card("grpc://h:1", "h", 1, "vllm", MODEL_INFO, server_info)
    assert (card.role, card.dp_size, card.block_size, card.kv_block_size, card.context_length) == (
        role,
        2,
        16,
        16,
        8192,
    )
    assert card.served_model_name == "llama" and card.api == "vllm"
    assert [s.endpoint for s in card.kv_events] == ["grpc://h:1", "grpc://h:1"]
    assert dict(card.pairing) == {"kv_cache_dtype": "auto", "block_size": "16", "model_dtype": "torch.bfloat16"}
    assert card.kv_connector == ("NixlConnector" if kv_role else None)


def test_an_unknown_kv_role_is_refused():
    with pytest.raises(CardError, match="kv_role"):
        engine_card("grpc://h:1", "h", 1, "vllm", MODEL_INFO, {"kv_role": "kv_sideways"})


def test_the_models_sampling_defaults_fill_only_what_the_request_left_unset():
    defaults = vllm.sampling_defaults('{"temperature": 0.6, "top_p": 0.95, "top_k": 20, "seed": 3, "min_p": true}')
    assert defaults == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert (
        vllm.sampling_defaults("") == {} and vllm.sampling_defaults("[1]") == {} and vllm.sampling_defaults("{") == {}
    )
    unset = vllm.generate_request(GenerateInput(rid="r", input_ids=[1]), defaults).sampling_params
    assert (round(unset.temperature, 3), round(unset.top_p, 3), unset.top_k) == (0.6, 0.95, 20)
    given = SamplingOptions(temperature=0.0, top_k=-1)
    chosen = vllm.generate_request(GenerateInput(rid="r", input_ids=[1], sampling=given), defaults).sampling_params
    assert (chosen.temperature, round(chosen.top_p, 3), chosen.top_k) == (0.0, 0.95, 0)


async def test_embed_and_generate_against_the_mock(mock_engine_factory, dial):
    from trio_direct.engine.types import EmbedInput

    embedder = await mock_engine_factory(api="vllm", is_embedding=True)
    client = vllm.VllmEngineClient(dial(embedder.port))
    output = await client.embed(EmbedInput(rid="e1", input_ids=[5, 6, 7]))
    assert output.prompt_tokens == 3 and len(output.embedding) == embedder.info.embedding_dim
    generator = await mock_engine_factory(api="vllm")
    client = vllm.VllmEngineClient(dial(generator.port))
    request = GenerateInput(rid="g1", input_ids=[5, 6, 7], sampling=SamplingOptions(max_new_tokens=4, ignore_eos=True))
    async with client.generate(request) as chunks:
        got = [c async for c in chunks]
    assert sum(len(c.token_ids) for c in got) == 4 and got[-1].completion_tokens == 4
    assert got[-1].finish_reason == "length" and got[-1].prompt_tokens == 3
    assert await client.flush_cache(timeout=5.0) == (True, "Cache flushed successfully.")
