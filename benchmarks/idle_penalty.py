"""How much slower the frontend's own code runs after the machine sat idle, as between c=1 requests.

Renders the benchmark's chat prompt and tokenizes it, back to back (caches warm), then after 2 ms
and 20 ms of sleep (a c=1 request waits ~20 ms for the mock's real-time prefill), then after the
sleep plus 1 ms of busy spinning (if spinning makes it fast again, the CPU was clocked down; if not,
its caches were emptied by whatever else ran). Prints medians. On a machine where the slow-down is
large, every step on the way to the first token pays it, which is what `frontend_bench.py`'s added
TTFT at c=1 measures.

    python benchmarks/idle_penalty.py [--samples 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer

MESSAGES = [{"role": "user", "content": "Tell me a long story about routers."}]


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(tokenizer: ModelTokenizer, samples: int, idle: float, busy: float) -> tuple[float, float]:
    text = render_chat(tokenizer, MESSAGES)
    render, encode = [], []
    for _ in range(samples):
        if idle:
            time.sleep(idle)
        if busy:
            spin(busy)
        start = time.perf_counter()
        render_chat(tokenizer, MESSAGES)
        rendered = time.perf_counter()
        tokenizer.encode(text, add_special_tokens=False)
        encoded = time.perf_counter()
        render.append(rendered - start)
        encode.append(encoded - rendered)
    return statistics.median(render), statistics.median(encode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    samples = parser.parse_args().samples
    tokenizer = ModelTokenizer.from_directory(ensure_tiny_model(default_tiny_model_dir()))
    cases = [("back to back", 0.0, 0.0), ("after 2 ms idle", 0.002, 0.0), ("after 20 ms idle", 0.02, 0.0),
             ("after 20 ms idle + 1 ms spin", 0.02, 0.001)]  # fmt: skip
    warm = None
    print(f"{'':30s} {'template':>10s} {'tokenize':>10s} {'vs warm':>8s}")
    for name, idle, busy in cases:
        render, encode = measure(tokenizer, samples, idle, busy)
        warm = warm or render + encode
        print(f"{name:30s} {render * 1e6:7.1f} us {encode * 1e6:7.1f} us {(render + encode) / warm:7.1f}x")


if __name__ == "__main__":
    main()
