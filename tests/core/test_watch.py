"""The frontend's one watch task: keep-alives for quiet streams, and hung engines found without a
timer per token."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from trio_direct.core.watch import StreamWatch
from trio_direct.engine.errors import EngineStalled


class Call:
    def __init__(self, client, opened_at: float, *, bootstrap=None, first_chunk_at=None, stream=True) -> None:
        self.client = client
        self.opened_at = opened_at
        self.request = SimpleNamespace(bootstrap=bootstrap, stream=stream)
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
        watch.call_opened(call)  # type: ignore[arg-type]  # a stand-in call
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
    watch.call_opened(waiting)  # type: ignore[arg-type]  # a stand-in call
    watch.call_opened(streaming)  # type: ignore[arg-type]  # a stand-in call
    watch.check(0.0, 100.0)
    assert waiting.stalled == [] and len(streaming.stalled) == 1


def test_a_call_asked_for_its_answer_whole_is_judged_by_a_health_check_asked_for_at_once():
    """A non-streamed answer's call sends its one message at its end, however long it generates:
    the idle timeout cannot tell it from a hung engine. The engine's health is checked at once
    instead (once per idle timeout), and a check that goes unanswered fails the call."""
    hung, busy = engine(0.0), engine(125.0)  # `busy` delivered output on another call lately
    watch = StreamWatch(stall_timeout=30.0)
    asked: list = []
    watch.on_quiet.append(asked.append)
    whole, streamed = Call(hung, opened_at=0.0, stream=False), Call(hung, opened_at=0.0)
    generating = Call(busy, opened_at=0.0, stream=False)
    for call in (whole, streamed, generating):
        watch.call_opened(call)  # type: ignore[arg-type]  # a stand-in call
    watch.check(100.0, 100.0)
    assert whole.stalled == [] and len(streamed.stalled) == 1 and generating.stalled == []
    assert asked == [hung]  # the engine that delivered output lately is not asked about
    watch.check(110.0, 110.0)
    watch.check(129.0, 129.0)
    assert asked == [hung]  # once per idle timeout
    watch.check(131.0, 131.0)
    assert asked == [hung, hung]
    assert watch.quiet_calls(hung, since=50.0) == 1  # what the unanswered check asks
    assert watch.fail_calls(hung, since=50.0, reason="probe unanswered") == 1 and len(whole.stalled) == 1


def test_quiet_streams_are_woken_once_per_quiet_period():
    watch = StreamWatch(keepalive=5)
    woken = []

    def wake() -> bool:
        woken.append(1)
        return True

    stream = watch.stream_opened(wake)
    assert stream is not None
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


def test_calls_are_tracked_for_the_health_checks_even_with_the_idle_timeout_off():
    watch = StreamWatch(stall_timeout=0)
    quiet, streaming = engine(10.0), engine(30.0)
    old, new, other = Call(quiet, opened_at=5.0), Call(quiet, opened_at=25.0), Call(streaming, opened_at=5.0)
    for call in (old, new, other):
        watch.call_opened(call)  # type: ignore[arg-type]  # a stand-in call
    assert watch.quiet_calls(quiet, since=20.0) == 1  # open before the check, nothing since
    assert watch.quiet_calls(streaming, since=20.0) == 0  # it delivered output during the check
    assert watch.fail_calls(quiet, since=float("inf"), reason="hung") == 2
    assert [str(e) for e in old.stalled + new.stalled] == [str(EngineStalled("hung", engine="e"))] * 2
    assert watch.quiet_calls(quiet, since=100.0) == 0  # failed calls are no longer watched


async def test_aborts_handed_to_the_watch_run_in_its_task_and_only_while_it_runs(nursery):
    sent: list[str] = []

    class Client:
        name = "e"

        async def abort(self, rid: str, *, timeout: float) -> None:
            await trio.sleep(0.01)
            sent.append(rid)

    watch = StreamWatch()
    assert not watch.abort_later(Client(), "r0", 1.0)  # not running: the caller aborts in place
    nursery.start_soon(watch.run)
    await trio.sleep(0.01)  # the watch task starts
    assert watch.abort_later(Client(), "r1", 1.0)
    await trio.sleep(0.1)
    assert sent == ["r1"]
