"""Where the time to first token a frontend adds at c=1 goes: one forwarder on each HTTP layer.

A forwarder does nothing of a frontend's OpenAI work: it reads the request, sends a fixed, already
tokenized prompt to a mock engine through the project's engine transport, and writes one fixed SSE
chunk per engine message. Three of them, each on one more layer of the HTTP stack:

  raw        trio sockets, the request head split by hand: the least any Python server does
  h11        trio sockets and h11, the HTTP/1.1 state machine hypercorn is built on
  hypercorn  an ASGI app on hypercorn's trio worker, configured as `trio-direct serve` configures it

then `trio-direct serve` itself and, when installed, smg 1.13. All run against the same two mock
engines at `--speedup 1` and are alternated in rounds with direct gRPC calls, as in
`frontend_bench.py`'s latency part; the difference of neighbouring rows is what a layer costs.

    python benchmarks/http_floor.py [--requests 90] [--rounds 3] [--smg PATH]

Each request streams 32 tokens at the mock's real-time pace (~0.25 s): a run with `--requests 150`
(six paths) took about four minutes on the development VM.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from functools import partial

import h11
import hypercorn.trio
import trio

from frontend_bench import MODEL_NAME, PROMPT, direct_latency, find_smg, start_frontend, start_smg
from loadgen import Children, chat_body, percentile, run_load, summary_ms
from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.transport import EngineChannel, open_asyncio_loop
from trio_direct.engine.types import GenerateInput, SamplingOptions
from trio_direct.http.server import hypercorn_config
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.text.chat_template import render_chat
from trio_direct.text.tokenizer import ModelTokenizer

FORWARDERS = ("raw", "h11", "hypercorn")
MAX_TOKENS = 32
_CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = [(b"content-type", b"text/event-stream")]


class Forwarding:
    """One forwarded request: the engine call for the fixed prompt."""

    def __init__(self, engine_port: int, prompt_ids: list[int]) -> None:
        self.client = NativeEngineClient(EngineChannel("127.0.0.1", engine_port), incremental=True)
        self.prompt_ids = prompt_ids

    def generate(self):
        request = GenerateInput(
            rid=os.urandom(16).hex(),
            input_ids=self.prompt_ids,
            sampling=SamplingOptions(max_new_tokens=MAX_TOKENS, ignore_eos=True),
        )
        return self.client.generate(request)


def raw_handler(forwarding: Forwarding):
    async def handle(stream: trio.SocketStream) -> None:
        buffer = b""
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            async with forwarding.generate() as chunks:
                await stream.send_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                async for _chunk in chunks:
                    await stream.send_all(b"%x\r\n%s\r\n" % (len(_CHUNK), _CHUNK))
            await stream.send_all(b"%x\r\n%s\r\n0\r\n\r\n" % (len(_DONE), _DONE))

    return handle


def h11_handler(forwarding: Forwarding):
    async def handle(stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER)
        while True:
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    connection.receive_data(data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            async with forwarding.generate() as chunks:
                await stream.send_all(connection.send(h11.Response(status_code=200, headers=_SSE_HEADERS)))
                async for _chunk in chunks:
                    await stream.send_all(connection.send(h11.Data(data=_CHUNK)))
            await stream.send_all(connection.send(h11.Data(data=_DONE)) + connection.send(h11.EndOfMessage()))
            connection.start_next_cycle()

    return handle


def asgi_app(forwarding: Forwarding):
    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        while (await receive()).get("more_body"):
            pass
        async with forwarding.generate() as chunks:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            async for _chunk in chunks:
                await send({"type": "http.response.body", "body": _CHUNK, "more_body": True})
        await send({"type": "http.response.body", "body": _DONE, "more_body": False})

    return app


async def run_forwarder(kind: str, engine_port: int, prompt_ids: list[int]) -> None:
    """Serve on an ephemeral port; print it as JSON once listening."""
    async with open_asyncio_loop(), trio.open_nursery() as nursery:
        forwarding = Forwarding(engine_port, prompt_ids)
        if kind == "hypercorn":
            config = hypercorn_config("127.0.0.1", 0, "warning")
            binds = await nursery.start(partial(hypercorn.trio.serve, asgi_app(forwarding), config))
            port = int(binds[0].rsplit(":", 1)[1])
        else:
            handler = raw_handler(forwarding) if kind == "raw" else h11_handler(forwarding)
            listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
            port = listeners[0].socket.getsockname()[1]
        print(json.dumps({"port": port}), flush=True)


def start_forwarder(children: Children, kind: str, engine_port: int, prompt_ids: list[int]) -> int:
    command = [sys.executable, __file__, "--forwarder", kind, "--engine-port", str(engine_port),
               "--prompt-ids", ",".join(map(str, prompt_ids))]  # fmt: skip
    process = children.start(command, stdout=subprocess.PIPE, text=True)
    return json.loads(process.stdout.readline())["port"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=90, help="requests per path")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--smg", help="path of the smg executable")
    parser.add_argument("--forwarder", choices=FORWARDERS, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--engine-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.forwarder:
        trio.run(run_forwarder, args.forwarder, args.engine_port, [int(t) for t in args.prompt_ids.split(",")])
        return

    model_dir = ensure_tiny_model(default_tiny_model_dir())
    tokenizer = ModelTokenizer.from_directory(model_dir)
    prompt_ids = tokenizer.encode(render_chat(tokenizer, PROMPT), add_special_tokens=False)
    smg = find_smg(args.smg)
    with Children() as children:
        engines = [
            children.mock_engine("--incremental-streaming-output", "--served-model-name", MODEL_NAME) for _ in range(2)
        ]
        targets = {
            f"{kind} forwarder": start_forwarder(children, kind, engines[i % 2], prompt_ids)
            for i, kind in enumerate(FORWARDERS)
        }
        targets["trio-direct"] = start_frontend(children, engines)[0]
        if smg:
            targets["smg 1.13"] = start_smg(children, smg, engines, model_dir)[0]
        ttft: dict[str, list[float]] = {"direct gRPC": [], **{name: [] for name in targets}}
        per_round = args.requests // args.rounds
        for _ in range(args.rounds):
            ttft["direct gRPC"] += trio.run(direct_latency, engines[0], prompt_ids, per_round, MAX_TOKENS)[0]
            for name, port in targets.items():
                body = chat_body(MODEL_NAME, MAX_TOKENS)
                samples, _ = trio.run(partial(run_load, "127.0.0.1", port, body, concurrency=1, requests=per_round))
                ttft[name] += [s.ttft for s in samples if s.ttft is not None]
                if not any(s.ok for s in samples):  # a path that answers nothing has no figure to print
                    raise SystemExit(f"{name}: none of {len(samples)} requests succeeded")
        base = percentile(ttft["direct gRPC"], 0.5)
        previous = None
        print(f"{'path':<20} {'TTFT':>38} {'added p50':>10} {'vs row above':>13}")
        for name, values in ttft.items():
            added = percentile(values, 0.5) - base
            step = "" if previous is None or name == "smg 1.13" else f"{(added - previous) * 1e3:+.2f} ms"
            print(f"{name:<20} {summary_ms(values)}   {added * 1e3:+6.2f} ms {step:>13}")
            previous = added


if __name__ == "__main__":
    main()
