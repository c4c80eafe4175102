"""Deterministic log-probabilities for the mock's output tokens (it samples no real distribution).

Each chosen token gets a logprob in (-4, 0) derived from its id, and ``top_n`` alternatives whose
logprobs are lower, chosen token first, so clients see well-formed, repeatable numbers.
"""

from __future__ import annotations

#: One token's row: (logprob, token id, [(logprob, token id), ...] top alternatives).
TokenRow = tuple[float, int, list[tuple[float, int]]]


def _logprob(token_id: int) -> float:
    return -0.01 - ((token_id * 2654435761) % 1000) / 250.0


def token_rows(token_ids: list[int], top_n: int, vocab_size: int) -> list[TokenRow]:
    rows = []
    for token in token_ids:
        chosen = _logprob(token)
        top = [(chosen, token)]
        for k in range(1, top_n):
            other = (token + k * 7919) % max(vocab_size, 1)
            top.append((chosen - 0.5 * k, other))
        rows.append((chosen, token, top[:top_n]))
    return rows
