"""What the engine is asked for, given what the client asked for."""

from __future__ import annotations

import json

from trio_direct.engine.types import SamplingOptions
from trio_direct.openai.requests import decode_chat_request, decode_completion_request
from trio_direct.openai.sampling import logprob_options, sampling_options, stop_strings

EOS = {2, 7}


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return decode_chat_request(json.dumps(body).encode())


def completion(**fields):
    return decode_completion_request(json.dumps({"model": "m", "prompt": "hi", **fields}).encode())


def test_unset_values_stay_engine_defaults_and_eos_stops_generation():
    options = sampling_options(chat(), eos_token_ids=EOS)
    assert options == SamplingOptions(stop_token_ids=(2, 7))


def test_every_sampling_field_reaches_the_engine():
    options = sampling_options(
        chat(
            temperature=0,
            top_p=0.5,
            top_k=40,
            min_p=0.1,
            presence_penalty=0.25,
            frequency_penalty=-0.25,
            repetition_penalty=1.2,
            max_tokens=50,
            min_tokens=3,
            seed=11,
            stop=["END", "\n\n"],
            stop_token_ids=[9, 7],
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
        ),
        eos_token_ids=EOS,
    )
    assert options.temperature == 0  # greedy survives: 0 is not "unset"
    assert (options.top_p, options.top_k, options.min_p) == (0.5, 40, 0.1)
    assert (options.presence_penalty, options.frequency_penalty, options.repetition_penalty) == (0.25, -0.25, 1.2)
    assert (options.max_new_tokens, options.min_new_tokens, options.seed) == (50, 3, 11)
    assert tuple(options.stop) == ("END", "\n\n")
    assert tuple(options.stop_token_ids) == (9, 7, 2)
    assert options.skip_special_tokens is False and options.spaces_between_special_tokens is False


def test_max_completion_tokens_wins_over_max_tokens():
    assert sampling_options(chat(max_tokens=10, max_completion_tokens=20), eos_token_ids=()).max_new_tokens == 20
    assert sampling_options(chat(max_tokens=10), eos_token_ids=(), default_max_tokens=99).max_new_tokens == 10
    assert sampling_options(chat(), eos_token_ids=(), default_max_tokens=99).max_new_tokens == 99


def test_completions_default_to_16_tokens():
    assert sampling_options(completion(), eos_token_ids=(), default_max_tokens=99).max_new_tokens == 16


def test_ignore_eos_keeps_eos_out_of_stop_tokens():
    options = sampling_options(completion(ignore_eos=True, stop_token_ids=[5]), eos_token_ids=EOS)
    assert options.ignore_eos is True
    assert tuple(options.stop_token_ids) == (5,)


def test_top_k_zero_means_disabled():
    assert sampling_options(chat(top_k=0), eos_token_ids=()).top_k == -1
    assert sampling_options(chat(top_k=-1), eos_token_ids=()).top_k == -1


def test_json_object_becomes_an_object_schema():
    options = sampling_options(chat(response_format={"type": "json_object"}), eos_token_ids=())
    assert options.json_schema is not None and json.loads(options.json_schema) == {"type": "object"}
    assert options.regex is None and options.ebnf is None


def test_json_schema_is_sent_as_json_text():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    request = chat(response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    sent = sampling_options(request, eos_token_ids=()).json_schema
    assert sent is not None and json.loads(sent) == schema


def test_text_response_format_is_no_constraint():
    options = sampling_options(chat(response_format={"type": "text"}), eos_token_ids=())
    assert options.json_schema is None


def test_regex_and_ebnf_extras():
    assert sampling_options(chat(regex="[0-9]+"), eos_token_ids=()).regex == "[0-9]+"
    assert sampling_options(completion(ebnf='root ::= "a"'), eos_token_ids=()).ebnf == 'root ::= "a"'


def test_stop_strings_from_either_shape():
    assert stop_strings(chat()) == ()
    assert stop_strings(chat(stop="x")) == ("x",)
    assert stop_strings(completion(stop=["a", "b"])) == ("a", "b")


def test_logprob_options():
    assert logprob_options(chat()) == (False, 0)
    assert logprob_options(chat(logprobs=True)) == (True, 0)
    assert logprob_options(chat(logprobs=True, top_logprobs=5)) == (True, 5)
    assert logprob_options(completion()) == (False, 0)
    assert logprob_options(completion(logprobs=0)) == (True, 0)
    assert logprob_options(completion(logprobs=3)) == (True, 3)
