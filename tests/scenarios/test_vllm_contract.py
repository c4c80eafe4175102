"""The mock engine's vLLM API, driven by a client this project did not write: `smg-grpc-proto`'s own
generated grpcio stubs (in a process of their own: see tests/contract/vllm_grpcio_client.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import trio
from support import engine_accounting, start_mock_engine

pytestmark = pytest.mark.slow

CLIENT = Path(__file__).resolve().parent.parent / "contract" / "vllm_grpcio_client.py"
KV_EVENTS = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "topic": ""})


async def test_the_published_grpcio_stubs_drive_the_mock_through_every_rpc(aio_loop, nursery):
    engine = await start_mock_engine(nursery, "--api", "vllm", "--kv-events-config", KV_EVENTS)
    result = await trio.run_process(
        [sys.executable, str(CLIENT), f"{engine.host}:{engine.port}"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    summary = json.loads(result.stdout)
    assert summary["served_model_name"] == "trio-direct-mock" and summary["kv_role"] == ""
    assert len(summary["streamed_ids"]) == 5 and summary["stored_events"] > 0
    account = await engine_accounting(engine.url)
    assert [rid for rid, _ in account["abort_rpcs"]] == ["contract-abort"]
    assert account["outcomes"]["contract-abort"] == "aborted" and not account["live"]
