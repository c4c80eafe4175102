"""Continuous batching of the mock engine, seen through what a client would observe."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Literal

import pytest

from trio_direct.mock.kv_types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    block_hash_chain,
)
from trio_direct.mock.scheduler import (
    Finish,
    MockRequest,
    RequestOutput,
    Scheduler,
    SchedulerConfig,
    StepResult,
)
from trio_direct.mock.timing import TimingModel

EOS = 0
PD_CHOICES: list[Literal["none", "prefill", "decode"]] = ["none", "none", "prefill", "decode"]


def make(**overrides: object) -> Scheduler:
    config = {"vocab_size": 1000, "eos_token_ids": frozenset({EOS}), "speedup": math.inf}
    config.update(overrides)
    return Scheduler(SchedulerConfig(**config))  # type: ignore[arg-type]


def prompt(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


Tokens = dict[str, list[int]]


def run(sched: Scheduler, max_steps: int = 10_000) -> tuple[Tokens, dict[str, RequestOutput]]:
    """Step until idle; returns every request's tokens and its final output."""
    tokens: dict[str, list[int]] = {}
    final: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        result = sched.step()
        if result is None:
            return tokens, final
        for out in result.outputs:
            assert out.rid not in final, "output after the final one"
            tokens.setdefault(out.rid, []).extend(out.new_token_ids)
            if out.finish is not None:
                final[out.rid] = out
    raise AssertionError("scheduler never went idle")


def generate(sched: Scheduler, req: MockRequest) -> tuple[list[int], RequestOutput]:
    sched.add(req)
    tokens, final = run(sched)
    return tokens.get(req.rid, []), final[req.rid]


# -- outputs and finish reasons ------------------------------------------------------------


def test_prefill_step_yields_the_first_token_then_one_per_decode_step() -> None:
    sched = make()
    sched.add(MockRequest("a", prompt(8), 3))
    first = sched.step()
    assert first is not None and len(first.outputs) == 1
    assert first.outputs[0].completion_tokens == 1 and first.outputs[0].finish is None
    second = sched.step()
    assert second is not None and second.outputs[0].completion_tokens == 2
    third = sched.step()
    assert third is not None
    assert third.outputs[0].finish == Finish("length", length=3)
    assert third.outputs[0].prompt_tokens == 8
    assert sched.step() is None
    assert not sched.has_work


def test_same_seed_and_prompt_give_the_same_tokens_on_any_engine() -> None:
    req = MockRequest("a", prompt(16), 20, ignore_eos=True, seed=7)
    a, _ = generate(make(), req)
    b, _ = generate(make(max_running_requests=1), replace(req, rid="zzz"))
    other_seed, _ = generate(make(), replace(req, seed=8))
    other_prompt, _ = generate(make(), replace(req, input_ids=prompt(16, start=2)))
    assert a == b
    assert a != other_seed
    assert a != other_prompt
    assert len(set(a)) > 10  # not a constant stream


def test_a_variation_changes_the_tokens_but_not_where_the_answer_stops() -> None:
    # Without a seed, each sample brings its own variation (the engine draws one per sample).
    outcomes = {}
    for variation in (None, 1, 2):
        req = MockRequest("a", prompt(9), 3000, variation=variation, stop_token_ids=frozenset({7}))
        outcomes[variation] = generate(make(), req)
    (plain, plain_end), (one, one_end), (two, two_end) = outcomes.values()
    assert len(plain) == len(one) == len(two) < 3000  # a stop is sampled, at the same step each time
    assert plain_end.finish == one_end.finish == two_end.finish
    assert plain_end.finish is not None and plain_end.finish.kind == "stop"
    assert plain[-1] == one[-1] == two[-1]
    assert plain[:-1] != one[:-1] != two[:-1] and plain[:-1] != two[:-1]
    assert not {EOS, 7} & set(one[:-1] + two[:-1])  # the variation's own tokens never stop


def test_a_seed_or_greedy_sampling_leaves_no_room_for_a_variation() -> None:
    seeded = MockRequest("a", prompt(9), 40, ignore_eos=True, seed=5)
    assert generate(make(), seeded)[0] == generate(make(), replace(seeded, variation=99))[0]
    greedy = MockRequest("a", prompt(9), 40, ignore_eos=True, temperature=0.0)
    assert generate(make(), greedy)[0] == generate(make(), replace(greedy, variation=99))[0]


def test_greedy_requests_ignore_the_seed() -> None:
    req = MockRequest("a", prompt(5), 10, ignore_eos=True, temperature=0.0, seed=1)
    a, _ = generate(make(), req)
    b, _ = generate(make(), replace(req, seed=2))
    assert a == b


def test_special_tokens_are_never_sampled_but_eos_is() -> None:
    sched = make(vocab_size=6, special_token_ids=frozenset({EOS, 1, 2, 3}))
    tokens, final = generate(sched, MockRequest("a", prompt(4), 200, ignore_eos=True, seed=3))
    assert set(tokens) == {EOS, 4, 5}
    assert final.finish == Finish("length", length=200)


def test_eos_finishes_with_stop_and_the_eos_id() -> None:
    tokens, final = generate(make(vocab_size=4), MockRequest("a", prompt(4), 500))
    assert tokens[-1] == EOS and EOS not in tokens[:-1]
    assert final.finish == Finish("stop", matched=EOS)
    assert final.completion_tokens == len(tokens)


def test_stop_token_ids_finish_like_eos() -> None:
    sched = make(vocab_size=4, eos_token_ids=frozenset())
    tokens, final = generate(sched, MockRequest("a", prompt(4), 500, stop_token_ids=frozenset({2})))
    assert tokens[-1] == 2 and 2 not in tokens[:-1]
    assert final.finish == Finish("stop", matched=2)


def test_min_new_tokens_keeps_eos_and_stop_ids_out_until_reached() -> None:
    sched = make(vocab_size=3)
    req = MockRequest("a", prompt(4), 500, min_new_tokens=30, stop_token_ids=frozenset({1}))
    tokens, final = generate(sched, req)
    assert len(tokens) > 30
    assert set(tokens[:30]) == {2}
    assert final.finish is not None and final.finish.kind == "stop"


def test_ignore_eos_disables_eos_and_stop_ids() -> None:
    sched = make(vocab_size=4)
    req = MockRequest("a", prompt(4), 100, ignore_eos=True, stop_token_ids=frozenset({1}))
    tokens, final = generate(sched, req)
    assert EOS in tokens and 1 in tokens
    assert final.finish == Finish("length", length=100)


def test_stop_strings_match_anywhere_in_the_decoded_text() -> None:
    def decode(ids: list[int]) -> str:
        return "".join("abcd"[i % 4] for i in ids)

    sched = Scheduler(SchedulerConfig(vocab_size=4, speedup=math.inf), decode_text=decode)
    tokens, final = generate(sched, MockRequest("a", prompt(4), 500, stop_strings=("xyz", "dc")))
    assert final.finish == Finish("stop", matched="dc")
    assert decode(tokens).endswith("dc") and "dc" not in decode(tokens[:-1])


def test_stop_strings_need_a_decoder() -> None:
    sched = make(vocab_size=4, eos_token_ids=frozenset())
    _, final = generate(sched, MockRequest("a", prompt(4), 50, stop_strings=("a",)))
    assert final.finish == Finish("length", length=50)


def test_max_new_tokens_none_runs_to_the_context_length() -> None:
    sched = make(context_length=40, eos_token_ids=frozenset())
    tokens, final = generate(sched, MockRequest("a", prompt(30), None))
    assert len(tokens) == 10
    assert final.finish == Finish("length", length=10)


def test_zero_max_new_tokens_prefills_and_returns_nothing() -> None:
    sched = make()
    tokens, final = generate(sched, MockRequest("a", prompt(10), 0))
    assert tokens == []
    assert final.finish == Finish("length", length=0)
    assert final.completion_tokens == 0


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (
            MockRequest("a", prompt(64), 1),
            "The input (64 tokens) is longer than the model's context length (64 tokens).",
        ),
        (
            MockRequest("a", prompt(40), 30),
            (
                "Requested token count exceeds the model's maximum context length of 64 tokens. "
                "You requested a total of 70 tokens: 40 tokens from the input messages and 30 "
                "tokens for the completion. Please reduce the number of tokens"
            ),
        ),
        (MockRequest("a", [], 1), "should not be empty"),
        (MockRequest("a", prompt(4), 2, min_new_tokens=3), "min_new_tokens"),
        (MockRequest("a", [-1], 2), "input_ids"),
    ],
)
def test_requests_that_can_never_run_are_refused(req: MockRequest, message: str) -> None:
    sched = make(context_length=64)
    with pytest.raises(ValueError, match=re.escape(message)):
        sched.add(req)
    assert not sched.has_work


def test_prompt_larger_than_the_kv_pool_is_refused_and_duplicates_too() -> None:
    sched = make(num_blocks=8, page_size=2)
    with pytest.raises(ValueError, match="exceeds the maximum allowed length"):
        sched.add(MockRequest("a", prompt(16), 1))
    sched.add(MockRequest("b", prompt(4), 1))
    with pytest.raises(ValueError, match="Duplicate"):
        sched.add(MockRequest("b", prompt(4), 1))


# -- prefix cache ------------------------------------------------------------------------


def test_prefix_hits_are_reported_as_cached_tokens() -> None:
    sched = make(page_size=4)
    system = prompt(18)
    _, first = generate(sched, MockRequest("a", system + [500, 501], 3))
    assert first.cached_tokens == 0
    _, second = generate(sched, MockRequest("b", system + [600, 601, 602], 3))
    assert second.cached_tokens == 16  # full pages of the shared 18 tokens
    _, again = generate(sched, MockRequest("c", prompt(8), 3))
    assert again.cached_tokens == 4  # at least one token is always computed
    assert sched.load()["cache_hit_rate"] == pytest.approx(20 / (20 + 21 + 8), abs=1e-4)


def test_prefill_time_counts_only_uncached_tokens() -> None:
    sched = make(speedup=1.0)
    timing = TimingModel(1.0)
    sched.add(MockRequest("a", prompt(100), 1))
    first = sched.step()
    assert first is not None and first.seconds == pytest.approx(timing.prefill_seconds(100))
    sched.add(MockRequest("b", prompt(120), 1))
    second = sched.step()
    assert second is not None and second.seconds == pytest.approx(timing.prefill_seconds(20))


def test_decode_time_follows_kv_usage() -> None:
    sched = make(speedup=1.0, num_blocks=100)
    sched.add(MockRequest("a", prompt(49), 5))
    sched.step()
    result = sched.step()
    assert result is not None
    assert result.seconds == pytest.approx(TimingModel(1.0).decode_seconds(50 / 100))


def test_prefill_publishes_the_prompt_pages_with_sglang_hashes() -> None:
    sched = make(page_size=2)
    sched.add(MockRequest("a", [1, 2, 3, 4, 5], 1))
    result = sched.step()
    assert result is not None
    hashes, _ = block_hash_chain([1, 2, 3, 4], 2)
    assert result.kv_events == [BlockStored(tuple(hashes), None, (1, 2, 3, 4), 2)]


def test_finished_sequences_stay_cached_and_free_their_pages() -> None:
    sched = make(page_size=1, num_blocks=64)
    tokens, _ = generate(sched, MockRequest("a", prompt(10), 6, ignore_eos=True))
    cache = sched.cache
    assert cache.allocated_pages == 0 and cache.active_pages == 0
    # The KV of prompt and output, less the last sampled token, is reusable.
    assert cache.cached_pages == 10 + 6 - 1
    assert cache.match_prefix(prompt(10) + tokens)[0] == 15
    assert sched.load()["num_used_tokens"] == 0


def test_new_requests_evict_cold_cached_pages_and_say_so() -> None:
    sched = make(num_blocks=16, page_size=4, eos_token_ids=frozenset())
    generate(sched, MockRequest("a", prompt(16), 1))  # 4 cached pages
    generate(sched, MockRequest("b", prompt(48, start=100), 1))  # 12 more: the pool is full
    cold = set(block_hash_chain(prompt(16), 4)[0])
    sched.add(MockRequest("c", prompt(16, start=500), 1))
    result = sched.step()
    assert result is not None
    removed = [h for e in result.kv_events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert set(removed) == cold  # a's pages, the least recently used
    assert sched.cache.match_prefix(prompt(48, start=100))[0] == 48


def test_flush_cache_is_refused_while_requests_are_in_flight() -> None:
    sched = make()
    sched.add(MockRequest("a", prompt(10), 2))
    sched.step()
    assert sched.flush_cache() is None
    run(sched)
    assert sched.flush_cache() == [AllBlocksCleared()]
    assert sched.cache.cached_pages == 0


# -- batching ------------------------------------------------------------------------------


def test_running_cap_limits_the_batch() -> None:
    sched = make(max_running_requests=2)
    for rid in "abc":
        sched.add(MockRequest(rid, prompt(5, start=ord(rid)), 3, ignore_eos=True))
    first = sched.step()
    assert first is not None and [o.rid for o in first.outputs] == ["a", "b"]
    assert (sched.num_running, sched.num_waiting) == (2, 1)
    second = sched.step()  # c cannot be admitted: a decode step
    assert second is not None and [o.rid for o in second.outputs] == ["a", "b"]
    sched.step()  # a and b finish
    fourth = sched.step()
    assert fourth is not None and [o.rid for o in fourth.outputs] == ["c"]


def test_prefill_token_budget_splits_batches_and_admits_a_big_prompt_alone() -> None:
    sched = make(max_prefill_tokens=10)
    sched.add(MockRequest("big", prompt(30), 5))
    sched.add(MockRequest("a", prompt(6, start=100), 5))
    sched.add(MockRequest("b", prompt(4, start=200), 5))
    sched.add(MockRequest("c", prompt(6, start=300), 5))
    batches = []
    for _ in range(3):
        result = sched.step()
        assert result is not None
        batches.append([o.rid for o in result.outputs if o.completion_tokens == 1])
    assert batches == [["big"], ["a", "b"], ["c"]]


def test_waiting_requests_wait_for_memory_and_all_finish() -> None:
    sched = make(num_blocks=40, eos_token_ids=frozenset())
    for i in range(4):
        sched.add(MockRequest(f"r{i}", prompt(12, start=100 * i + 1), 4))
    first = sched.step()
    assert first is not None
    assert len(first.outputs) < 4  # not everything fits at once
    _, final = run(sched)
    assert sorted(final) == ["r0", "r1", "r2", "r3"]
    assert all(out.finish == Finish("length", length=4) for out in final.values())
    assert sched.cache.allocated_pages == 0


def test_memory_pressure_retracts_without_changing_any_output() -> None:
    """Whatever the pool size, every request gets exactly the tokens it gets alone."""
    reqs = [MockRequest(f"r{i}", prompt(20 + 3 * i, start=50 * i + 1), 30, ignore_eos=True, seed=i) for i in range(6)]
    alone = {r.rid: generate(make(), replace(r))[0] for r in reqs}
    tight = make(num_blocks=150)  # far less than 6 x 50 tokens
    for r in reqs:
        tight.add(r)
    tokens, final = run(tight)
    assert tokens == alone
    assert all(out.finish == Finish("length", length=30) for out in final.values())
    assert tight.cache.allocated_pages == 0 and tight.cache.active_pages == 0


# -- abort -----------------------------------------------------------------------------------


def test_abort_cascades_over_rid_prefixes_and_frees_pages() -> None:
    sched = make()
    for rid in ("req-1", "req-10", "req-2"):
        sched.add(MockRequest(rid, prompt(10, start=len(rid)), 50, ignore_eos=True))
    sched.step()
    assert sched.cache.active_pages > 0
    assert sorted(sched.abort("req-1")) == ["req-1", "req-10"]
    result = sched.step()
    assert result is not None and [o.rid for o in result.outputs] == ["req-2"]
    assert sched.abort("req-2", prefix=False) == ["req-2"]
    assert sched.abort("req-2") == []
    assert sched.cache.active_pages == 0 and sched.cache.allocated_pages == 0
    assert sched.step() is None


def test_abort_exact_leaves_longer_rids_alone() -> None:
    sched = make()
    sched.add(MockRequest("x", prompt(4), 5))
    sched.add(MockRequest("x1", prompt(4), 5))
    assert sched.abort("x", prefix=False) == ["x"]
    assert sched.num_waiting == 1


def test_abort_all_with_the_empty_rid() -> None:
    sched = make(max_running_requests=1)
    for rid in "abc":
        sched.add(MockRequest(rid, prompt(4), 5))
    sched.add(MockRequest("d", prompt(4), 5, pd="decode"))
    sched.step()
    assert sorted(sched.abort("")) == ["a", "b", "c", "d"]
    assert (sched.num_running, sched.num_waiting, sched.has_work) == (0, 0, False)
    assert sched.cache.active_pages == 0


# -- prefill/decode disaggregation ----------------------------------------------------------


def test_pd_prefill_leg_holds_its_kv_until_transfer_done() -> None:
    sched = make()
    sched.add(MockRequest("p", prompt(10), 20, pd="prefill"))
    result = sched.step()
    assert result is not None
    assert result.outputs == [] and result.prefill_done == ["p"]
    assert sched.step() is None
    held = sched.cache.active_pages
    assert held >= 10
    final = sched.transfer_done("p")
    assert final == RequestOutput("p", [], Finish("length", length=0), 10, 0, 0)
    assert sched.cache.active_pages == 0
    assert sched.transfer_done("p") is None  # unknown now


def test_held_pd_kv_blocks_admission_until_transferred() -> None:
    sched = make(num_blocks=20)
    sched.add(MockRequest("p", prompt(15), 1, pd="prefill"))
    sched.step()
    sched.add(MockRequest("a", prompt(10, start=100), 2))
    assert sched.step() is None  # a does not fit next to p's KV
    assert sched.has_work and sched.num_waiting == 1
    sched.transfer_done("p")
    result = sched.step()
    assert result is not None and [o.rid for o in result.outputs] == ["a"]


def test_pd_decode_leg_waits_for_kv_then_decodes_the_same_tokens() -> None:
    req = MockRequest("d", prompt(12), 6, ignore_eos=True, seed=5)
    aggregated, _ = generate(make(), replace(req, rid="agg"))

    sched = make(speedup=1.0)
    sched.add(replace(req, pd="decode"))
    assert sched.step() is None
    assert (sched.num_waiting, sched.has_work) == (1, False)
    sched.kv_received("d")
    first = sched.step()
    assert first is not None
    assert first.outputs[0].cached_tokens == 12
    assert first.seconds == pytest.approx(TimingModel(1.0).decode_seconds(12 / 65536))
    tokens, final = run(sched)
    assert first.outputs[0].new_token_ids + tokens["d"] == aggregated
    assert final["d"].finish == Finish("length", length=6)


def test_pd_calls_in_the_wrong_state_are_refused() -> None:
    sched = make()
    sched.add(MockRequest("p", prompt(4), 5, pd="prefill"))
    with pytest.raises(ValueError):
        sched.transfer_done("p")  # not prefilled yet
    with pytest.raises(ValueError):
        sched.kv_received("p")
    sched.kv_received("gone")  # an aborted rid is not an error


# -- load ------------------------------------------------------------------------------------


def test_load_reports_sglang_core_keys() -> None:
    sched = make(num_blocks=1000, max_running_requests=4, dp_rank=3)
    sched.add(MockRequest("a", prompt(100), 10))
    sched.add(MockRequest("b", prompt(50, start=500), 10, pd="decode"))
    sched.step()
    load = sched.load()
    assert load == {
        "dp_rank": 3,
        "num_running_reqs": 1,
        "num_waiting_reqs": 1,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": 100,  # the sampled token has no KV until the next step
        "num_total_tokens": 100,
        "max_total_num_tokens": 1000,
        "max_running_requests": 4,
        "token_usage": 0.1,
        "cache_hit_rate": 0.0,
        "gen_throughput": 0.0,
        "utilization": 0.25,
    }


def test_step_result_shape() -> None:
    sched = make()
    sched.add(MockRequest("a", prompt(3), 1))
    result = sched.step()
    assert isinstance(result, StepResult)
    assert result.prefill_done == []


@pytest.mark.parametrize("seed", range(12))
def test_random_traffic_keeps_outputs_and_memory_consistent(seed: int) -> None:
    """Aborts, PD legs, retractions and eviction never change a request's tokens or leak KV."""
    import random

    rng = random.Random(seed)
    page_size = rng.choice([1, 4])
    pool = {"num_blocks": rng.choice([24, 60, 400]) // page_size, "page_size": page_size}
    sched = make(
        max_running_requests=rng.choice([2, 8]),
        max_prefill_tokens=rng.choice([16, 64]),
        vocab_size=50,
        **pool,
    )
    shared = prompt(12)
    reqs: dict[str, MockRequest] = {}
    tokens: Tokens = {}
    finals: dict[str, RequestOutput] = {}
    aborted: set[str] = set()
    held: list[str] = []

    def deliver(out: RequestOutput | None) -> None:
        if out is None:
            return
        assert out.rid not in finals and out.rid not in aborted
        tokens.setdefault(out.rid, []).extend(out.new_token_ids)
        if out.finish is not None:
            finals[out.rid] = out

    def step() -> bool:
        result = sched.step()
        if result is None:
            return False
        held.extend(result.prefill_done)
        for out in result.outputs:
            deliver(out)
        return True

    for i in range(150):
        op = rng.random()
        if op < 0.3:
            body = shared[: rng.randint(0, 12)] + prompt(rng.randint(1, 10), rng.randint(20, 40))
            pd = rng.choice(PD_CHOICES)
            req = MockRequest(f"r{i:03d}", body, rng.randint(0, 12), seed=rng.randint(0, 3), pd=pd)
            sched.add(req)
            reqs[req.rid] = req
            if req.pd == "decode":
                sched.kv_received(req.rid)
        elif op < 0.4 and reqs:
            victim = rng.choice(sorted(reqs))
            aborted.update(sched.abort(victim, prefix=rng.random() < 0.5))
        elif op < 0.5 and held:
            deliver(sched.transfer_done(held.pop(0)))
        else:
            step()
        cache = sched.cache
        assert cache.used_pages + cache.free_pages == cache.capacity
    while step() or held:
        while held:
            deliver(sched.transfer_done(held.pop(0)))

    assert sched.cache.allocated_pages == 0 and sched.cache.active_pages == 0
    assert set(finals) | aborted == set(reqs) and not set(finals) & aborted
    for rid, req in reqs.items():
        got = tokens.get(rid, [])
        # Alone on the same pool: a long request is clipped to the pool as SGLang does.
        alone, _ = generate(make(vocab_size=50, **pool), replace(req, pd="none"))
        if req.pd == "prefill":
            assert got == []
        else:
            assert got == alone[: len(got)]
            if rid in finals:
                assert got == alone and finals[rid].completion_tokens == len(got)
