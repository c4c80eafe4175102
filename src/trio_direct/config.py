"""`trio-direct serve` settings: every flag also readable from a ``TRIO_DIRECT_*`` environment variable.

Each setting is one `ServeConfig` field declared with `trio_direct.options.option` (its flag, type,
default, help and choices); the command line, ``--help`` and the environment defaults all come
from it. The flag wins over the environment, the environment over the default. Repeatable flags
(``--engine-url``) take a comma- or space-separated list from the environment. `hypercorn
trio_direct.app:app` has no command line, so there the environment is the only source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trio_direct.fleet.engine_apis import engine_api_choices
from trio_direct.options import option, parse_options
from trio_direct.routing.load_aware import PRESETS
from trio_direct.routing.policies import RoutingSettings, routing_policy_names

ENV_PREFIX = "TRIO_DIRECT_"


@dataclass(slots=True)
class ServeConfig:
    """Everything `trio-direct serve` takes (see docs/direct-engines.md). Add a setting as one more
    field at the end: its flag, ``--help`` line and ``TRIO_DIRECT_*`` variable follow."""

    host: str = option("127.0.0.1", help="address to listen on", aliases=("--http-host",))
    port: int = option(8000, help="port to listen on", aliases=("--http-port",))
    workers: int = option(
        1,
        help="frontend processes serving the port, each with its own routing state, sharing the state store (see "
        "docs/operations.md)",
    )
    engine_url: list[str] = option(
        factory=list,
        help="gRPC address of an SGLang engine (http://, grpc:// or host:port); repeat for more. None: start built-in "
        "mock engines",
        metavar="URL",
    )
    prefill_engine_url: list[str] = option(
        factory=list,
        help="an engine expected to be a prefill engine (checked against its probe); repeat for more",
        metavar="URL",
    )
    engine_dns: list[str] = option(
        factory=list,
        help="NAME:PORT: every A/AAAA record of NAME is an engine at PORT, looked up every --discovery-interval (a "
        "Kubernetes headless Service); repeat for more",
        metavar="NAME:PORT",
    )
    engine_dns_srv: list[str] = option(
        factory=list,
        help="NAME: every SRV record of NAME is an engine at its target and port (Kubernetes named ports, Consul); "
        "repeat for more",
        metavar="NAME",
    )
    engine_file: str | None = option(
        None,
        help="a JSON or YAML list of engine URLs (each optionally with a model and a role), re-read when it changes; a"
        " malformed file keeps the last good list",
    )
    discovery_interval: float = option(
        5.0,
        help="seconds between lookups of --engine-dns, --engine-dns-srv and --engine-file",
    )
    discovery_grace: float | None = option(
        None,
        help="seconds an engine must be missing from successful answers before it leaves (default: one "
        "--discovery-interval)",
    )
    discovery_nameserver: str | None = option(
        None,
        help="HOST[:PORT] of the DNS server to ask instead of the system resolver",
    )
    drain_timeout: float = option(
        30.0,
        help="seconds a leaving engine's in-flight requests may take to finish; then each gets its Abort there and "
        "moves to another engine (within --migration-limit; else it ends with an error)",
    )
    enforce_disagg: bool = option(
        False,
        help="with prefill engines configured, answer 503 while none is healthy instead of serving aggregated",
    )
    decode_abort_deadline: float = option(
        30.0,
        help="seconds a cancelled decode leg may wait for its first message (the KV transfer) before its Abort",
    )
    engine_api: str = option(
        "auto",
        help="engine gRPC API: auto (SGLang native, then SGLang SMG, then vLLM), native, smg or vllm",
        choices=engine_api_choices,
    )
    engine_wait_timeout: float = option(
        120.0,
        help="at most this many seconds start-up waits for engines; it fails only if none is up by then",
    )
    engine_join_grace: float = option(
        5.0,
        help="seconds start-up waits for the other engines once one is up; those still down join when they come up",
    )
    connect_timeout: float = option(5.0, help="seconds to wait for a TCP connection to an engine")
    model_path: list[str] = option(
        factory=list,
        help="the tokenizer: a local model folder or a Hugging Face model id (default: the engines' tokenizer path; "
        "tried as a folder, then in the Hugging Face cache, then fetched from an SMG engine); with several models"
        " NAME=PATH per model (repeatable); alias --tokenizer-path",
        metavar="[NAME=]PATH",
        aliases=("--tokenizer-path",),
    )
    served_model_name: list[str] = option(
        factory=list,
        help="model name clients use (default: the engines' served name): one NAME serves every engine as one model; "
        "REPORTED=NAME (repeatable) renames one model",
        metavar="[REPORTED=]NAME",
    )
    kv_cache_block_size: int | None = option(None, help="KV block size (default: the engines' page size)")
    chat_template: str | None = option(None, help="a Jinja chat template file overriding the model's")
    router_mode: str = option(
        "round-robin",
        help="how requests are spread over engines: round-robin, random, kv (prefix overlap and load), least-load "
        "(fewest requests in flight) or power-of-two (the less loaded of two drawn at random)",
        choices=routing_policy_names,
    )
    router_preset: str = option(
        "ttft",
        help="kv: the cost's defaults: ttft (prefill work weighs 10x decode blocks) or dynamo (Dynamo's 1:1); the "
        "three flags below override it",
        choices=tuple(PRESETS),
    )
    router_kv_overlap_score_credit: float | None = option(
        None,
        help="kv: weight of cached prefix blocks against prefill work (0 = load only; default: the preset's, 1)",
    )
    router_prefill_load_scale: float | None = option(
        None,
        help="kv: weight of prefill blocks against decode blocks in the cost (default: the preset's, 10 for ttft, 1 "
        "for dynamo)",
    )
    router_temperature: float | None = option(
        None,
        help="kv: 0 picks the cheapest engine; > 0 samples, softer the higher (default: the preset's, 0)",
    )
    router_kv_events: bool = option(
        True,
        help="kv: index the engines' KV events; --no-router-kv-events learns from routing decisions instead",
    )
    router_ttl_secs: float = option(120.0, help="kv without events: how long a routed prefix is assumed cached")
    router_session_ttl: float = option(
        300.0,
        help="seconds a session (X-Session-ID header) sticks to its engine after its last request, unless that engine "
        "is down or busy (0 = no session affinity)",
    )
    router_affinity_from_user: bool = option(False, help="also take the OpenAI `user` field as the session key")
    router_session_busy_fraction: float = option(
        0.95,
        help="a session leaves its engine when the engine's polled KV cache use is at or above this fraction (engines "
        "over --engine-busy-threshold, when set, are left too)",
    )
    load_poll_interval: float = option(
        1.0,
        help="seconds between GetLoad polls: the engines' load as every frontend sees it, corrected by this one's own "
        "requests since (kv, least-load, power-of-two), and which engines are busy (with "
        "--engine-busy-threshold); 0 = off",
    )
    health_interval: float = option(5.0, help="seconds between HealthCheck calls per engine (0 = no health checks)")
    health_timeout: float = option(
        2.0,
        help="seconds a HealthCheck may take before it counts as failed; unanswered while the engine's open calls "
        "produce nothing, the engine is hung: marked down at once, its requests retried or migrated",
    )
    tool_call_parser: str | None = option(
        None,
        help="tool-call parser name (default: the engines'); alias --dyn-tool-call-parser",
        aliases=("--dyn-tool-call-parser",),
    )
    reasoning_parser: str | None = option(
        None,
        help="reasoning parser name (default: the engines'); alias --dyn-reasoning-parser",
        aliases=("--dyn-reasoning-parser",),
    )
    abort_timeout: float = option(5.0, help="seconds an Abort to an engine may take before it is given up")
    max_retries: int = option(
        1,
        help="times a request whose engine cannot be reached or hangs is retried on another engine, before its first "
        "token",
    )
    graceful_shutdown_timeout: float = option(
        30.0,
        help="on SIGTERM/SIGINT: seconds in-flight requests may take to finish before they are aborted",
    )
    max_body_bytes: int = option(
        32 * 1024 * 1024,
        help="largest request body accepted (413 above; a larger Content-Length is refused before the body is read)",
    )
    header_read_timeout: float = option(
        10.0,
        help="seconds a request head may take to arrive, from the connection's accept or the head's first byte; then "
        "408 and the connection closes (0 = no limit)",
    )
    body_read_timeout: float = option(
        30.0,
        help="seconds a request body may pause between bytes; then 408 and the connection closes (0 = no limit)",
    )
    keep_alive_timeout: float = option(
        75.0,
        help="seconds an idle kept-alive connection stays open between requests (0 = no limit)",
    )
    max_connections: int = option(
        0,
        help="open client connections per process; more are answered 503 and closed at once (0 = the open-file limit "
        "less a reserve of max(64, 10%%))",
    )
    api_key: str | None = option(
        None,
        help="require this Bearer token on every route (/v1/*, /generate, /tokenize, /debug/*, ...) but /live, "
        "/health, /health_generate, /metrics and /version, which stay open for probes",
    )
    admin_api_key: str | None = option(
        None,
        help="serve the admin API (/admin/engines) to clients sending this Bearer token (off without it)",
    )
    max_concurrent_requests: int = option(
        0,
        help="completion requests served at once; more wait in the queue (--max-queued-requests) or get 429 with "
        "Retry-After (0 = no limit)",
    )
    max_queued_requests: int = option(
        0,
        help="requests that may wait for a slot (or for an engine below --engine-busy-threshold), by priority then "
        "arrival; more get 429 at once (0 = no queue)",
    )
    queue_timeout: float = option(
        30.0,
        help="seconds a queued request waits before it is answered 503 with Retry-After",
    )
    engine_busy_threshold: str = option(
        "",
        help="an engine is busy at this many running + waiting requests (e.g. 64), at this KV usage fraction (e.g. "
        "0.9), or either (64,0.9), from GetLoad polls and this frontend's own requests: busy engines get no new "
        "requests while another is not busy, and requests queue while all are (empty = off)",
    )
    migration_limit: int = option(
        1,
        help="times a stream whose engine fails after its first token continues on another engine (0 = the stream ends"
        " with an error event)",
    )
    stream_idle_timeout: float = option(
        120.0,
        help="seconds an engine may send nothing on a request, and nothing on any other, before it counts as hung: "
        "marked down, its requests migrated (0 = off)",
    )
    engine_keepalive_interval: float = option(
        360.0,
        help="seconds between HTTP/2 pings on an engine connection with open calls (keep it above the engine's "
        "grpc.http2.min_ping_interval_without_data_ms, 300 s by default; 0 = no pings)",
    )
    engine_keepalive_timeout: float = option(
        20.0,
        help="seconds a ping may go unanswered before the connection counts as dead",
    )
    sse_keepalive: float = option(
        15.0,
        help="seconds a stream may go silent before a ': ping' comment is sent (0 = never)",
    )
    otlp_traces_endpoint: str | None = option(
        None,
        help="OTLP/HTTP endpoint for OpenTelemetry traces (e.g. http://collector:4318/v1/traces); tracing is also on "
        "when the standard OTEL_TRACES_EXPORTER / OTEL_EXPORTER_OTLP_*ENDPOINT variables say so",
    )
    cors_allow_origins: str = option(
        "",
        help="browser origins allowed to call the API (comma-separated, * for any; default: no CORS)",
    )
    max_n: int = option(128, help="largest `n` accepted")
    allow_image_fetch: bool = option(
        False,
        help="fetch http(s) image URLs in the frontend and send the engines their bytes (off: URLs go to the engines "
        "as given). The frontend then reaches any host a client names: enable it only where that is safe (SSRF)",
    )
    image_fetch_timeout: float = option(10.0, help="with --allow-image-fetch: seconds one image may take to fetch")
    image_fetch_max_bytes: int = option(20 * 1024 * 1024, help="with --allow-image-fetch: largest image fetched")
    responses_store_max_items: int = option(
        4096,
        help="with the memory state store: entries kept (stored responses, conversations), oldest written evicted "
        "first",
    )
    responses_store_max_bytes: int = option(
        256 * 1024 * 1024,
        help="with the memory state store: bound on all entries' bytes together",
    )
    gc_full_collection_growth: float = option(
        1.0,
        help="run a full garbage-collector pass when the heap grew by this fraction since the last one, like Go's "
        "GOGC/100 (0 = CPython's own schedule, which stalls every stream for a full pass every few seconds under "
        "load; see docs/operations.md)",
    )
    mock_engines: int = option(2, help="number of built-in mock engines started when no --engine-url is given")
    mock_speedup: float = option(1.0, help="timing divisor of the built-in mock engines (inf = as fast as possible)")
    log_level: str = option("info", help="debug, info, warning or error", choices=("debug", "info", "warning", "error"))
    default_max_tokens: int | None = option(
        None,
        help="completion limit of OpenAI requests that set no max_tokens / max_completion_tokens / max_output_tokens "
        "(default: none, as OpenAI: until EOS or the context is full)",
    )
    access_log: bool = option(
        True,
        help="log one line per request at info: method, path, status, duration, request id, model, engine and tokens "
        "(--no-access-log: off)",
    )
    log_format: str = option(
        "text",
        help="text (one line per record) or json (one JSON object per line, for log collectors)",
        choices=("text", "json"),
    )
    state_store: str = option(
        "",
        help="where stored responses, conversations and the admin API's engines live, shared by every process that "
        "names the same store: memory, sqlite:///PATH (one host; WAL), postgresql://USER:PASS@HOST/DB or "
        "redis://HOST:PORT/DB (several hosts). Empty: memory for one process, a SQLite file shared by the "
        "--workers of one serve for its lifetime (see docs/operations.md, State)",
    )
    state_store_ttl: float = option(
        30 * 24 * 3600.0,
        help="seconds a stored response or conversation is kept after its last write (0 = for ever)",
    )
    state_store_max_entry_bytes: int = option(
        16 * 1024 * 1024,
        help="largest stored response, conversation item or entry; a larger response is answered but not stored",
    )
    state_store_timeout: float = option(
        5.0,
        help="seconds one state store call may take; then the request that needed it gets 503",
    )
    fleet_sync_interval: float = option(
        2.0,
        help="seconds between reads of the admin API's engines from the state store (each frontend follows the engines"
        " added or removed through any other; 0 = only at start-up)",
    )
    tenants_file: str | None = option(
        None,
        help="YAML file of tenants: their API keys (SHA-256), models, priority class, weight and limits; re-read when "
        "it changes (see docs/operations.md, Tenants)",
    )
    jwt_jwks_url: str | None = option(
        None,
        help="accept JWT bearer tokens signed by a key of this JWKS (fetched, cached, fetched again for an unknown "
        "kid); the tenant is the --jwt-tenant-claim claim",
    )
    jwt_issuer: str | None = option(None, help="with --jwt-jwks-url: the `iss` tokens must carry")
    jwt_audience: str | None = option(None, help="with --jwt-jwks-url: the `aud` tokens must carry")
    jwt_tenant_claim: str = option("sub", help="with --jwt-jwks-url: the claim that names the tenant")
    client_write_timeout: float = option(
        30.0,
        help="seconds a response write may make no progress (a client that stopped reading) before the connection is "
        "closed and its engine request aborted (0 = no limit)",
    )
    body_total_timeout: float = option(
        120.0,
        help="seconds a whole request body may take to arrive, however steadily it trickles; then 408 and the "
        "connection closes (0 = no limit)",
    )
    max_messages: int = option(
        10_000,
        help="most messages (and most content parts of one message, and input items) one request may carry; more are "
        "refused 400 before the body is decoded (0 = no cap)",
    )
    metrics_api_key: str | None = option(
        None,
        help="require this Bearer token on /metrics (which shows the engines' addresses); default: open",
    )


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
    return parse_serve_args([], environ)


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServeConfig:
    """`serve`'s settings from its flags and `environ` (the process's environment when None)."""
    return parse_options(ServeConfig, argv, prog="trio-direct serve", env_prefix=ENV_PREFIX, environ=environ)
