"""`/v1/tokenize` and `/v1/detokenize` (also `/tokenize`, `/detokenize`): vLLM's and SGLang's shapes.

One schema serves both kinds of client. Tokenize takes `prompt` (a string, or SGLang's list of
strings) or vLLM's chat form (`messages`, `add_generation_prompt`, `continue_final_message`,
`tools`, `chat_template_kwargs`) and answers `{"count", "max_model_len", "tokens"}` (lists of each
for a list of prompts), plus `token_strs` when `return_token_strs` is set. `add_special_tokens`
defaults as in vLLM: on for a prompt, off for messages (the template writes them). Detokenize takes
`tokens` (ids, or SGLang's list of id lists) and answers the text under both names clients read:
vLLM's `prompt` and SGLang's `text`. Special tokens are kept unless `skip_special_tokens` (vLLM's
default: tokenize and detokenize round-trip).
"""

from __future__ import annotations

from typing import Any

import msgspec

from trio_direct.core.errors import invalid_request
from trio_direct.openai.bodies import decode_body
from trio_direct.openai.requests import INT32_MAX, ChatMessage, Tool, _check_message

__all__ = [
    "DetokenizeRequest",
    "TokenizeRequest",
    "decode_detokenize_request",
    "decode_tokenize_request",
    "detokenize_body",
    "tokenize_body",
]


class TokenizeRequest(msgspec.Struct, kw_only=True):
    #: Optional while one model is served (as vLLM and SGLang take it).
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    tokens: list[int | list[int]]
    skip_special_tokens: bool = False


def decode_tokenize_request(body: bytes) -> TokenizeRequest:
    """Parse and validate a tokenize body; raises `ApiError` (400) on any problem."""
    request = decode_body(body, TokenizeRequest)
    if (request.prompt is None) == (request.messages is None):
        raise invalid_request("Give exactly one of 'prompt' and 'messages'.", param="prompt")
    if isinstance(request.prompt, list) and not request.prompt:
        raise invalid_request("Invalid value for 'prompt': expected at least one prompt.", param="prompt")
    if request.messages is not None:
        if not request.messages:
            raise invalid_request("Invalid value for 'messages': expected at least one message.", param="messages")
        for i, message in enumerate(request.messages):
            _check_message(message, f"messages[{i}]")
        if request.continue_final_message:
            if request.add_generation_prompt:  # vLLM's rule: the client turns the other off
                raise invalid_request(
                    "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                    param="continue_final_message",
                )
            if request.messages[-1].role != "assistant":
                raise invalid_request(
                    "'continue_final_message' requires the last message to be from the assistant.",
                    param="continue_final_message",
                )
    return request


def decode_detokenize_request(body: bytes) -> DetokenizeRequest:
    """Parse and validate a detokenize body; raises `ApiError` (400) on any problem."""
    request = decode_body(body, DetokenizeRequest)
    tokens = request.tokens
    nested = bool(tokens) and isinstance(tokens[0], list)
    for i, item in enumerate(tokens):
        if isinstance(item, list) != nested:
            expected = "a list of token ids" if nested else "a token id"
            raise invalid_request(f"Invalid type for 'tokens[{i}]': expected {expected}.", f"tokens[{i}]")
        if isinstance(item, list):
            for j, token_id in enumerate(item):
                _check_token(token_id, f"tokens[{i}][{j}]")
        else:
            _check_token(item, f"tokens[{i}]")
    return request


def _check_token(token: int, param: str) -> None:
    if not 0 <= token <= INT32_MAX:
        raise invalid_request(f"Invalid value for '{param}': token ids must be non-negative, got {token}.", param)


class _Tokens(msgspec.Struct, omit_defaults=True):
    count: Any
    max_model_len: int
    tokens: Any
    token_strs: Any = None


class _Text(msgspec.Struct):
    prompt: Any
    text: Any


_encoder = msgspec.json.Encoder()


def tokenize_body(tokens: list[Any], max_model_len: int, token_strs: list[Any] | None = None) -> bytes:
    """One prompt's ids (`count` an int), or a list of prompts' id lists (`count` a list)."""
    count: int | list[int] = len(tokens)
    if tokens and isinstance(tokens[0], list):
        count = [len(ids) for ids in tokens]
    return _encoder.encode(_Tokens(count, max_model_len, tokens, token_strs))


def detokenize_body(text: str | list[str]) -> bytes:
    return _encoder.encode(_Text(text, text))
