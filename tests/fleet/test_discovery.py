"""Turning a source's answers into joins and leaves: grace periods, flapping records, failed and
empty answers, changed entries; engine ids."""

from __future__ import annotations

import pytest

from trio_direct.fleet.discovery import EngineIds, EngineSpec, SourceState, address_of


def specs(*hosts: str, port: int = 30001) -> list[EngineSpec]:
    return [EngineSpec(f"grpc://{host}:{port}") for host in hosts]


def urls(engines) -> list[str]:
    return [spec.url for spec in engines]


def test_engines_join_as_soon_as_an_answer_names_them():
    state = SourceState("dns:x", grace=5)
    changes = state.observe(specs("10.0.0.1", "10.0.0.2"), now=0)
    assert urls(changes.added) == ["grpc://10.0.0.1:30001", "grpc://10.0.0.2:30001"] and not changes.removed
    assert not state.observe(specs("10.0.0.2", "10.0.0.1"), now=5)  # the same set in another order
    changes = state.observe(specs("10.0.0.1", "10.0.0.2", "10.0.0.3"), now=10)
    assert urls(changes.added) == ["grpc://10.0.0.3:30001"]


def test_an_engine_leaves_only_once_left_out_for_the_whole_grace_period():
    state = SourceState("dns:x", grace=5)
    state.observe(specs("a", "b"), now=0)
    assert not state.observe(specs("a"), now=1)  # missing since 1
    assert not state.observe(specs("a"), now=5.9)
    changes = state.observe(specs("a"), now=6)
    assert urls(changes.removed) == ["grpc://b:30001"] and not changes.added
    assert urls(state.specs) == ["grpc://a:30001"]
    assert not state.observe(specs("a"), now=20)  # gone once, not again


def test_with_no_grace_an_engine_leaves_with_the_first_answer_without_it():
    state = SourceState("file:x", grace=0, keep_when_empty=False)
    state.observe(specs("a", "b"), now=0)
    assert urls(state.observe(specs("a"), now=1).removed) == ["grpc://b:30001"]


def test_flapping_records_never_churn():
    state = SourceState("dns:x", grace=5)
    state.observe(specs("a", "b"), now=0)
    for t in range(1, 40, 2):  # b is missing in every other answer, never for the whole grace period
        assert not state.observe(specs("a"), now=t)
        assert not state.observe(specs("a", "b"), now=t + 1)
    assert urls(state.specs) == ["grpc://a:30001", "grpc://b:30001"]


def test_failed_and_empty_answers_keep_every_engine_and_hold_them():
    state = SourceState("dns:x", grace=1)
    state.observe(specs("a", "b"), now=0)
    assert not state.holding
    for t in range(1, 30):
        assert not state.observe(None if t % 2 else [], now=t)
        assert state.holding
    assert urls(state.specs) == ["grpc://a:30001", "grpc://b:30001"]
    assert not state.observe(specs("a", "b"), now=30)
    assert not state.holding


def test_a_removal_under_way_waits_while_the_answers_fail():
    state = SourceState("dns:x", grace=5)
    state.observe(specs("a", "b"), now=0)
    state.observe(specs("a"), now=1)  # b missing since 1
    assert not state.observe(None, now=10)  # a failed answer decides nothing
    assert urls(state.observe(specs("a"), now=11).removed) == ["grpc://b:30001"]  # confirmed, and long enough


def test_an_empty_file_means_no_engines():
    state = SourceState("file:x", grace=0, keep_when_empty=False)
    state.observe(specs("a"), now=0)
    assert urls(state.observe([], now=1).removed) == ["grpc://a:30001"]
    assert not state.holding


def test_an_entry_with_another_model_or_role_leaves_and_joins_again_at_once():
    state = SourceState("file:x", grace=60, keep_when_empty=False)
    state.observe([EngineSpec("grpc://a:1", model="m1")], now=0)
    changes = state.observe([EngineSpec("grpc://a:1", model="m2", role="prefill")], now=1)
    assert changes.removed == (EngineSpec("grpc://a:1", model="m1"),)
    assert changes.added == (EngineSpec("grpc://a:1", model="m2", role="prefill"),)


def test_a_repeated_address_in_one_answer_counts_once():
    state = SourceState("dns:x", grace=1)
    changes = state.observe([EngineSpec("grpc://A:1"), EngineSpec("a:1"), EngineSpec("http://a:1/")], now=0)
    assert urls(changes.added) == ["grpc://A:1"]


def test_a_forgotten_engine_joins_again_with_the_next_answer_that_names_it():
    state = SourceState("dns:x", grace=1)
    state.observe(specs("a"), now=0)
    state.observe(None, now=1)
    state.forget(address_of("grpc://a:30001"))
    assert urls(state.observe(specs("a"), now=2).added) == ["grpc://a:30001"]


def test_engine_ids_follow_first_appearance_and_are_never_reused():
    ids = EngineIds(first=2)
    assert [ids.allocate() for _ in range(3)] == ["e2", "e3", "e4"]


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("grpc://Host.Example:1", ("host.example", 1)),
        ("[::1]:7", ("::1", 7)),
        ("http://10.0.0.1:30001", ("10.0.0.1", 30001)),
    ],
)
def test_an_engine_is_known_by_host_and_port(url, address):
    assert address_of(url) == address
