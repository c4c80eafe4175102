"""How long the mock engine pretends a forward pass takes.

Dynamo's mocker polynomial defaults (``dynamo.mocker`` in ai-dynamo 1.6), so latency curves from the mock have
the shape of a real engine's: prefill grows with the uncached tokens of the batch, a decode
step with how full the KV cache is. Everything is divided by ``speedup``; ``inf`` makes the
engine as fast as its scheduler code.
"""

from __future__ import annotations

import math

__all__ = ["TimingModel", "decode_step_ms", "prefill_ms"]


def prefill_ms(tokens: int) -> float:
    """Milliseconds to prefill ``tokens`` uncached prompt tokens (0 tokens cost nothing)."""
    if tokens <= 0:
        return 0.0
    return 4.209989e-7 * tokens * tokens + 1.518344e-2 * tokens + 16.50142


def decode_step_ms(kv_usage: float) -> float:
    """Milliseconds of one decode step at KV usage fraction ``kv_usage`` (floor 1 ms)."""
    return max(1.0, -25.74 * kv_usage * kv_usage + 54.01 * kv_usage + 5.74)


class TimingModel:
    """The polynomial model in seconds, divided by ``speedup``."""

    __slots__ = ("_scale", "speedup")

    def __init__(self, speedup: float = 1.0) -> None:
        if not speedup > 0:  # also rejects NaN
            raise ValueError(f"speedup must be > 0, got {speedup!r}")
        self.speedup = speedup
        self._scale = 0.0 if math.isinf(speedup) else 1e-3 / speedup

    def prefill_seconds(self, tokens: int) -> float:
        """Seconds to prefill ``tokens`` uncached tokens in one batch."""
        return prefill_ms(tokens) * self._scale if self._scale else 0.0

    def decode_seconds(self, kv_usage: float) -> float:
        """Seconds of one decode step at KV usage fraction ``kv_usage``."""
        return decode_step_ms(kv_usage) * self._scale if self._scale else 0.0
