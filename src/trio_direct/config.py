"""`trio-direct serve` settings: every flag also readable from a ``TRIO_DIRECT_*`` environment variable.

The flag wins over the environment, the environment over the default. Repeatable flags
(``--engine-url``) take a comma- or space-separated list from the environment. `hypercorn
trio_direct.app:app` has no command line, so there the environment is the only source.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from trio_direct.fleet.engine_apis import engine_api_choices
from trio_direct.routing.load_aware import PRESETS
from trio_direct.routing.policies import RoutingSettings, routing_policy_names

ENV_PREFIX = "TRIO_DIRECT_"


@dataclass(slots=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    engine_url: list[str] = field(default_factory=list)
    prefill_engine_url: list[str] = field(default_factory=list)
    engine_dns: list[str] = field(default_factory=list)
    engine_dns_srv: list[str] = field(default_factory=list)
    engine_file: str | None = None
    discovery_interval: float = 5.0
    discovery_grace: float | None = None
    discovery_nameserver: str | None = None
    drain_timeout: float = 30.0
    enforce_disagg: bool = False
    decode_abort_deadline: float = 30.0
    engine_api: str = "auto"  # a registered engine API, or auto (_CHOICES)
    engine_wait_timeout: float = 120.0
    engine_join_grace: float = 5.0
    connect_timeout: float = 5.0
    model_path: list[str] = field(default_factory=list)
    served_model_name: list[str] = field(default_factory=list)
    kv_cache_block_size: int | None = None
    chat_template: str | None = None
    router_mode: str = "round-robin"
    router_preset: str = "ttft"
    router_kv_overlap_score_credit: float | None = None
    router_prefill_load_scale: float | None = None
    router_temperature: float | None = None
    router_kv_events: bool = True
    router_ttl_secs: float = 120.0
    router_session_ttl: float = 300.0
    router_affinity_from_user: bool = False
    router_session_busy_fraction: float = 0.95
    load_poll_interval: float = 1.0
    health_interval: float = 5.0
    health_timeout: float = 2.0
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    abort_timeout: float = 5.0
    max_retries: int = 1
    graceful_shutdown_timeout: float = 30.0
    max_body_bytes: int = 32 * 1024 * 1024
    header_read_timeout: float = 10.0
    body_read_timeout: float = 30.0
    keep_alive_timeout: float = 75.0
    max_connections: int = 0
    api_key: str | None = None
    admin_api_key: str | None = None
    max_concurrent_requests: int = 0
    max_queued_requests: int = 0
    queue_timeout: float = 30.0
    engine_busy_threshold: str = ""
    migration_limit: int = 1
    stream_idle_timeout: float = 120.0
    engine_keepalive_interval: float = 360.0
    engine_keepalive_timeout: float = 20.0
    sse_keepalive: float = 15.0
    otlp_traces_endpoint: str | None = None
    cors_allow_origins: str = ""
    max_n: int = 128
    allow_image_fetch: bool = False
    image_fetch_timeout: float = 10.0
    image_fetch_max_bytes: int = 20 * 1024 * 1024
    responses_store_max_items: int = 4096
    responses_store_max_bytes: int = 256 * 1024 * 1024
    gc_full_collection_growth: float = 1.0
    mock_engines: int = 2
    mock_speedup: float = 1.0
    log_level: str = "info"
    default_max_tokens: int | None = None
    access_log: bool = True
    log_format: str = "text"
    state_store: str = ""
    state_store_ttl: float = 30 * 24 * 3600.0
    state_store_max_entry_bytes: int = 16 * 1024 * 1024
    state_store_timeout: float = 5.0
    fleet_sync_interval: float = 2.0
    tenants_file: str | None = None
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_tenant_claim: str = "sub"
    client_write_timeout: float = 30.0
    body_total_timeout: float = 120.0
    max_messages: int = 10_000
    metrics_api_key: str | None = None


_HELP = {
    "host": "address to listen on",
    "port": "port to listen on",
    "workers": "frontend processes serving the port, each with its own routing state, sharing the state store "
    "(see docs/operations.md)",
    "engine_url": "gRPC address of an SGLang engine (http://, grpc:// or host:port); repeat for more. "
    "None: start built-in mock engines",
    "prefill_engine_url": "an engine expected to be a prefill engine (checked against its probe); repeat for more",
    "engine_dns": "NAME:PORT: every A/AAAA record of NAME is an engine at PORT, looked up every --discovery-interval "
    "(a Kubernetes headless Service); repeat for more",
    "engine_dns_srv": "NAME: every SRV record of NAME is an engine at its target and port (Kubernetes named ports, "
    "Consul); repeat for more",
    "engine_file": "a JSON or YAML list of engine URLs (each optionally with a model and a role), re-read when it "
    "changes; a malformed file keeps the last good list",
    "discovery_interval": "seconds between lookups of --engine-dns, --engine-dns-srv and --engine-file",
    "discovery_grace": "seconds an engine must be missing from successful answers before it leaves (default: one "
    "--discovery-interval)",
    "discovery_nameserver": "HOST[:PORT] of the DNS server to ask instead of the system resolver",
    "drain_timeout": "seconds a leaving engine's in-flight requests may take to finish; then each gets its Abort there "
    "and moves to another engine (within --migration-limit; else it ends with an error)",
    "enforce_disagg": "with prefill engines configured, answer 503 while none is healthy instead of serving aggregated",
    "decode_abort_deadline": "seconds a cancelled decode leg may wait for its first message (the KV transfer) before its Abort",
    "engine_api": "engine gRPC API: auto (SGLang native, then SGLang SMG, then vLLM), native, smg or vllm",
    "engine_wait_timeout": "at most this many seconds start-up waits for engines; it fails only if none is up by then",
    "engine_join_grace": "seconds start-up waits for the other engines once one is up; those still down join when they come up",
    "connect_timeout": "seconds to wait for a TCP connection to an engine",
    "model_path": "the tokenizer: a local model folder or a Hugging Face model id (default: the engines' tokenizer "
    "path; tried as a folder, then in the Hugging Face cache, then fetched from an SMG engine); with several models "
    "NAME=PATH per model (repeatable); alias --tokenizer-path",
    "served_model_name": "model name clients use (default: the engines' served name): one NAME serves every engine "
    "as one model; REPORTED=NAME (repeatable) renames one model",
    "kv_cache_block_size": "KV block size (default: the engines' page size)",
    "chat_template": "a Jinja chat template file overriding the model's",
    "router_mode": "how requests are spread over engines: round-robin, random, kv (prefix overlap and load), "
    "least-load (fewest requests in flight) or power-of-two (the less loaded of two drawn at random)",
    "router_preset": "kv: the cost's defaults: ttft (prefill work weighs 10x decode blocks) or dynamo (Dynamo's 1:1); "
    "the three flags below override it",
    "router_kv_overlap_score_credit": "kv: weight of cached prefix blocks against prefill work (0 = load only; "
    "default: the preset's, 1)",
    "router_prefill_load_scale": "kv: weight of prefill blocks against decode blocks in the cost (default: the "
    "preset's, 10 for ttft, 1 for dynamo)",
    "router_temperature": "kv: 0 picks the cheapest engine; > 0 samples, softer the higher (default: the preset's, 0)",
    "router_kv_events": "kv: index the engines' KV events; --no-router-kv-events learns from routing decisions instead",
    "router_ttl_secs": "kv without events: how long a routed prefix is assumed cached",
    "router_session_ttl": "seconds a session (X-Session-ID header) sticks to its engine after its last request, "
    "unless that engine is down or busy (0 = no session affinity)",
    "router_affinity_from_user": "also take the OpenAI `user` field as the session key",
    "router_session_busy_fraction": "a session leaves its engine when the engine's polled KV cache use is at or above "
    "this fraction (engines over --engine-busy-threshold, when set, are left too)",
    "health_interval": "seconds between HealthCheck calls per engine (0 = no health checks)",
    "health_timeout": "seconds a HealthCheck may take before it counts as failed; unanswered while the engine's "
    "open calls produce nothing, the engine is hung: marked down at once, its requests retried or migrated",
    "load_poll_interval": "seconds between GetLoad polls: the engines' load as every frontend sees it, corrected by "
    "this one's own requests since (kv, least-load, power-of-two), and which engines are busy (with "
    "--engine-busy-threshold); 0 = off",
    "tool_call_parser": "tool-call parser name (default: the engines'); alias --dyn-tool-call-parser",
    "reasoning_parser": "reasoning parser name (default: the engines'); alias --dyn-reasoning-parser",
    "graceful_shutdown_timeout": "on SIGTERM/SIGINT: seconds in-flight requests may take to finish before they are aborted",
    "max_retries": "times a request whose engine cannot be reached or hangs is retried on another engine, before its "
    "first token",
    "abort_timeout": "seconds an Abort to an engine may take before it is given up",
    "api_key": "require this Bearer token on every route (/v1/*, /generate, /tokenize, /debug/*, ...) but "
    "/live, /health, /health_generate, /metrics and /version, which stay open for probes",
    "admin_api_key": "serve the admin API (/admin/engines) to clients sending this Bearer token (off without it)",
    "max_concurrent_requests": "completion requests served at once; more wait in the queue (--max-queued-requests) "
    "or get 429 with Retry-After (0 = no limit)",
    "max_queued_requests": "requests that may wait for a slot (or for an engine below --engine-busy-threshold), "
    "by priority then arrival; more get 429 at once (0 = no queue)",
    "queue_timeout": "seconds a queued request waits before it is answered 503 with Retry-After",
    "engine_busy_threshold": "an engine is busy at this many running + waiting requests (e.g. 64), at this KV usage "
    "fraction (e.g. 0.9), or either (64,0.9), from GetLoad polls and this frontend's own requests: busy engines get no "
    "new requests while another is not busy, and requests queue while all are (empty = off)",
    "migration_limit": "times a stream whose engine fails after its first token continues on another engine "
    "(0 = the stream ends with an error event)",
    "stream_idle_timeout": "seconds an engine may send nothing on a request, and nothing on any other, before it "
    "counts as hung: marked down, its requests migrated (0 = off)",
    "engine_keepalive_interval": "seconds between HTTP/2 pings on an engine connection with open calls (keep it above "
    "the engine's grpc.http2.min_ping_interval_without_data_ms, 300 s by default; 0 = no pings)",
    "engine_keepalive_timeout": "seconds a ping may go unanswered before the connection counts as dead",
    "sse_keepalive": "seconds a stream may go silent before a ': ping' comment is sent (0 = never)",
    "otlp_traces_endpoint": "OTLP/HTTP endpoint for OpenTelemetry traces (e.g. http://collector:4318/v1/traces); "
    "tracing is also on when the standard OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*ENDPOINT variables say so",
    "max_body_bytes": "largest request body accepted (413 above; a larger Content-Length is refused before the body "
    "is read)",
    "header_read_timeout": "seconds a request head may take to arrive, from the connection's accept or the head's "
    "first byte; then 408 and the connection closes (0 = no limit)",
    "body_read_timeout": "seconds a request body may pause between bytes; then 408 and the connection closes "
    "(0 = no limit)",
    "keep_alive_timeout": "seconds an idle kept-alive connection stays open between requests (0 = no limit)",
    "max_connections": "open client connections per process; more are answered 503 and closed at once "
    "(0 = the open-file limit less a reserve of max(64, 10%%))",
    "cors_allow_origins": "browser origins allowed to call the API (comma-separated, * for any; default: no CORS)",
    "max_n": "largest `n` accepted",
    "allow_image_fetch": "fetch http(s) image URLs in the frontend and send the engines their bytes (off: URLs go to the "
    "engines as given). The frontend then reaches any host a client names: enable it only where that is safe (SSRF)",
    "image_fetch_timeout": "with --allow-image-fetch: seconds one image may take to fetch",
    "image_fetch_max_bytes": "with --allow-image-fetch: largest image fetched",
    "responses_store_max_items": "with the memory state store: entries kept (stored responses, conversations), "
    "oldest written evicted first",
    "responses_store_max_bytes": "with the memory state store: bound on all entries' bytes together",
    "gc_full_collection_growth": "run a full garbage-collector pass when the heap grew by this fraction since the last "
    "one, like Go's GOGC/100 (0 = CPython's own schedule, which stalls every stream for a full pass every few "
    "seconds under load; see docs/operations.md)",
    "mock_engines": "number of built-in mock engines started when no --engine-url is given",
    "mock_speedup": "timing divisor of the built-in mock engines (inf = as fast as possible)",
    "log_level": "debug, info, warning or error",
    "default_max_tokens": "completion limit of OpenAI requests that set no max_tokens / max_completion_tokens / "
    "max_output_tokens (default: none, as OpenAI: until EOS or the context is full)",
    "access_log": "log one line per request at info: method, path, status, duration, request id, model, engine and "
    "tokens (--no-access-log: off)",
    "log_format": "text (one line per record) or json (one JSON object per line, for log collectors)",
    "state_store": "where stored responses, conversations and the admin API's engines live, shared by every "
    "process that names the same store: memory, sqlite:///PATH (one host; WAL), postgresql://USER:PASS@HOST/DB or "
    "redis://HOST:PORT/DB (several hosts). Empty: memory for one process, a SQLite file shared by the --workers "
    "of one serve for its lifetime (see docs/operations.md, State)",
    "state_store_ttl": "seconds a stored response or conversation is kept after its last write (0 = for ever)",
    "state_store_max_entry_bytes": "largest stored response, conversation item or entry; a larger response is "
    "answered but not stored",
    "state_store_timeout": "seconds one state store call may take; then the request that needed it gets 503",
    "fleet_sync_interval": "seconds between reads of the admin API's engines from the state store (each "
    "frontend follows the engines added or removed through any other; 0 = only at start-up)",
    "tenants_file": "YAML file of tenants: their API keys (SHA-256), models, priority class, weight and limits; "
    "re-read when it changes (see docs/operations.md, Tenants)",
    "jwt_jwks_url": "accept JWT bearer tokens signed by a key of this JWKS (fetched, cached, fetched again for an "
    "unknown kid); the tenant is the --jwt-tenant-claim claim",
    "jwt_issuer": "with --jwt-jwks-url: the `iss` tokens must carry",
    "jwt_audience": "with --jwt-jwks-url: the `aud` tokens must carry",
    "jwt_tenant_claim": "with --jwt-jwks-url: the claim that names the tenant",
    "client_write_timeout": "seconds a response write may make no progress (a client that stopped reading) before "
    "the connection is closed and its engine request aborted (0 = no limit)",
    "body_total_timeout": "seconds a whole request body may take to arrive, however steadily it trickles; then 408 "
    "and the connection closes (0 = no limit)",
    "max_messages": "most messages (and most content parts of one message, and input items) one request may carry; "
    "more are refused 400 before the body is decoded (0 = no cap)",
    "metrics_api_key": "require this Bearer token on /metrics (which shows the engines' addresses); default: open",
}
#: Flags with a fixed set of values; the registries' are read when the flags are declared, so an
#: engine API or routing policy registered before start-up is a choice too.
_CHOICES: dict[str, Callable[[], tuple[str, ...]] | tuple[str, ...]] = {
    "engine_api": engine_api_choices,
    "router_mode": routing_policy_names,
    "router_preset": tuple(PRESETS),
    "log_level": ("debug", "info", "warning", "error"),
    "log_format": ("text", "json"),
}
#: Repeatable flags (a comma- or space-separated list in the environment), and their metavar.
_URL_LISTS = {
    "engine_url": "URL",
    "prefill_engine_url": "URL",
    "engine_dns": "NAME:PORT",
    "engine_dns_srv": "NAME",
    "model_path": "[NAME=]PATH",
    "served_model_name": "[REPORTED=]NAME",
}
#: Settings whose default is None ("not given"), and the type of a given value.
_OPTIONAL_TYPES = {
    "kv_cache_block_size": int,
    "router_kv_overlap_score_credit": float,
    "router_prefill_load_scale": float,
    "router_temperature": float,
    "discovery_grace": float,
    "default_max_tokens": int,
}
#: Other spellings of a flag: Dynamo's (`python -m dynamo.frontend`) for those its users type.
_ALIASES = {
    "tool_call_parser": ["--dyn-tool-call-parser"],
    "reasoning_parser": ["--dyn-reasoning-parser"],
    "host": ["--http-host"],
    "port": ["--http-port"],
    "model_path": ["--tokenizer-path"],
}


def _parse_float(text: str) -> float:
    value = float(text)
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number")
    return value


def _converter(default: object):
    if isinstance(default, bool):
        return lambda text: text.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return _parse_float
    return str


def add_serve_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Declare every `ServeConfig` field as a flag whose default comes from the environment."""
    environ = os.environ if environ is None else environ
    defaults = ServeConfig()
    for spec in fields(ServeConfig):
        default = getattr(defaults, spec.name)
        env_name = ENV_PREFIX + spec.name.upper()
        flag = "--" + spec.name.replace("_", "-")
        if spec.name in _URL_LISTS:
            env_default = environ.get(env_name, "").replace(",", " ").split()
            parser.add_argument(
                flag,
                *_ALIASES.get(spec.name, []),
                dest=spec.name,
                action="append",
                default=None,
                metavar=_URL_LISTS[spec.name],
                help=f"{_HELP[spec.name]} [{env_name}]",
            )
            parser.set_defaults(**{spec.name + "_env": env_default})
            continue
        if isinstance(default, bool):
            value = environ.get(env_name)
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=_converter(default)(value) if value is not None else default,
                help=f"{_HELP[spec.name]} [{env_name}]",
            )
            continue
        convert = _converter(default if default is not None else _OPTIONAL_TYPES.get(spec.name, str)())
        value = environ.get(env_name)
        declared = _CHOICES.get(spec.name)
        choices = declared() if callable(declared) else declared
        if value is not None and choices is not None and convert(value) not in choices:
            # argparse checks the choices of what is typed, not of a default: an environment value
            # outside them would otherwise be served as given.
            parser.error(f"{env_name}: invalid choice {value!r} (choose from {', '.join(choices)})")
        parser.add_argument(
            flag,
            *_ALIASES.get(spec.name, []),
            dest=spec.name,
            type=convert,
            default=convert(value) if value is not None else default,
            choices=choices,
            help=f"{_HELP[spec.name]} [{env_name}; default %(default)s]",
        )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    values = {spec.name: getattr(args, spec.name) for spec in fields(ServeConfig) if spec.name not in _URL_LISTS}
    for name in _URL_LISTS:
        given = getattr(args, name)
        values[name] = list(given if given is not None else getattr(args, name + "_env"))
    return ServeConfig(**values)


def routing_settings(config: ServeConfig) -> RoutingSettings:
    """What routing needs of the settings (routing/ does not know `ServeConfig`)."""
    return RoutingSettings(
        mode=config.router_mode,
        enforce_disagg=config.enforce_disagg,
        kv_cache_block_size=config.kv_cache_block_size,
        preset=config.router_preset,
        overlap_score_credit=config.router_kv_overlap_score_credit,
        prefill_load_scale=config.router_prefill_load_scale,
        temperature=config.router_temperature,
        kv_events=config.router_kv_events,
        ttl_secs=config.router_ttl_secs,
        session_busy_fraction=config.router_session_busy_fraction,
    )


def config_from_env(environ: Mapping[str, str] | None = None) -> ServeConfig:
    """The settings `hypercorn trio_direct.app:app` runs with."""
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser, environ)
    return config_from_args(parser.parse_args([]))


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser(prog="trio-direct serve")
    add_serve_arguments(parser, environ)
    return config_from_args(parser.parse_args(argv))
