"""The engine URL forms users write on the command line, and the errors for junk."""

from __future__ import annotations

import pytest

from trio_direct.fleet.engine_url import parse_engine_url


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://127.0.0.1:30000", ("127.0.0.1", 30000)),
        ("grpc://engine-0.svc:50051", ("engine-0.svc", 50051)),
        ("GRPC://engine:1", ("engine", 1)),
        ("localhost:8000", ("localhost", 8000)),
        ("http://10.0.0.5:30000/", ("10.0.0.5", 30000)),
        ("  node7:65535 ", ("node7", 65535)),
        ("[::1]:30000", ("::1", 30000)),
        ("grpc://[fe80::1]:7000", ("fe80::1", 7000)),
    ],
)
def test_accepted_forms_name_the_grpc_address(url, address):
    assert parse_engine_url(url) == address


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("", "empty"),
        ("localhost", "no port"),
        ("http://localhost", "no port"),
        ("[::1]", "no port"),
        ("host:0", "bad port"),
        ("host:65536", "bad port"),
        ("host:http", "bad port"),
        ("host:", "bad port"),
        ("host:-1", "bad port"),
        ("https://host:443", "unknown scheme 'https'"),
        ("zmq://host:5557", "unknown scheme 'zmq'"),
        ("http://host:80/v1", "without a path"),
        ("::1:30000", "brackets"),
        ("[::1:30000", "unclosed"),
        ("[::1]30000", "':PORT'"),
        (":30000", "no host"),
    ],
)
def test_junk_is_refused_with_a_message_that_says_why(url, complaint):
    with pytest.raises(ValueError, match="engine URL|empty") as caught:
        parse_engine_url(url)
    assert complaint in str(caught.value)
