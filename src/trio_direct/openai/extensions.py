"""SGLang's sampling extensions, accepted by every generation surface exactly as chat accepts them.

The Responses and Messages requests carry these fields under chat's names, so chat's rules check
them (`openai.requests.check_sampling`) and chat's mapping makes them the engine's sampling
(`openai.sampling.extension_sampling`); declaring them here gives each surface's decoder their
types, so a wrong type is reported at its path in that surface's request.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["SGLangExtensions"]


class SGLangExtensions(msgspec.Struct, kw_only=True):
    """The extras SGLang's OpenAI server takes beyond the upstream API (None: not given)."""

    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    regex: str | None = None
    ebnf: str | None = None
    separate_reasoning: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
