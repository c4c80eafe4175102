"""The frontend's one watch task: keep-alives for quiet streams, and hung engines found without a
timer per token."""

from __future__ import annotations

from types import SimpleNamespace

from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineStalled


class Call:
    def __init__(self, client, opened_at: float, *, bootstrap=None, first_chunk_at=None) -> None:
        self.client = client
        self.opened_at = opened_at
        self.request = SimpleNamespace(bootstrap=bootstrap)
        self.first_chunk_at = first_chunk_at
        self.stalled: list = []

    def stall(self, error) -> bool:
        self.stalled.append(error)
        return True


class Engine:
    def __init__(self, last_output_at: float) -> None:
        self.name = "e"
        self.last_output_at = last_output_at


engine = Engine


def test_a_call_is_stalled_only_when_its_engine_delivered_nothing_either():
    watch = StreamWatch(stall_timeout=10)
    busy, hung = engine(95.0), engine(80.0)
    queued = Call(busy, opened_at=50.0)  # waits behind others that stream: not hung
    stuck, fresh = Call(hung, opened_at=50.0), Call(hung, opened_at=95.0)
    for call in (queued, stuck, fresh):
        watch.call_opened(call)
    watch.check(0.0, 100.0)
    assert queued.stalled == [] and fresh.stalled == []
    assert len(stuck.stalled) == 1 and isinstance(stuck.stalled[0], EngineStalled)
    watch.check(0.0, 100.0)
    assert len(stuck.stalled) == 1  # failed once
    watch.check(0.0, 106.0)
    assert len(fresh.stalled) == 1


def test_a_disaggregated_leg_is_watched_from_its_first_message():
    watch = StreamWatch(stall_timeout=10)
    hung = engine(0.0)
    waiting = Call(hung, opened_at=0.0, bootstrap=object())
    streaming = Call(hung, opened_at=0.0, bootstrap=object(), first_chunk_at=1.0)
    watch.call_opened(waiting)
    watch.call_opened(streaming)
    watch.check(0.0, 100.0)
    assert waiting.stalled == [] and len(streaming.stalled) == 1


def test_quiet_streams_are_woken_once_per_quiet_period():
    watch = StreamWatch(keepalive=5)
    woken = []
    stream = watch.stream_opened(lambda: woken.append(1) or True)
    stream.last_write = 0.0
    watch.check(4.0, 0.0)
    assert woken == []
    watch.check(6.0, 0.0)
    watch.check(7.0, 0.0)
    assert woken == [1]
    stream.last_write = 7.0  # the keep-alive went out
    watch.check(12.5, 0.0)
    assert woken == [1, 1]
    watch.stream_closed(stream)
    watch.check(100.0, 0.0)
    assert woken == [1, 1]
    assert StreamWatch(keepalive=0).stream_opened(lambda: True) is None
    assert StreamWatch(keepalive=2, stall_timeout=120).tick == 0.5
