"""HTTP/2 keepalive pings to engines: on by default, spaced so that a stock grpcio server never
counts them as abuse (its minimum is 5 minutes without data), and off with an interval of 0."""

from __future__ import annotations

from trio_direct.engine.transport import ChannelPool, client_config
from trio_direct.engine.transport.client import DEFAULT_KEEPALIVE_INTERVAL, HTTP2_CONFIG

GRPCIO_MIN_PING_INTERVAL_WITHOUT_DATA = 300.0


def test_default_pings_stay_above_grpcios_minimum_and_keep_going_on_a_receive_only_connection():
    config = client_config()
    assert config._keepalive_time == DEFAULT_KEEPALIVE_INTERVAL > GRPCIO_MIN_PING_INTERVAL_WITHOUT_DATA
    # grpclib would otherwise stop after two pings without a request sent (a long generation).
    assert config._http2_max_pings_without_data == 0
    assert config._http2_min_sent_ping_interval_without_data == config._keepalive_time
    assert config._keepalive_permit_without_calls is False  # an idle connection is not pinged
    assert config.http2_stream_window_size == HTTP2_CONFIG.http2_stream_window_size


def test_flags_set_the_interval_and_timeout_and_zero_turns_pings_off():
    config = client_config(2.5, 1.0)
    assert (config._keepalive_time, config._keepalive_timeout) == (2.5, 1.0)
    assert client_config(0, 20) is HTTP2_CONFIG
    pool = ChannelPool(config=config)
    assert pool.get("127.0.0.1", 1).config is config
