"""Request traces to replay: the Mooncake trace format, prompt synthesis, and a synthetic generator.

A Mooncake trace gives no text, only lengths and the ids of 512-token prefix blocks; equal ids mean
an equal prefix. `PromptSynthesizer` turns those ids back into token ids so that equal ids give equal
tokens, which lets an engine's prefix cache (and a KV-aware router) see the same reuse the trace
recorded. Prompts are token ids for `/v1/completions`, so no tokenizer stands between the trace and
the engine. Everything here is plain synchronous code.
"""

from __future__ import annotations

import json
import math
import random
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = [
    "BLOCK_SIZE",
    "DEFAULT_MIN_TOKEN_ID",
    "DEFAULT_VOCAB_SIZE",
    "ChatTurn",
    "PromptSynthesizer",
    "TraceRequest",
    "cap_lengths",
    "conversation_key",
    "conversation_turns",
    "load_trace",
    "parse_trace_line",
    "rebase",
    "synthetic_multiturn",
]

#: Tokens per hash block in the Mooncake traces.
BLOCK_SIZE = 512

#: Token-id range for prompts when the model is unknown (a frontend given by URL): ordinary tokens of
#: common vocabularies, and inside the built-in tiny mock model's vocabulary (724 ids, 0-2 special).
DEFAULT_MIN_TOKEN_ID = 100
DEFAULT_VOCAB_SIZE = 700


@dataclass(slots=True, frozen=True)
class TraceRequest:
    """One request to replay: when it arrives, how long its prompt and answer are, which blocks."""

    #: Position in the source (line number from 0 in a trace file; sequence number when generated).
    index: int
    #: Seconds after the run starts at which to send it.
    arrival_s: float
    input_length: int
    output_length: int
    #: Ids of the prompt's blocks of `BLOCK_SIZE` tokens; the last one may be partial.
    hash_ids: tuple[int, ...]


def parse_trace_line(line: str, index: int) -> TraceRequest:
    """One JSON line of a Mooncake trace; `arrival_s` is the raw timestamp in seconds."""
    raw = json.loads(line)
    try:
        request = TraceRequest(
            index=index,
            arrival_s=float(raw["timestamp"]) / 1000.0,
            input_length=int(raw["input_length"]),
            output_length=int(raw["output_length"]),
            hash_ids=tuple(int(h) for h in raw["hash_ids"]),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"trace line {index}: missing or malformed field: {exc}") from exc
    if request.input_length < 1 or request.output_length < 0:
        raise ValueError(f"trace line {index}: input_length must be >= 1 and output_length >= 0")
    if len(request.hash_ids) * BLOCK_SIZE < request.input_length:
        raise ValueError(
            f"trace line {index}: {len(request.hash_ids)} hash ids cannot cover {request.input_length} tokens"
        )
    return request


def conversation_key(request: TraceRequest) -> int:
    """Which conversation a request belongs to: its second block, else its first.

    In the Mooncake conversation trace every request starts with the shared system-prompt block 0,
    and every turn of a conversation repeats the earlier turns, so the block after the system
    prompt names the conversation. (A first turn shorter than two blocks can split a conversation
    in two; sampling then keeps or drops the parts separately, losing a little reuse.)
    """
    return request.hash_ids[1] if len(request.hash_ids) > 1 else request.hash_ids[0]


@dataclass(slots=True, frozen=True)
class ChatTurn:
    """One request of a conversation, as a chat turn: the blocks it adds to what came before."""

    request: TraceRequest
    #: Hash ids past the prefix this turn shares with the conversation's previous turn (block 0,
    #: the shared system prompt, never counts as new); the last block again when none are new.
    new_blocks: tuple[int, ...]


def conversation_turns(requests: Iterable[TraceRequest], *, min_turns: int = 1) -> list[list[ChatTurn]]:
    """Requests grouped by conversation (`conversation_key`), in order of first appearance, each
    turn with the blocks it adds; conversations with fewer than `min_turns` turns are left out.

    A multi-turn chat built from them (system prompt = block 0, then per turn a user message of
    its new blocks, with an answer between turns) resends its whole history every turn, as chat
    clients do, and its prompts share prefixes as the trace's hash ids say.
    """
    by_conversation: dict[int, list[TraceRequest]] = {}
    for request in requests:
        by_conversation.setdefault(conversation_key(request), []).append(request)
    conversations = []
    for turns in by_conversation.values():
        if len(turns) < min_turns:
            continue
        chat, previous = [], turns[0].hash_ids[:1]
        for turn in turns:
            shared = 0
            while shared < min(len(previous), len(turn.hash_ids)) and previous[shared] == turn.hash_ids[shared]:
                shared += 1
            chat.append(ChatTurn(turn, turn.hash_ids[max(shared, 1) :] or turn.hash_ids[-1:]))
            previous = turn.hash_ids
        conversations.append(chat)
    return conversations


def _keeps(request: TraceRequest, fraction: float, seed: int) -> bool:
    if fraction >= 1.0:
        return True
    return random.Random(f"conversation:{seed}:{conversation_key(request)}").random() < fraction


def load_trace(
    path: str | Path,
    *,
    start: int = 0,
    limit: int | None = None,
    time_scale: float = 1.0,
    conversation_fraction: float = 1.0,
    seed: int = 0,
) -> list[TraceRequest]:
    """Requests `start .. start+limit` of a Mooncake JSONL trace, ready to replay.

    `conversation_fraction` < 1 first keeps that share of the conversations (drawn with `seed`),
    every turn of a kept one: a fleet that serves fewer users sees the trace's whole reuse pattern
    at a lower rate, which a contiguous slice of minutes cannot show (a conversation's turns are
    minutes apart). `start` and `limit` count the kept requests. Arrival times are rebased so the
    first request arrives at 0, then multiplied by `time_scale` (0.5 replays twice as fast).
    """
    if not 0.0 < conversation_fraction <= 1.0:
        raise ValueError("conversation_fraction must be in (0, 1]")
    if start < 0:
        raise ValueError("start must not be negative")
    if limit is not None and limit < 0:
        raise ValueError("limit must not be negative")
    if not time_scale >= 0 or math.isinf(time_scale):
        raise ValueError("time_scale must be a finite number >= 0")
    requests: list[TraceRequest] = []
    stop = None if limit is None else start + limit
    with open(path, encoding="utf-8") as lines:
        index = line_number = -1
        for line in lines:
            if not line.strip():
                continue
            line_number += 1
            request = parse_trace_line(line, line_number)
            if not _keeps(request, conversation_fraction, seed):
                continue
            index += 1
            if index < start:
                continue
            if stop is not None and index >= stop:
                break
            requests.append(request)
    return rebase(requests, time_scale)


def rebase(requests: Sequence[TraceRequest], time_scale: float = 1.0) -> list[TraceRequest]:
    """Shift arrivals so the first is at 0, then scale them."""
    if not requests:
        return []
    origin = requests[0].arrival_s
    return [replace(r, arrival_s=max(0.0, r.arrival_s - origin) * time_scale) for r in requests]


def cap_lengths(
    requests: Iterable[TraceRequest], *, max_input_tokens: int | None = None, max_output_tokens: int | None = None
) -> list[TraceRequest]:
    """Truncate prompts and answers so a small engine's context holds them.

    A truncated prompt keeps its leading blocks, so prefix sharing between requests survives.
    """
    if max_input_tokens is not None and max_input_tokens < 1:
        raise ValueError("max_input_tokens must be at least 1")
    if max_output_tokens is not None and max_output_tokens < 0:
        raise ValueError("max_output_tokens must not be negative")
    capped = []
    for r in requests:
        input_length, output_length = r.input_length, r.output_length
        if max_input_tokens is not None and input_length > max_input_tokens:
            input_length = max_input_tokens
        if max_output_tokens is not None and output_length > max_output_tokens:
            output_length = max_output_tokens
        blocks = r.hash_ids[: math.ceil(input_length / BLOCK_SIZE)]
        capped.append(replace(r, input_length=input_length, output_length=output_length, hash_ids=blocks))
    return capped


class PromptSynthesizer:
    """Token-id prompts for trace requests: block `h` is always the same `BLOCK_SIZE` ids.

    Block `h` is drawn from a generator seeded with (`seed`, `h`), uniformly over `[low, high)` minus
    `avoid` (special tokens, which would end or reshape generation). A different `seed` gives a
    fresh set of prompts with the same sharing structure, e.g. to replay against a warm cache.
    Recently used blocks are kept (as compact arrays), because traces reuse prefixes heavily.
    """

    def __init__(
        self,
        *,
        low: int,
        high: int,
        avoid: Iterable[int] = (),
        seed: int = 0,
        block_size: int = BLOCK_SIZE,
        cache_blocks: int = 4096,
    ) -> None:
        avoided = set(avoid)
        self.population = [token for token in range(low, high) if token not in avoided]
        if not self.population:
            raise ValueError(f"no token ids left in [{low}, {high}) after avoiding {sorted(avoided)}")
        self.seed = seed
        self.block_size = block_size
        self._cache: OrderedDict[int, array] = OrderedDict()
        self._cache_blocks = cache_blocks

    def block(self, hash_id: int) -> array:
        """The `block_size` token ids of block `hash_id`."""
        cached = self._cache.get(hash_id)
        if cached is not None:
            self._cache.move_to_end(hash_id)
            return cached
        rng = random.Random(f"{self.seed}:{hash_id}")
        ids = array("l", rng.choices(self.population, k=self.block_size))
        self._cache[hash_id] = ids
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return ids

    def prompt(self, request: TraceRequest) -> list[int]:
        """The request's prompt: its blocks in order, the last cut to `input_length` tokens."""
        ids: list[int] = []
        remaining = request.input_length
        for hash_id in request.hash_ids:
            if remaining <= 0:
                break
            block = self.block(hash_id)
            ids.extend(block if remaining >= self.block_size else block[:remaining])
            remaining -= self.block_size
        if remaining > 0:
            raise ValueError(f"request {request.index}: its hash ids cover fewer than {request.input_length} tokens")
        return ids


def synthetic_multiturn(
    num_conversations: int,
    turns: int,
    system_prompts: int,
    *,
    system_prompt_blocks: int = 2,
    first_user_tokens: int = 300,
    user_tokens: int = 120,
    output_tokens: int = 64,
    turn_gap_s: float = 1.0,
    conversation_gap_s: float = 0.1,
    seed: int = 0,
) -> list[TraceRequest]:
    """Conversations that share system prompts and grow turn by turn, as hash-id requests.

    Conversation `c` uses system prompt `c % system_prompts` (whole blocks, shared across
    conversations). Turn `t`'s prompt is turn `t-1`'s prompt, plus `output_tokens` standing in for
    the previous answer, plus `user_tokens` new tokens, so every turn extends the previous one's
    prefix. A partial last block keeps its id as it fills up in later turns: block ids stand for
    seeded token streams, so the longer block still starts with the shorter one's tokens.
    Conversations start `conversation_gap_s` apart; a conversation's turns `turn_gap_s` apart (with
    a little seeded jitter). Requests come back sorted by arrival.
    """
    if num_conversations < 0 or turns < 1 or system_prompts < 1:
        raise ValueError("need num_conversations >= 0, turns >= 1 and system_prompts >= 1")
    if system_prompt_blocks < 0 or first_user_tokens < 1 or user_tokens < 1 or output_tokens < 0:
        raise ValueError("token counts must be positive (system_prompt_blocks and output_tokens may be 0)")
    rng = random.Random(seed)
    next_id = system_prompts * system_prompt_blocks
    requests: list[tuple[float, int, int, int, tuple[int, ...]]] = []
    for c in range(num_conversations):
        system = c % system_prompts
        hash_ids = [system * system_prompt_blocks + b for b in range(system_prompt_blocks)]
        length = system_prompt_blocks * BLOCK_SIZE
        at = c * conversation_gap_s
        for t in range(turns):
            length += first_user_tokens if t == 0 else output_tokens + user_tokens
            while len(hash_ids) * BLOCK_SIZE < length:
                hash_ids.append(next_id)
                next_id += 1
            requests.append((at, c, t, length, tuple(hash_ids)))
            at += turn_gap_s * (0.75 + 0.5 * rng.random())
    requests.sort(key=lambda r: (r[0], r[1], r[2]))
    return [
        TraceRequest(index=i, arrival_s=at, input_length=length, output_length=output_tokens, hash_ids=ids)
        for i, (at, _c, _t, length, ids) in enumerate(requests)
    ]
