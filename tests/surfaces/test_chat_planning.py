"""How a chat request is planned for the model it goes to: prompt, stop tokens, parsers."""

from __future__ import annotations

import json
from types import SimpleNamespace

from trio_direct.config import ServeConfig
from trio_direct.core.model_pool import ModelPool
from trio_direct.fleet.fleet import Engine, Fleet, FleetModel
from trio_direct.frontend.model_pools import select_model_parsers
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.openai.requests import decode_chat_request
from trio_direct.parsers.reasoning import HarmonyParser
from trio_direct.routing.policy import RoutingPolicy
from trio_direct.surfaces.chat import plan_chat
from trio_direct.text.harmony import harmony_encoding, render_harmony_chat
from trio_direct.text.tokenizer import ModelTokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def pool_for(model_path: str, **config) -> ModelPool:
    card = SimpleNamespace(role="aggregated", dp_size=1, url="grpc://e0:1")
    engine = Engine("e0", card, client=SimpleNamespace(api="native", name="e0"))  # type: ignore[arg-type]  # a stand-in card
    served = FleetModel(
        served_model_name=model_path, model_path=model_path, tokenizer_path=model_path, block_size=None,
        context_length=None, tool_call_parser=None, reasoning_parser=None,
    )  # fmt: skip
    settings = ServeConfig(**config)
    tokenizer = ModelTokenizer.from_directory(ensure_tiny_model(default_tiny_model_dir()))
    return ModelPool(
        settings, Fleet([engine], served), RoutingPolicy(), tokenizer, None,
        select_model_parsers(settings, served), harmony="gpt-oss" in model_path,
    )  # fmt: skip


async def test_a_gpt_oss_chat_is_written_in_harmony_and_read_with_its_channels():
    pool = pool_for("openai/gpt-oss-20b")
    assert (pool.tool_call_parser, pool.reasoning_parser) == ("gpt_oss", "gpt_oss")  # from the model's name
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    body = {"model": "openai/gpt-oss-20b", "messages": messages, "tools": TOOLS, "reasoning_effort": "low"}
    plan = await plan_chat(pool, decode_chat_request(json.dumps(body).encode()))
    expected = render_harmony_chat(messages, tools=TOOLS, reasoning_effort="low")
    (choice,) = plan.choices
    assert plan.prompts[0].token_ids == expected.token_ids
    encoding = harmony_encoding()
    ends = {encoding.encode(marker, allowed_special="all")[0] for marker in ("<|return|>", "<|call|>")}
    assert ends <= set(choice.request.sampling.stop_token_ids)
    assert isinstance(choice.output.reasoning_parser, HarmonyParser)
    # harmony's markers are special tokens: the detokenizer keeps them without the client asking
    assert _decoded_special(pool, choice) == "<|im_end|>"


async def test_a_model_without_a_parser_keeps_the_clients_special_token_choice():
    pool = pool_for("org/plain-model")
    assert (pool.tool_call_parser, pool.reasoning_parser) == (None, None)
    body = {"model": "org/plain-model", "messages": [{"role": "user", "content": "Hi"}]}
    plan = await plan_chat(pool, decode_chat_request(json.dumps(body).encode()))
    (choice,) = plan.choices
    assert choice.output.reasoning_parser is None and choice.output.tool_parser is None
    assert _decoded_special(pool, choice) == ""


def _decoded_special(pool: ModelPool, choice) -> str:
    """What the choice's detokenizer makes of one special token of the (tiny) tokenizer."""
    (special,) = pool.tokenizer.encode("<|im_end|>", add_special_tokens=False)
    decoder = choice.output.decoder
    decoder.prepare()
    return decoder.push([special]) + decoder.flush()


async def test_a_non_streamed_answer_is_asked_of_the_engine_whole_unless_its_tokens_are_read_as_they_come():
    """One engine message instead of one per token; a stream, stop strings (matched as tokens come),
    logprob rows, or no health checks to tell a quiet engine from a hung one keep it streamed."""
    pool = pool_for("org/plain-model")

    async def engine_streams(pool: ModelPool, **fields: object) -> bool:
        body = {"model": "org/plain-model", "messages": [{"role": "user", "content": "Hi"}], **fields}
        plan = await plan_chat(pool, decode_chat_request(json.dumps(body).encode()))
        return all(choice.request.stream for choice in plan.choices)

    assert not await engine_streams(pool)
    assert not await engine_streams(pool, n=2, tools=TOOLS)
    assert await engine_streams(pool, stream=True)
    assert await engine_streams(pool, stop=["\n\n"])
    assert await engine_streams(pool, logprobs=True)
    assert await engine_streams(pool_for("org/plain-model", health_interval=0))
