"""The mock engine's polynomial timing model (Dynamo mocker defaults)."""

from __future__ import annotations

import math

import pytest

from trio_direct.mock.timing import TimingModel, decode_step_ms, prefill_ms


def test_prefill_polynomial() -> None:
    assert prefill_ms(0) == 0.0
    assert prefill_ms(1) == pytest.approx(4.209989e-7 + 1.518344e-2 + 16.50142)
    assert prefill_ms(1000) == pytest.approx(0.4209989 + 15.18344 + 16.50142)


def test_decode_polynomial_has_a_one_ms_floor() -> None:
    assert decode_step_ms(0.0) == pytest.approx(5.74)
    assert decode_step_ms(0.5) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)
    assert decode_step_ms(1.0) == pytest.approx(34.01)
    assert decode_step_ms(2.5) == 1.0


def test_speedup_divides_every_duration() -> None:
    model = TimingModel(speedup=4.0)
    assert model.prefill_seconds(1000) == pytest.approx(prefill_ms(1000) / 4000)
    assert model.decode_seconds(0.25) == pytest.approx(decode_step_ms(0.25) / 4000)
    assert TimingModel().prefill_seconds(0) == 0.0


def test_infinite_speedup_costs_nothing() -> None:
    model = TimingModel(speedup=math.inf)
    assert model.prefill_seconds(100_000) == 0.0
    assert model.decode_seconds(1.0) == 0.0


@pytest.mark.parametrize("speedup", [0.0, -1.0, math.nan])
def test_nonpositive_speedup_is_refused(speedup: float) -> None:
    with pytest.raises(ValueError):
        TimingModel(speedup)
