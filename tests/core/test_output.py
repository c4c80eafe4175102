"""A choice's text never shows the stop token (EOS) that ended it, however the engine's messages
are batched: vLLM's API sends the delta that carries the EOS id and then a `complete` naming it, and
under load the two arrive in separate reads."""

from __future__ import annotations

import contextvars
from types import SimpleNamespace

import pytest

from trio_direct.config import ServeConfig
from trio_direct.core.output import ChoiceResult
from trio_direct.core.plan import OutputOptions, Prompt, RequestPlan, plan_request
from trio_direct.engine import vllm
from trio_direct.engine.types import GenerateChunk, SamplingOptions
from trio_direct.text.tokenizer import ModelTokenizer

ANSWER = "It is 22C and sunny in Paris."


@pytest.fixture(scope="module")
def tokenizer(tiny_model) -> ModelTokenizer:
    return ModelTokenizer.from_directory(tiny_model)


def planned(tokenizer: ModelTokenizer, *, ignore_eos: bool = False) -> RequestPlan:
    """A chat turn as the surfaces plan it: EOS among the stop ids unless `ignore_eos`, and special
    tokens kept in the text (as a tool parser that reads the model's markup asks)."""
    pool = SimpleNamespace(is_embedding=False, config=ServeConfig(), context_length=None, name="m", tokenizer=tokenizer)
    stops = () if ignore_eos else tuple(sorted(tokenizer.eos_token_ids))
    sampling = SamplingOptions(max_new_tokens=64, stop_token_ids=stops, ignore_eos=ignore_eos or None)
    prompt = Prompt(tokenizer.encode("What is the weather in Paris?"), "What is the weather in Paris?")
    # In a copy of the context: planned outside a request, plan_request sets the request id for
    # the log, which would otherwise stay in this thread's context and in every test after it.
    return contextvars.copy_context().run(
        plan_request, pool, [prompt], sampling, id_prefix="chatcmpl-", output=OutputOptions(skip_special_tokens=False)
    )


def vllm_stream(ids: list[int], finish: str = "stop") -> list[GenerateChunk]:
    """The chunks vLLM's servicer makes of a streamed request: one delta per step, then a
    `complete` repeating the last delta (its EOS id named as the matched stop when it stopped)."""
    decoder = vllm._ChunkDecoder(stream=True)
    messages = [
        vllm.pb.GenerateResponse(chunk=vllm.pb.GenerateStreamChunk(token_ids=[i], prompt_tokens=9)) for i in ids
    ]
    complete = vllm.pb.GenerateComplete(output_ids=ids[-1:], finish_reason=finish, prompt_tokens=9)
    if finish == "stop":
        complete.matched_token_id = ids[-1]
    messages.append(vllm.pb.GenerateResponse(complete=complete))
    return [chunk for message in messages if (chunk := decoder.decode(message)) is not None]


def text_of(plan: RequestPlan, batches: list[list[GenerateChunk]]) -> tuple[str, str | None]:
    output = plan.choices[0].output
    result = ChoiceResult(0)
    for batch in batches:
        result.add(output.push(batch))
    return result.text, result.finish_reason


@pytest.mark.parametrize("split", ["one message per read", "every message in one read", "eos alone"])
def test_the_eos_that_ends_a_vllm_stream_never_reaches_the_text(tokenizer, split):
    eos = min(tokenizer.eos_token_ids)
    chunks = vllm_stream([*tokenizer.encode(ANSWER, add_special_tokens=False), eos])
    batches = {
        "one message per read": [[chunk] for chunk in chunks],
        "every message in one read": [chunks],
        "eos alone": [chunks[:-2], [chunks[-2]], [chunks[-1]]],
    }[split]
    assert text_of(planned(tokenizer), batches) == (ANSWER, "stop")


def test_the_eos_that_ends_a_native_stream_never_reaches_the_text(tokenizer):
    eos = min(tokenizer.eos_token_ids)
    ids = [*tokenizer.encode(ANSWER, add_special_tokens=False), eos]
    # SGLang's native API sends the EOS with the finish, in one message; here with no matched id
    # named, as vLLM reports a stop on the model's own EOS.
    chunks = [GenerateChunk(token_ids=[i]) for i in ids[:-1]]
    chunks.append(GenerateChunk(token_ids=ids[-1:], finish_reason="stop"))
    assert text_of(planned(tokenizer), [[chunk] for chunk in chunks]) == (ANSWER, "stop")


def test_an_eos_the_stream_goes_on_after_is_text_when_eos_is_ignored_or_not_last(tokenizer):
    eos = min(tokenizer.eos_token_ids)
    words = tokenizer.encode(ANSWER, add_special_tokens=False)
    ids = [*words[:3], eos, *words[3:]]
    eos_text = tokenizer.decode([eos], skip_special_tokens=False)
    expected = tokenizer.decode(ids, skip_special_tokens=False)
    assert eos_text in expected
    for ignore_eos in (True, False):  # held back while it could end the stream, then released
        chunks = vllm_stream(ids, finish="length")
        assert text_of(planned(tokenizer, ignore_eos=ignore_eos), [[chunk] for chunk in chunks]) == (
            expected,
            "length",
        )
