"""Every engine request ends in completion or an Abort, decided from state in one `finally`."""

from __future__ import annotations

import json

import pytest
import trio
from support import wait_until

from trio_direct._proto.native import sglang_pb2 as pb
from trio_direct.core.engine_call import open_engine_call
from trio_direct.engine import native
from trio_direct.engine.errors import EngineInternal
from trio_direct.engine.types import GenerateInput

TYPES = {
    native.GENERATE: (True, pb.GenerateRequest, pb.GenerateResponse),
    native.ABORT: (False, pb.AbortRequest, pb.AbortResponse),
}


def token(i: int, finish: dict | None = None) -> pb.GenerateResponse:
    meta = {"finish_reason": json.dumps(finish), "completion_tokens": str(i + 1)}
    return pb.GenerateResponse(output_ids=[i], meta_info=meta, finished=finish is not None)


@pytest.fixture
async def engine(fake_engine_factory):
    engine = await fake_engine_factory(TYPES)
    engine.aborted = []
    engine.cancelled = []
    engine.live = []

    def abort(call):
        engine.aborted.append(call.request.rid)
        call.send(pb.AbortResponse(success=True))
        call.finish()

    engine.handlers[native.ABORT] = abort
    return engine


@pytest.fixture
def client(engine):
    client = native.NativeEngineClient(engine.channel(), incremental=True)
    yield client
    client.channel.close()


def endless(engine):
    def generate(call):
        call.on_cancel = lambda: engine.cancelled.append(call.request.rid)
        engine.live.append(call)
        call.send(token(0))

    return generate


async def test_a_completed_request_is_not_aborted(engine, client):
    def generate(call):
        call.send(token(0))
        call.send(token(1, {"type": "length", "length": 2}))
        call.finish()

    engine.handlers[native.GENERATE] = generate
    async with open_engine_call(client, GenerateInput(rid="done-1", input_ids=[1])) as call:
        tokens = []
        while batch := await call.next_batch():
            tokens += [t for chunk in batch for t in chunk.token_ids]
    assert tokens == [0, 1] and call.ended_at_engine
    await trio.sleep(0.05)
    assert engine.aborted == []


async def test_leaving_early_resets_the_stream_and_sends_one_abort(engine, client):
    engine.handlers[native.GENERATE] = endless(engine)
    async with open_engine_call(client, GenerateInput(rid="gone-1", input_ids=[1])) as call:
        await call.next_batch()
    assert engine.aborted == ["gone-1"]
    await wait_until(lambda: engine.cancelled == ["gone-1"])


async def test_cancellation_from_outside_still_aborts(engine, client):
    engine.handlers[native.GENERATE] = endless(engine)
    with trio.move_on_after(0.2):
        async with open_engine_call(client, GenerateInput(rid="cut-1", input_ids=[1])) as call:
            await call.next_batch()
            await trio.sleep_forever()
    assert engine.aborted == ["cut-1"]


async def test_an_error_the_engine_reported_needs_no_abort(engine, client):
    engine.handlers[native.GENERATE] = lambda call: call.fail("INTERNAL", "prompt too long")
    with pytest.raises(EngineInternal):
        async with open_engine_call(client, GenerateInput(rid="bad-1", input_ids=[1])) as call:
            await call.next_batch()
    await trio.sleep(0.05)
    assert engine.aborted == []


async def test_an_abort_to_a_hung_engine_is_bounded(engine, client):
    engine.handlers[native.GENERATE] = endless(engine)
    engine.handlers[native.ABORT] = lambda call: None  # never answers
    start = trio.current_time()
    async with open_engine_call(client, GenerateInput(rid="hung-1", input_ids=[1]), abort_timeout=0.3) as call:
        await call.next_batch()
    assert trio.current_time() - start < 2.0


async def test_chunks_that_queued_up_come_as_one_batch(engine, client):
    def generate(call):
        for i in range(5):
            call.send(token(i))
        call.send(token(5, {"type": "stop", "matched": 2}))
        call.finish()

    engine.handlers[native.GENERATE] = generate
    async with open_engine_call(client, GenerateInput(rid="batch-1", input_ids=[1])) as call:
        batches = []
        await trio.sleep(0.1)  # let everything arrive before reading
        while batch := await call.next_batch():
            batches.append([t for chunk in batch for t in chunk.token_ids])
    assert sum(batches, []) == [0, 1, 2, 3, 4, 5]
    assert len(batches) < 6
    assert engine.aborted == []


async def test_tokens_that_arrived_before_an_engine_error_are_delivered_first(engine, client):
    def generate(call):
        for i in range(3):
            call.send(token(i))
        call.fail("INTERNAL", "out of memory")

    engine.handlers[native.GENERATE] = generate
    received = []
    with pytest.raises(EngineInternal):
        async with open_engine_call(client, GenerateInput(rid="late-error-1", input_ids=[1])) as call:
            await trio.sleep(0.1)  # tokens and the error all arrive before the first read
            while batch := await call.next_batch():
                received += [t for chunk in batch for t in chunk.token_ids]
    assert received == [0, 1, 2]
    assert engine.aborted == [], "the engine ended the request itself"
