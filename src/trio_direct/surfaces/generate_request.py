"""SGLang's native `POST /generate` request (`GenerateReqInput`): its schema and validation.

The prompt is `text` or `input_ids`, one or a batch; `sampling_params` uses SGLang's names
(`max_new_tokens`, `min_new_tokens`, `stop`, `stop_token_ids`, `ignore_eos`, `no_stop_trim`,
`json_schema`, `regex`, `ebnf`, `structural_tag`, `sampling_seed`, `n`, ...); `rid` is the client's
id, echoed back (the engines get the frontend's own). Errors are 400s naming the `param`.

Refused rather than dropped, because they would change the answer: `input_embeds`, LoRA adapters,
hidden states, custom logit processors, sessions, `token_ids_logprob`, video and audio, prompt
logprobs (`logprob_start_len` other than -1), per-prompt `sampling_params` lists, `logit_bias` and
`custom_params`. `stream_interval` is accepted and ignored (every chunk is forwarded as it comes).
"""

from __future__ import annotations

import msgspec

from trio_direct.core.errors import invalid_request
from trio_direct.openai.bodies import convert_object
from trio_direct.openai.requests import (
    INT32_MAX,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    _check_range,
    _token_ids_ok,
    decode_object,
)

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "GenerateRequest",
    "GenerateSamplingParams",
    "decode_generate_request",
    "generate_prompts",
    "image_list",
    "is_batch",
    "stop_strings",
]

#: SGLang's `SamplingParams.max_new_tokens` default.
DEFAULT_MAX_NEW_TOKENS = 128

_UNSUPPORTED = {
    "input_embeds": "'input_embeds' is not supported: give 'text' or 'input_ids'.",
    "lora_path": "LoRA adapters ('lora_path') are not supported.",
    "lora_id": "LoRA adapters ('lora_id') are not supported.",
    "return_hidden_states": "'return_hidden_states' is not supported.",
    "custom_logit_processor": "'custom_logit_processor' is not supported.",
    "session_params": "'session_params' is not supported.",
    "token_ids_logprob": "'token_ids_logprob' is not supported.",
    "video_data": "'video_data' is not supported: this server takes text and images.",
    "audio_data": "'audio_data' is not supported: this server takes text and images.",
    "bootstrap_host": "'bootstrap_host' is not accepted: the frontend pairs prefill and decode engines itself.",
    "bootstrap_port": "'bootstrap_port' is not accepted: the frontend pairs prefill and decode engines itself.",
    "bootstrap_room": "'bootstrap_room' is not accepted: the frontend pairs prefill and decode engines itself.",
    "data_parallel_rank": "'data_parallel_rank' is not accepted: the frontend routes requests itself.",
}
_UNSUPPORTED_SAMPLING = {
    "logit_bias": "'sampling_params.logit_bias' is not supported.",
    "custom_params": "'sampling_params.custom_params' is not supported.",
}


class GenerateSamplingParams(msgspec.Struct, kw_only=True):
    """SGLang's `SamplingParams`, the fields the engines' gRPC APIs carry."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    sampling_seed: int | None = None
    stream_interval: int | None = None


class GenerateRequest(msgspec.Struct, kw_only=True):
    """`POST /generate`. `model` is optional (SGLang's server has one model): needed only when the
    frontend serves several."""

    text: str | list[str] | None = None
    input_ids: list[int | list[int]] | None = None
    sampling_params: GenerateSamplingParams = msgspec.field(default_factory=GenerateSamplingParams)
    rid: str | list[str] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    image_data: str | list[str] | None = None
    model: str | None = None


def decode_generate_request(body: bytes) -> GenerateRequest:
    """Parse and validate a `/generate` body; raises `ApiError` (400) on any problem."""
    raw = decode_object(body)
    for key, reason in _UNSUPPORTED.items():
        if raw.get(key) not in (None, False, [], ""):
            raise invalid_request(reason, param=key, code="unsupported_parameter")
    sampling = raw.get("sampling_params")
    if isinstance(sampling, list):
        raise invalid_request(
            "A list of 'sampling_params' (one per prompt) is not supported: give one object for every prompt.",
            param="sampling_params",
            code="unsupported_parameter",
        )
    if isinstance(sampling, dict):
        for key, reason in _UNSUPPORTED_SAMPLING.items():
            if sampling.get(key) not in (None, {}, []):
                raise invalid_request(reason, param=f"sampling_params.{key}", code="unsupported_parameter")
        raw["sampling_params"] = {key: value for key, value in sampling.items() if value is not None}
    request = convert_object(raw, GenerateRequest)
    _check_prompt(request)
    _check_sampling(request.sampling_params)
    _check_logprobs(request)
    return request


def generate_prompts(request: GenerateRequest) -> list[str | list[int]]:
    """The prompts of a (validated) request, one entry per prompt: text or token ids."""
    if request.text is not None:
        return [request.text] if isinstance(request.text, str) else list(request.text)
    ids = request.input_ids or []
    if ids and isinstance(ids[0], list):
        return list(ids)  # type: ignore[arg-type]
    return [ids]  # type: ignore[list-item]


def is_batch(request: GenerateRequest) -> bool:
    """Whether the prompt was given as a list of prompts (the answer is then a list)."""
    if request.text is not None:
        return isinstance(request.text, list)
    ids = request.input_ids or []
    return bool(ids) and isinstance(ids[0], list)


def _check_prompt(request: GenerateRequest) -> None:
    if (request.text is None) == (request.input_ids is None):
        raise invalid_request("Give exactly one of 'text' and 'input_ids'.", param="text")
    prompts = generate_prompts(request)
    param = "text" if request.text is not None else "input_ids"
    if not prompts:
        raise invalid_request(f"Invalid value for '{param}': expected at least one prompt.", param=param)
    for i, prompt in enumerate(prompts):
        where = f"{param}[{i}]" if is_batch(request) else param
        if isinstance(prompt, str):
            continue
        if not isinstance(prompt, list) or any(not isinstance(token, int) for token in prompt):
            raise invalid_request(f"Invalid type for '{where}': expected a list of token ids.", param=where)
        if not prompt:
            raise invalid_request(f"Invalid value for '{where}': the prompt must not be empty.", param=where)
        if _token_ids_ok(prompt):
            continue
        for token in prompt:
            if not 0 <= token <= INT32_MAX:
                raise invalid_request(
                    f"Invalid value for '{where}': token ids must be non-negative, got {token}.", param=where
                )
    rid = request.rid
    if isinstance(rid, list) and (not is_batch(request) or len(rid) != len(prompts)):
        raise invalid_request("'rid' must be a list of one id per prompt for a batch, else one id.", param="rid")
    if isinstance(rid, str) and is_batch(request):
        raise invalid_request("'rid' must be a list of one id per prompt for a batch.", param="rid")
    if request.image_data is not None and is_batch(request):
        raise invalid_request(
            "'image_data' is supported for a single prompt only.", param="image_data", code="unsupported_parameter"
        )


def _check_sampling(sp: GenerateSamplingParams) -> None:
    def check(value: float | None, name: str, low: float, high: float, *, low_open: bool = False) -> None:
        _check_range(value, f"sampling_params.{name}", low, high, low_open=low_open)

    check(sp.max_new_tokens, "max_new_tokens", 0, INT32_MAX)
    check(sp.min_new_tokens, "min_new_tokens", 0, INT32_MAX)
    if sp.min_new_tokens > sp.max_new_tokens:
        raise invalid_request(
            "'sampling_params.min_new_tokens' must not exceed 'max_new_tokens'.", param="sampling_params.min_new_tokens"
        )
    check(sp.temperature, "temperature", 0, 2**31)
    check(sp.top_p, "top_p", 0, 1, low_open=True)
    if sp.top_k is not None and sp.top_k != -1:
        check(sp.top_k, "top_k", 1, INT32_MAX)
    check(sp.min_p, "min_p", 0, 1)
    check(sp.frequency_penalty, "frequency_penalty", -2, 2)
    check(sp.presence_penalty, "presence_penalty", -2, 2)
    check(sp.repetition_penalty, "repetition_penalty", 0, 2, low_open=True)
    check(sp.n, "n", 1, INT32_MAX)
    check(sp.sampling_seed, "sampling_seed", -(2**63), 2**63 - 1)
    stops = stop_strings(sp)
    if len(stops) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"Invalid value for 'sampling_params.stop': at most {MAX_STOP_STRINGS} stop strings are allowed.",
            param="sampling_params.stop",
        )
    if any(not stop for stop in stops):
        raise invalid_request(
            "Invalid value for 'sampling_params.stop': stop strings must not be empty.", param="sampling_params.stop"
        )
    for i, token in enumerate(sp.stop_token_ids or ()):
        check(token, f"stop_token_ids[{i}]", 0, INT32_MAX)
    given = [name for name in ("json_schema", "regex", "ebnf", "structural_tag") if getattr(sp, name) is not None]
    if len(given) > 1:
        raise invalid_request(
            f"Only one of json_schema, regex, ebnf or structural_tag can be set, got {' and '.join(given)}.",
            param=f"sampling_params.{given[1]}",
        )
    for name in given:
        if not getattr(sp, name):
            raise invalid_request(
                f"Invalid value for 'sampling_params.{name}': it must not be empty.", param=f"sampling_params.{name}"
            )


def _check_logprobs(request: GenerateRequest) -> None:
    _check_range(request.top_logprobs_num, "top_logprobs_num", 0, MAX_TOP_LOGPROBS)
    if request.logprob_start_len != -1:
        raise invalid_request(
            "Prompt logprobs ('logprob_start_len' other than -1) are not supported.",
            param="logprob_start_len",
            code="unsupported_parameter",
        )


def stop_strings(sp: GenerateSamplingParams) -> tuple[str, ...]:
    if sp.stop is None:
        return ()
    return (sp.stop,) if isinstance(sp.stop, str) else tuple(sp.stop)


def image_list(request: GenerateRequest) -> list[str]:
    """The request's images (one, or a list) as a list."""
    images = request.image_data
    if images is None:
        return []
    return [images] if isinstance(images, str) else list(images)
