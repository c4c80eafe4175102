"""`metrics.HistogramTally`: a series' observations tallied locally read as `observe` would make them."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram

from trio_direct.metrics import HistogramTally

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.1, 1.0)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (sample.name, sample.labels.get("le", "")): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, Histogram]:
    direct_registry, tallied_registry = CollectorRegistry(), CollectorRegistry()
    direct = Histogram("gap_seconds", "gaps", ["model"], buckets=BUCKETS, registry=direct_registry)
    tallied = Histogram("gap_seconds", "gaps", ["model"], buckets=BUCKETS, registry=tallied_registry)
    return direct_registry, direct.labels("m"), tallied_registry, tallied.labels("m")


def test_a_flushed_tally_reads_as_observe_would_make_it() -> None:
    """Every bucket and the sum, for amounts on, between and past the bounds (an amount equal to a
    bound counts in that bound's bucket, as `observe` counts it)."""
    direct_registry, direct, tallied_registry, series = _pair()
    tally = HistogramTally(series)
    rng = random.Random(4)
    amounts = [*BUCKETS, 0.0, 5.0, *(rng.choice([rng.uniform(0, 0.02), rng.uniform(0, 3)]) for _ in range(200))]
    for amount in amounts:
        direct.observe(amount)
        tally.observe(amount)
    tally.flush()
    tallied, direct_samples = _samples(tallied_registry), _samples(direct_registry)
    # The sum is added up in another order: equal to the last bits.
    assert tallied.pop(("gap_seconds_sum", "")) == pytest.approx(direct_samples.pop(("gap_seconds_sum", "")))
    assert tallied == direct_samples and tallied[("gap_seconds_count", "")] == len(amounts)
    tally.flush()  # nothing pending: nothing added twice
    assert _samples(tallied_registry)[("gap_seconds_count", "")] == len(amounts)


def test_a_tally_reaches_its_series_every_flush_every_observations() -> None:
    _, _, tallied_registry, series = _pair()
    tally = HistogramTally(series)
    for _ in range(HistogramTally.FLUSH_EVERY - 1):
        tally.observe(0.002)
    assert _samples(tallied_registry)[("gap_seconds_count", "")] == 0
    tally.observe(0.002)
    assert _samples(tallied_registry)[("gap_seconds_count", "")] == HistogramTally.FLUSH_EVERY
    assert _samples(tallied_registry)[("gap_seconds_bucket", "0.0025")] == HistogramTally.FLUSH_EVERY
