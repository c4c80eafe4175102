"""Trace loading, prompt synthesis and the synthetic multi-turn workload."""

from __future__ import annotations

import itertools
import json

import pytest
from support import TRACE_SAMPLE

from trio_direct.bench.trace import (
    BLOCK_SIZE,
    PromptSynthesizer,
    TraceRequest,
    cap_lengths,
    conversation_turns,
    load_trace,
    synthetic_multiturn,
)


def write_trace(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def trace_file(tmp_path):
    rows = [
        {"timestamp": 1000 * i + 500, "input_length": 600 + i, "output_length": 10 + i, "hash_ids": [0, 100 + i]}
        for i in range(10)
    ]
    return write_trace(tmp_path / "trace.jsonl", rows)


def request(input_length, hash_ids, output_length=4, index=0):
    return TraceRequest(
        index=index, arrival_s=0.0, input_length=input_length, output_length=output_length, hash_ids=tuple(hash_ids)
    )


def test_a_slice_starts_at_zero_and_keeps_trace_indices(trace_file):
    requests = load_trace(trace_file, start=3, limit=4)
    assert [r.index for r in requests] == [3, 4, 5, 6]
    assert [r.arrival_s for r in requests] == [0.0, 1.0, 2.0, 3.0]
    assert requests[0] == TraceRequest(index=3, arrival_s=0.0, input_length=603, output_length=13, hash_ids=(0, 103))


def test_conversation_sampling_keeps_every_turn_of_the_kept_conversations(tmp_path):
    # 40 conversations of 3 turns, interleaved in time; each turn repeats the earlier ones.
    rows: list[dict] = []
    for turn in range(3):
        for conversation in range(40):
            blocks = [0] + [1000 * conversation + t for t in range(turn + 1)]
            rows.append(
                {
                    "timestamp": 100 * len(rows),
                    "input_length": 512 * len(blocks),
                    "output_length": 1,
                    "hash_ids": blocks,
                }
            )
    path = write_trace(tmp_path / "conversations.jsonl", rows)
    kept = load_trace(path, conversation_fraction=0.25, seed=3)
    conversations = {r.hash_ids[1] for r in kept}
    assert 3 <= len(conversations) <= 20
    assert len(kept) == 3 * len(conversations), "every turn of a kept conversation is kept"
    assert kept[0].arrival_s == 0.0
    assert [r.index for r in load_trace(path, conversation_fraction=0.25, seed=3, start=1, limit=2)] == [
        r.index for r in kept[1:3]
    ], "start and limit count kept requests"
    assert {r.hash_ids[1] for r in load_trace(path, conversation_fraction=0.25, seed=4)} != conversations
    with pytest.raises(ValueError):
        load_trace(path, conversation_fraction=0.0)


def test_time_scale_stretches_or_compresses_arrivals(trace_file):
    assert [r.arrival_s for r in load_trace(trace_file, limit=3, time_scale=0.5)] == [0.0, 0.5, 1.0]
    assert [r.arrival_s for r in load_trace(trace_file, limit=3, time_scale=2)] == [0.0, 2.0, 4.0]
    assert {r.arrival_s for r in load_trace(trace_file, time_scale=0)} == {0.0}


def test_slices_past_the_end_are_short_or_empty(trace_file):
    assert len(load_trace(trace_file, start=8)) == 2
    assert load_trace(trace_file, start=50) == []
    assert load_trace(trace_file, limit=0) == []


def test_a_trace_line_whose_blocks_cannot_hold_its_prompt_is_rejected(tmp_path):
    row = {"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}
    path = write_trace(tmp_path / "bad.jsonl", [row])
    with pytest.raises(ValueError, match="cannot cover"):
        load_trace(path)


def test_the_mooncake_trace_sample_loads():
    path = TRACE_SAMPLE
    requests = load_trace(path, limit=20)
    assert len(requests) == 20 and requests[0].arrival_s == 0.0
    assert all(r.hash_ids[0] == 0 for r in requests)  # the trace's shared first block


def test_equal_hash_ids_give_equal_token_blocks():
    synth = PromptSynthesizer(low=3, high=724, avoid={0, 1, 2})
    a = synth.prompt(request(1200, [7, 8, 9]))
    b = synth.prompt(request(700, [7, 8]))
    c = synth.prompt(request(1100, [7, 5, 9]))
    assert a[:700] == b
    assert a[:BLOCK_SIZE] == c[:BLOCK_SIZE]
    assert a[BLOCK_SIZE : 2 * BLOCK_SIZE] != c[BLOCK_SIZE : 2 * BLOCK_SIZE]
    # a fresh synthesizer (another process) gives the same tokens
    assert PromptSynthesizer(low=3, high=724, avoid={0, 1, 2}).prompt(request(1200, [7, 8, 9])) == a


def test_prompts_have_the_trace_length_and_stay_in_range():
    synth = PromptSynthesizer(low=10, high=40, avoid={20, 21})
    for length in (1, 511, 512, 513, 1500):
        ids = synth.prompt(request(length, range(3)))
        assert len(ids) == length
        assert all(10 <= t < 40 and t not in (20, 21) for t in ids)


def test_another_seed_gives_other_tokens_with_the_same_sharing():
    one, two = PromptSynthesizer(low=3, high=700), PromptSynthesizer(low=3, high=700, seed=1)
    assert one.prompt(request(512, [4])) != two.prompt(request(512, [4]))
    assert two.prompt(request(600, [4, 5]))[:512] == two.prompt(request(512, [4]))


def test_capping_truncates_prompts_and_answers_but_keeps_leading_blocks():
    requests = [request(2000, [1, 2, 3, 4], output_length=300), request(100, [1], output_length=5)]
    capped = cap_lengths(requests, max_input_tokens=600, max_output_tokens=32)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in capped] == [(600, 32, (1, 2)), (100, 5, (1,))]
    synth = PromptSynthesizer(low=3, high=700)
    assert synth.prompt(capped[0]) == synth.prompt(requests[0])[:600]


def test_synthetic_conversations_grow_turn_by_turn_over_shared_system_prompts():
    requests = synthetic_multiturn(
        6, 3, 2, system_prompt_blocks=1, first_user_tokens=200, user_tokens=100, output_tokens=50
    )
    assert len(requests) == 18
    assert [r.index for r in requests] == list(range(18))
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    assert all(r.output_length == 50 for r in requests)
    synth = PromptSynthesizer(low=3, high=700)
    conversations: dict[tuple[int, ...], list[TraceRequest]] = {}
    for r in requests:
        conversations.setdefault(r.hash_ids[:2], []).append(r)
    assert len(conversations) == 6
    for turns in conversations.values():
        assert [t.input_length for t in turns] == [712, 862, 1012]
        prompts = [synth.prompt(t) for t in turns]
        for earlier, later in itertools.pairwise(prompts):
            assert later[: len(earlier)] == earlier
    system_blocks = {r.hash_ids[0] for r in requests}
    assert system_blocks == {0, 1}


def test_conversations_become_chat_turns_that_each_add_the_blocks_new_since_the_turn_before():
    requests = [
        request(1024, [0, 5, 6], index=0),  # conversation 5, turn 1
        request(600, [0, 9], index=1),  # conversation 9: a single turn
        request(2048, [0, 5, 6, 7, 8], index=2),  # conversation 5 grows by two blocks
        request(1500, [0, 5, 6, 3], index=3),  # its last block was partial: it changed
        request(1500, [0, 5, 6, 3], index=4),  # a retry: nothing new, the last block again
    ]
    conversations = conversation_turns(requests, min_turns=2)
    assert len(conversations) == 1
    turns = conversations[0]
    assert [t.request.index for t in turns] == [0, 2, 3, 4]
    assert [t.new_blocks for t in turns] == [(5, 6), (7, 8), (3,), (3,)]
    assert [len(c) for c in conversation_turns(requests)] == [4, 1]


def test_the_trace_sample_has_multi_turn_conversations():
    path = TRACE_SAMPLE
    conversations = conversation_turns(load_trace(path, limit=600), min_turns=2)
    assert len(conversations) >= 25
    assert all(turn.new_blocks and 0 not in turn.new_blocks for chat in conversations for turn in chat)
