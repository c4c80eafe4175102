"""`trio-direct mock-engine`: its flags, and a real process driven over gRPC."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys

import pytest
import trio

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.cli import build_parser, main

P = "/sglang.runtime.v1.SglangService/"


def test_mock_engine_defaults():
    args = build_parser().parse_args(["mock-engine"])

    assert (args.host, args.port, args.api, args.role) == ("127.0.0.1", 0, "both", "aggregated")
    assert (args.page_size, args.dp_size, args.speedup) == (1, 1, 1.0)
    assert args.disaggregation_bootstrap_port == 8998 and args.bootstrap_timeout == 30.0
    assert args.expose_accounting is True and args.incremental_streaming_output is False
    assert args.model_path is None and args.kv_events_config is None


def test_mock_engine_flags():
    args = build_parser().parse_args(
        [
            "mock-engine",
            "--api",
            "smg",
            "--role",
            "prefill",
            "--speedup",
            "inf",
            "--dp-size",
            "4",
            "--no-expose-accounting",
            "--incremental-streaming-output",
            "--kv-events-config",
            '{"publisher":"zmq"}',
            "--tool-call-parser",
            "qwen",
            "--reasoning-parser",
            "qwen3",
            "--seed",
            "7",
            "--context-length",
            "2048",
        ]
    )

    assert args.api == "smg" and args.role == "prefill" and math.isinf(args.speedup)
    assert args.dp_size == 4 and args.expose_accounting is False and args.incremental_streaming_output
    assert json.loads(args.kv_events_config) == {"publisher": "zmq"}
    assert (args.tool_call_parser, args.reasoning_parser, args.seed, args.context_length) == ("qwen", "qwen3", 7, 2048)


def test_a_subcommand_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_bad_values_exit_with_an_error(capsys):
    assert main(["mock-engine", "--dp-size", "0"]) == 2
    assert "dp_size must be at least 1" in capsys.readouterr().err


async def test_real_process_serves_generate_and_stops_on_sigterm(aio_loop, dial, tiny_model):
    command = [
        sys.executable,
        "-m",
        "trio_direct",
        "mock-engine",
        "--port",
        "0",
        "--speedup",
        "10",
        "--model-path",
        str(tiny_model),
        "--log-level",
        "warning",
    ]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            line = await _read_line(process.stdout)
        ready = json.loads(line)
        assert ready["event"] == "ready" and ready["port"] > 0
        assert ready["bootstrap_port"] is None and ready["kv_events"] is None

        channel = dial(ready["port"])
        request = pb.GenerateRequest(
            input_ids=[5, 6, 7], rid="cli", stream=True, sampling_params=pb.SamplingParams(max_new_tokens=4)
        )
        async with channel.open_stream(P + "Generate", request, pb.GenerateResponse, timeout=10) as stream:
            messages = [message async for message in stream]
        assert len(messages[-1].output_ids) == 4 and messages[-1].finished
        info = await _server_info(channel)
        assert info["mock_accounting"]["finished"] == 1
        assert "mock-engine" in info["launch_command"]

        # A client that walks away: the engine's accounting, read over gRPC, shows the cancel.
        long = pb.GenerateRequest(
            input_ids=[5, 6, 7],
            rid="walk",
            stream=True,
            sampling_params=pb.SamplingParams(max_new_tokens=20000, ignore_eos=True),
        )
        async with channel.open_stream(P + "Generate", long, pb.GenerateResponse, timeout=10) as stream:
            async for _ in stream:
                break
        with trio.fail_after(10):
            while (accounting := (await _server_info(channel))["mock_accounting"])["cancelled"] != 1:
                await trio.sleep(0.01)
        assert accounting["live"] == [] and accounting["aborted"] == 0

        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _server_info(channel) -> dict:
    reply = await channel.unary(P + "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse, timeout=5)
    return json.loads(reply.json_info)


async def _read_line(stream) -> str:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            raise AssertionError(f"mock engine exited before it was ready: {data!r}")
        data += chunk
    return data.split(b"\n", 1)[0].decode()
