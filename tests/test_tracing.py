"""When tracing turns on: the flag, or OpenTelemetry's standard environment variables."""

from __future__ import annotations

import pytest

from trio_direct.tracing import wanted


@pytest.mark.parametrize(
    ("endpoint", "environ", "on"),
    [
        (None, {}, False),  # off unless configured
        ("http://collector:4318/v1/traces", {}, True),  # --otlp-traces-endpoint
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        (None, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
        # the standard "none" wins over an endpoint set for other signals
        (None, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        (None, {"OTEL_TRACES_EXPORTER": " None "}, False),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
        ("http://collector:4318/v1/traces", {"OTEL_TRACES_EXPORTER": "none"}, True),  # the flag is explicit
    ],
)
def test_tracing_is_on_when_the_flag_or_the_standard_variables_say_so(endpoint, environ, on):
    assert wanted(endpoint, environ) is on
