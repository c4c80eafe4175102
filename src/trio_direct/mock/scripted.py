"""Scripted outputs: the mock answers chosen prompts with fixed text instead of sampled tokens.

For tests of what the frontend does with a model's *text* (reasoning sections, tool-call markup,
stop strings): a JSON file of ``[{"match": "substring of the prompt" | null, "text": "..."}]``;
the first entry whose ``match`` occurs in the decoded prompt (or is null) gives the output, which is
then followed by EOS. Prompts no entry matches are sampled as usual.
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
            (entry.get("match"), tuple(tokenizer.encode(entry["text"], add_special_tokens=False).ids))
            for entry in entries
        ]

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Tokenizer | None) -> ScriptedOutputs:
        if tokenizer is None:
            raise ValueError("--scripted-outputs needs a model directory with a tokenizer.json")
        entries = json.loads(Path(path).read_text())
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("text"), str) for e in entries):
            raise ValueError(f"{path}: expected a list of {{\"match\": str | null, \"text\": str}}")
        return cls(entries, tokenizer)

    def tokens_for(self, input_ids: list[int]) -> tuple[int, ...] | None:
        prompt = self._tokenizer.decode(input_ids, skip_special_tokens=False)
        for match, tokens in self._entries:
            if match is None or match in prompt:
                return tokens
        return None
