"""OpenTelemetry traces of requests: off unless configured, and then one span per request with a
child per stage.

On when ``--otlp-traces-endpoint`` is given, or when the standard variables ask for it
(``OTEL_TRACES_EXPORTER`` other than ``none``, or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_ENDPOINT``); spans go out over OTLP/HTTP (protobuf) from the SDK's batch
processor thread, never from the event loop. The SDK reads its other settings from the environment
as usual (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...).

Off, nothing of OpenTelemetry is imported and a request pays one flag check; on, a request has
spans for itself (continuing the client's W3C ``traceparent``), its planning, its wait in the
admission queue, each engine call (engine, role, rid, tokens), each migration and its response, and
never a span per token. The engine gets each call's context in ``GenerateRequest.trace_headers``
(native API; SMG's has no such field). Spans are parented explicitly on the request's span, so the
trio tasks a request starts need no context of their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["ENABLED", "RequestTrace", "configure", "disable", "start_request", "wanted"]

log = logging.getLogger(__name__)

#: Whether requests are traced (read on every request: a plain module global).
ENABLED = False

_tracer: Any = None
_provider: Any = None
_propagator: Any = None
_trace_api: Any = None


def wanted(endpoint: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the flag or the standard ``OTEL_*`` variables turn tracing on."""
    environ = os.environ if environ is None else environ
    if endpoint:
        return True
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(endpoint: str | None = None, *, exporter: Any = None) -> bool:
    """Turn tracing on if wanted (or with `exporter`, e.g. an in-memory one in tests); True when on."""
    global ENABLED, _tracer, _provider, _propagator, _trace_api
    if ENABLED:
        return True
    if exporter is None and not wanted(endpoint):
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    service = os.environ.get("OTEL_SERVICE_NAME") or "trio-direct"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        for name in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").lower().split(","):
            provider.add_span_processor(BatchSpanProcessor(_exporter(name.strip(), endpoint)))
    _provider, _tracer, _propagator, _trace_api = (
        provider,
        provider.get_tracer("trio_direct"),
        TraceContextTextMapPropagator(),
        trace,
    )
    ENABLED = True
    log.info("OpenTelemetry tracing on (service %s)", service)
    return True


def _exporter(name: str, endpoint: str | None) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("OTEL_TRACES_EXPORTER=%s is not supported; exporting over OTLP/HTTP", name)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint or None)


def disable() -> None:
    """Flush and turn tracing off (process exit; tests)."""
    global ENABLED, _tracer, _provider
    provider, _provider = _provider, None
    ENABLED, _tracer = False, None
    if provider is not None:
        provider.shutdown()


def start_request(scope: Mapping[str, Any], request_id: str) -> RequestTrace:
    """The span of one HTTP request (tracing on), continuing the client's ``traceparent``."""
    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate")
    }
    parent = _propagator.extract(carrier) if carrier else None
    method, path = scope.get("method", ""), scope.get("path", "")
    span = _tracer.start_span(
        f"{method} {path}",
        context=parent,
        kind=_trace_api.SpanKind.SERVER,
        attributes={"http.request.method": method, "url.path": path, "trio_direct.request_id": request_id},
    )
    return RequestTrace(span)


class RequestTrace:
    """One request's span and the children it gets (`start_request`)."""

    __slots__ = ("span", "_context", "body_read_at")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._context = _trace_api.set_span_in_context(span)
        #: When the body was read (ns): planning ran from then until the request asked for its turn.
        self.body_read_at: int | None = None

    @contextmanager
    def child(self, name: str, **attributes: Any) -> Iterator[Any]:
        """A child span of the request for the duration of the block."""
        span = _tracer.start_span(name, context=self._context, attributes=attributes or None)
        try:
            yield span
        finally:
            span.end()

    def planned(self) -> None:
        """Planning ended now: its span runs from the body's arrival to here."""
        if self.body_read_at is not None:
            _tracer.start_span("plan", context=self._context, start_time=self.body_read_at).end()
            self.body_read_at = None

    def engine_span(self, engine: str, role: str, request: Any) -> Any:
        """The span of one engine call; the call's request carries its context to the engine."""
        span = _tracer.start_span(
            "engine.generate",
            context=self._context,
            kind=_trace_api.SpanKind.CLIENT,
            attributes={
                "trio_direct.engine": engine,
                "trio_direct.role": role,
                "trio_direct.rid": request.rid,
                "trio_direct.prompt_tokens": len(request.input_ids),
            },
        )
        headers: dict[str, str] = {}
        _propagator.inject(headers, context=_trace_api.set_span_in_context(span))
        request.trace_headers = headers
        return span

    def end_engine_span(self, span: Any, *, ended: bool) -> None:
        span.set_attribute("trio_direct.ended_at_engine", ended)
        span.end()

    def event(self, name: str, **attributes: Any) -> None:
        """A moment in the request (a migration): a span of its own, with `attributes`."""
        _tracer.start_span(name, context=self._context, attributes=attributes).end()

    def end(self, status: int, model: str) -> None:
        span = self.span
        span.set_attribute("http.response.status_code", status)
        if model:
            span.set_attribute("gen_ai.request.model", model)
        if status >= 500:
            span.set_status(_trace_api.Status(_trace_api.StatusCode.ERROR))
        span.end()
