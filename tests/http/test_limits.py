"""The plain decisions behind the HTTP server's limits: read deadlines, the connection cap, log throttling."""

from __future__ import annotations

import math

import h11

from trio_direct.config import parse_serve_args
from trio_direct.http.limits import (
    ConnectionGate,
    ConnectionLimits,
    ReadDeadlines,
    ReadPhase,
    Throttle,
    connection_cap,
    fd_reserve,
)

LIMITS = ConnectionLimits(header_read_timeout=10, body_read_timeout=30, keep_alive_timeout=75)


def test_a_new_connection_must_send_its_whole_head_within_the_header_timeout_of_its_accept():
    deadlines = ReadDeadlines(LIMITS, accepted_at=100.0)
    assert deadlines.next_read(h11.IDLE, False, now=100.0) == (ReadPhase.HEAD, 110.0)
    # bytes trickling in do not move the deadline
    assert deadlines.next_read(h11.IDLE, True, now=104.0) == (ReadPhase.HEAD, 110.0)
    assert deadlines.next_read(h11.IDLE, True, now=109.0) == (ReadPhase.HEAD, 110.0)


def test_a_body_may_pause_up_to_the_body_timeout_between_reads():
    deadlines = ReadDeadlines(LIMITS, accepted_at=0.0)
    assert deadlines.next_read(h11.SEND_BODY, False, now=1.0) == (ReadPhase.BODY, 31.0)
    assert deadlines.next_read(h11.SEND_BODY, False, now=25.0) == (ReadPhase.BODY, 55.0)


def test_once_the_request_is_read_reads_have_no_deadline_however_long_the_response_streams():
    deadlines = ReadDeadlines(LIMITS, accepted_at=0.0)
    for state in (h11.DONE, h11.MUST_CLOSE):
        assert deadlines.next_read(state, False, now=5.0) == (ReadPhase.RESPONSE, math.inf)


def test_a_kept_alive_connection_idles_freely_and_times_its_next_head_from_its_first_byte():
    deadlines = ReadDeadlines(LIMITS, accepted_at=0.0)
    deadlines.next_read(h11.DONE, False, now=2.0)  # first request read, answered, recycled
    assert deadlines.next_read(h11.IDLE, False, now=3.0) == (ReadPhase.IDLE, math.inf)
    assert deadlines.next_read(h11.IDLE, True, now=50.0) == (ReadPhase.HEAD, 60.0)
    assert deadlines.next_read(h11.IDLE, True, now=55.0) == (ReadPhase.HEAD, 60.0)
    assert deadlines.next_read(h11.SEND_BODY, False, now=56.0)[0] is ReadPhase.BODY


def test_zero_means_no_timeout():
    config = parse_serve_args(["--header-read-timeout", "0", "--body-read-timeout", "0", "--keep-alive-timeout", "0"])
    limits = ConnectionLimits.from_config(config)
    assert (limits.header_read_timeout, limits.body_read_timeout, limits.keep_alive_timeout) == (math.inf,) * 3
    assert ReadDeadlines(limits, 0.0).next_read(h11.IDLE, True, now=1.0) == (ReadPhase.HEAD, math.inf)


def test_timeouts_and_the_connection_cap_come_from_flags_and_environment():
    limits = ConnectionLimits.from_config(parse_serve_args(["--header-read-timeout", "3", "--max-connections", "50"]))
    assert (limits.header_read_timeout, limits.max_connections) == (3.0, 50)
    env = {"TRIO_DIRECT_BODY_READ_TIMEOUT": "7", "TRIO_DIRECT_KEEP_ALIVE_TIMEOUT": "9"}
    limits = ConnectionLimits.from_config(parse_serve_args([], environ=env))
    assert (limits.body_read_timeout, limits.keep_alive_timeout) == (7.0, 9.0)
    defaults = ConnectionLimits.from_config(parse_serve_args([], environ={}))
    assert defaults == ConnectionLimits(header_read_timeout=10, body_read_timeout=30, keep_alive_timeout=75)


def test_the_default_connection_cap_leaves_open_files_for_everything_else():
    assert connection_cap(0, 1024) == 1024 - 102
    assert connection_cap(0, 256) == 256 - 64
    assert connection_cap(0, 65536) == 65536 - 6553
    assert connection_cap(0, 40) == 20  # a tiny limit: at most half is reserved
    assert connection_cap(500, 1024) == 500  # an explicit cap is taken as given
    assert all(fd_reserve(limit) <= limit // 2 for limit in (2, 64, 100, 1024))


def test_the_gate_admits_up_to_the_cap_and_again_once_a_connection_closed():
    gate = ConnectionGate(2)
    assert gate.admit() and gate.admit()
    assert not gate.admit()
    assert gate.open == 2
    gate.release()
    assert gate.admit() and not gate.admit()


def test_a_recurring_condition_is_reported_at_once_then_once_per_interval_with_its_count():
    throttle = Throttle(interval=10.0)
    assert throttle.occurred(100.0) == 1
    assert [throttle.occurred(100.0 + step / 10) for step in range(1, 100)] == [None] * 99
    assert throttle.occurred(110.0) == 100  # the 99 held back and this one
    assert throttle.occurred(111.0) is None
    assert throttle.take_unreported() == 1
    assert throttle.take_unreported() == 0
