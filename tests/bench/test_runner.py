"""The load generator: SSE measurement, the HTTP client, and runs against an embedded fleet."""

from __future__ import annotations

import itertools
import json
import math

import h11
import pytest
import trio
from support import TRACE_SAMPLE

from trio_direct.bench.runner import (
    CAPPED_ERROR,
    FleetSpec,
    HttpClient,
    RequestRecord,
    SseDecoder,
    StreamMeter,
    check_client_latency,
    fetch_model,
    open_embedded_fleet,
    run_bench,
)
from trio_direct.bench.trace import BLOCK_SIZE, PromptSynthesizer, TraceRequest, cap_lengths, load_trace


def test_sse_events_split_anywhere_are_reassembled():
    stream = b'data: {"a": 1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\ndata: [DONE]\n\n'
    decoder = SseDecoder()
    events = [event for i in range(len(stream)) for event in decoder.feed(stream[i : i + 1])]
    assert events == ['{"a": 1}', "one\ntwo", "[DONE]"]


def chunk(text, finish=None):
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def test_the_meter_records_first_token_gaps_usage_and_the_end():
    record = RequestRecord(index=0, scheduled_at_s=0.0, input_length=10, max_tokens=4)
    meter = StreamMeter(record, started=100.0)
    meter.on_payload(chunk(""), 100.05)  # an empty chunk is not a token
    meter.on_payload(chunk("a"), 100.1)
    meter.on_payload(chunk("bc"), 100.3)
    meter.on_payload(chunk("d", "length"), 100.35)
    usage = {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}
    meter.on_payload(json.dumps({"choices": [], "usage": usage}), 100.36)
    meter.on_payload("[DONE]", 100.4)
    assert meter.done and record.error is None
    assert record.ttft_s == pytest.approx(0.1)
    assert record.itl_s == pytest.approx([0.2, 0.05])
    assert record.e2e_s == pytest.approx(0.4)
    assert (record.prompt_tokens, record.output_tokens, record.cached_tokens) == (10, 4, 8)
    assert record.finish_reason == "length"
    assert record.tpot_s == pytest.approx(0.1)


def test_an_error_event_in_the_stream_fails_the_request():
    record = RequestRecord(index=0, scheduled_at_s=0.0, input_length=10, max_tokens=4)
    record.status = 200
    StreamMeter(record, 0.0).on_payload('{"error": {"message": "engine went away"}}', 1.0)
    assert not record.ok and record.error == "engine went away"


async def serve_closing_after_each_response(task_status=trio.TASK_STATUS_IGNORED):
    """An HTTP server that says keep-alive but closes every connection after one response."""

    async def handle(stream):
        connection = h11.Connection(h11.SERVER)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.EndOfMessage):
                break
        body = b'{"data": [{"id": "m"}]}'
        await stream.send_all(
            connection.send(h11.Response(status_code=200, headers=[("Content-Length", str(len(body)))]))
            + connection.send(h11.Data(data=body))
            + connection.send(h11.EndOfMessage())
        )
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_a_keep_alive_connection_the_server_closed_is_replaced(nursery):
    port = await nursery.start(serve_closing_after_each_response)
    client = HttpClient(f"http://127.0.0.1:{port}/v1")
    try:
        for _ in range(3):
            assert await client.get_json("/v1/models") == (200, {"data": [{"id": "m"}]})
    finally:
        await client.aclose()
    assert await fetch_model(f"http://127.0.0.1:{port}") == "m"


async def test_requests_to_a_closed_port_are_recorded_as_errors():
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    requests = [TraceRequest(index=i, arrival_s=0.0, input_length=20, output_length=2, hash_ids=(i,)) for i in range(3)]
    result = await run_bench(f"http://127.0.0.1:{port}", "m", requests, timeout=5, progress=False)
    assert len(result.records) == 3
    assert all(not r.ok and r.error is not None and "cannot connect" in r.error for r in result.records)


@pytest.fixture
async def fleet(aio_loop, tiny_model):
    async with open_embedded_fleet(FleetSpec(engines=2, speedup=math.inf, model_path=str(tiny_model))) as fleet:
        yield fleet


@pytest.fixture
async def slow_fleet(aio_loop, tiny_model):
    """One engine at real mock timing (~6 ms a decode step), for requests that stay in flight."""
    async with open_embedded_fleet(FleetSpec(engines=1, speedup=1.0, model_path=str(tiny_model))) as fleet:
        yield fleet


def prompts_for(fleet):
    return PromptSynthesizer(low=max(fleet.special_token_ids) + 1, high=fleet.vocab_size, avoid=fleet.special_token_ids)


async def bench(fleet, requests, **options):
    """`run_bench` against an embedded fleet, with prompts in its model's vocabulary."""
    model = options.pop("model", None) or await fetch_model(fleet.base_url)
    options = {"timeout": 60, "progress": False, "prompts": prompts_for(fleet), **options}
    return await run_bench(fleet.base_url, model, requests, **options)


async def test_a_twenty_request_trace_slice_against_an_embedded_fleet(fleet):
    path = TRACE_SAMPLE
    requests = cap_lengths(load_trace(path, limit=20, time_scale=0.01), max_input_tokens=1500, max_output_tokens=16)
    result = await bench(fleet, requests, load_targets=fleet.engines)
    assert result.planned == 20 and not result.capped
    assert [r.index for r in result.records] == list(range(20))
    for record, request in zip(result.records, requests):
        assert record.ok, record.error
        assert record.prompt_tokens == request.input_length
        assert record.output_tokens == request.output_length
        assert record.finish_reason == "length"
        assert 0 <= record.ttft_s <= record.e2e_s
        assert len(record.itl_s) <= request.output_length - 1
    # every prompt starts with the trace's shared block 0, so the prefix cache serves some of it
    # (how much depends on which requests share a prefill batch)
    assert any(r.cached_tokens >= BLOCK_SIZE for r in result.records)
    assert {sample.engine for sample in result.engine_load} == {"engine0", "engine1"}


async def test_a_concurrency_limit_queues_requests(fleet):
    requests = [
        TraceRequest(index=i, arrival_s=0.0, input_length=600, output_length=8, hash_ids=(0, 10 + i)) for i in range(4)
    ]
    result = await bench(fleet, requests, concurrency_limit=1)
    records = sorted(result.records, key=lambda r: r.sent_at_s)
    assert all(r.ok for r in records)
    for before, after in itertools.pairwise(records):
        assert after.sent_at_s >= before.sent_at_s + before.e2e_s
    # one at a time, round-robin over two engines: the second visit to each engine finds the
    # shared first block in its prefix cache
    assert [r.cached_tokens >= BLOCK_SIZE for r in records] == [False, False, True, True]


async def test_the_client_check_compares_reused_and_fresh_connections(fleet):
    model = await fetch_model(fleet.base_url)
    check = await check_client_latency(fleet.base_url, model, samples=3, prompts=prompts_for(fleet))
    assert check["samples"] == 3
    assert check["keep_alive_ttft_p50_ms"] > 0 and check["fresh_connection_ttft_p50_ms"] > 0
    assert isinstance(check["floor_suspected"], bool)


async def test_the_duration_cap_stops_scheduling_and_cancels_requests_in_flight(slow_fleet):
    # ~2000 decode steps of >= 1 ms each: far longer than the cap
    long = TraceRequest(index=0, arrival_s=0.0, input_length=32, output_length=2000, hash_ids=(1,))
    never = TraceRequest(index=1, arrival_s=3600.0, input_length=32, output_length=2, hash_ids=(2,))
    result = await bench(slow_fleet, [long, never], duration=0.5)
    assert result.capped
    assert [r.index for r in result.records] == [0]
    assert result.records[0].error == CAPPED_ERROR


async def test_a_request_past_its_timeout_is_recorded_as_timed_out(slow_fleet):
    long = TraceRequest(index=0, arrival_s=0.0, input_length=32, output_length=2000, hash_ids=(1,))
    result = await bench(slow_fleet, [long], timeout=0.3)
    assert not result.capped
    assert result.records[0].error == "timed out after 0.3 s"


async def test_an_unknown_model_is_an_http_error_per_request(fleet):
    requests = [TraceRequest(index=0, arrival_s=0.0, input_length=16, output_length=2, hash_ids=(0,))]
    result = await bench(fleet, requests, model="no-such-model")
    record = result.records[0]
    assert record.status == 404 and record.error.startswith("HTTP 404:")


class Terminal:
    """A stand-in for stderr on a terminal."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


async def test_progress_is_one_rewritten_line_on_a_terminal_and_appended_lines_otherwise(fleet):
    requests = [TraceRequest(index=i, arrival_s=0.0, input_length=16, output_length=2, hash_ids=(i,)) for i in range(3)]
    terminal = Terminal()
    await bench(fleet, requests, progress=True, progress_stream=terminal)
    assert terminal.text.startswith("\rbench: ") and terminal.text.count("\n") == 1
    assert terminal.text.endswith("bench: 3/3 done, 0 in flight, 0 failed, " + terminal.text.rsplit(", ", 1)[1])
    terminal.isatty = lambda: False  # type: ignore[method-assign]  # the same terminal, no longer a tty
    terminal.text = ""
    await bench(fleet, requests, progress=True, progress_stream=terminal, progress_interval=600)
    assert terminal.text.startswith("bench: 3/3 done, 0 in flight, 0 failed, ")  # no line before the first interval
    assert terminal.text.count("\n") == 1 and "\r" not in terminal.text and "\x1b" not in terminal.text
