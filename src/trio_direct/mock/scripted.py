"""Scripted outputs: the mock answers chosen prompts with fixed text instead of sampled tokens.

For tests of what the frontend does with a model's *text* (reasoning sections, tool-call markup,
stop strings): a JSON file of ``[{"match": "substring of the prompt" | null, "text": "..."}]``;
the first entry whose ``match`` occurs in the decoded prompt (or is null) gives the output, which is
then followed by EOS. Prompts no entry matches are sampled as usual.

An entry with ``"resumable": true`` answers like a model asked to continue its own answer: a prompt
that already ends with the start of the text gets only the rest of it (a stream that the frontend
moved to another engine mid-way, whose new prompt repeats the tokens produced so far).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer


class ScriptedOutputs:
    def __init__(self, entries: list[dict[str, Any]], tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._entries = [
            (
                entry.get("match"),
                tuple(tokenizer.encode(entry["text"], add_special_tokens=False).ids),
                bool(entry.get("resumable")),
            )
            for entry in entries
        ]

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Tokenizer | None) -> ScriptedOutputs:
        if tokenizer is None:
            raise ValueError("--scripted-outputs needs a model directory with a tokenizer.json")
        entries = json.loads(Path(path).read_text())
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("text"), str) for e in entries
        ):
            raise ValueError(f'{path}: expected a list of {{"match": str | null, "text": str}}')
        return cls(entries, tokenizer)

    def tokens_for(self, input_ids: list[int]) -> tuple[int, ...] | None:
        prompt = self._tokenizer.decode(input_ids, skip_special_tokens=False)
        for match, tokens, resumable in self._entries:
            if match is None or match in prompt:
                return tokens[_produced(input_ids, tokens) :] if resumable else tokens
        return None


def _produced(input_ids: list[int], tokens: tuple[int, ...]) -> int:
    """How many leading `tokens` the prompt already ends with (the longest such run)."""
    for count in range(min(len(tokens), len(input_ids)), 0, -1):
        if tuple(input_ids[-count:]) == tokens[:count]:
            return count
    return 0
