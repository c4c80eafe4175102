"""Migration of a broken stream, sans-IO: which failures move a stream to another engine, and the
request that continues it there.

When an engine fails after a choice's first output (the connection lost, the engine killed or
hung, UNAVAILABLE, an INTERNAL error mid-stream), the choice continues on another engine: the
original prompt plus every token generated so far is the new prompt, `max_new_tokens` (and
`min_new_tokens`) shrink by what was generated, sampling is otherwise the same, and the request gets
a fresh rid. The client sees one stream: the choice's `ChoiceOutput` (detokenizer, stop strings,
parsers) reads the continuation's tokens as the rest of the same stream.

Not migrated: failures that are the request's own (INVALID_ARGUMENT and the like), capacity refusals
(RESOURCE_EXHAUSTED), a stream the engine cancelled (an operator's Abort), and guided decoding (JSON
schema, regex, EBNF, structural tag): the engine would restart its grammar at the continuation and
corrupt the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from trio_direct.engine.errors import EngineError, EngineInternal, EngineStalled, EngineUnavailable
from trio_direct.engine.types import GenerateInput

__all__ = ["continuation_request", "migration_refusal"]

#: Failures of the engine, not of the request: worth continuing elsewhere.
_ENGINE_FAILURES = (EngineUnavailable, EngineStalled, EngineInternal)


def migration_refusal(request: GenerateInput, error: EngineError) -> str | None:
    """Why a stream broken by `error` may not continue elsewhere; None when it may."""
    if not isinstance(error, _ENGINE_FAILURES):
        return f"{error.status} is not an engine failure"
    sampling = request.sampling
    if sampling.json_schema is not None or sampling.regex is not None or sampling.ebnf is not None:
        return "guided decoding cannot resume mid-output"
    if sampling.structural_tag is not None:
        return "guided decoding cannot resume mid-output"
    return None


def continuation_request(
    request: GenerateInput, prompt_ids: Sequence[int], generated: list[int], rid: str
) -> GenerateInput | None:
    """The request that continues `request` after `generated`; None when its budget is spent (the
    stream then ends with finish reason ``length``)."""
    sampling = request.sampling
    count = len(generated)
    max_new = sampling.max_new_tokens
    if max_new is not None:
        max_new -= count
        if max_new <= 0:
            return None
    min_new = sampling.min_new_tokens
    if min_new is not None:
        min_new = max(min_new - count, 0)
    return replace(
        request,
        rid=rid,
        input_ids=[*prompt_ids, *generated],
        sampling=replace(sampling, max_new_tokens=max_new, min_new_tokens=min_new),
        bootstrap=None,
        kv_transfer_params=None,
        routed_dp_rank=None,
        trace_headers=None,
    )
