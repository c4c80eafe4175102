"""The mock engine process: model files, KV publishers, PD bootstrap, schedulers and gRPC.

`run_mock_engine` assembles one mock SGLang engine from a `MockEngineConfig` and serves it until
cancelled. Its gRPC server (grpclib) runs on the caller's trio-asyncio loop, else on one of its own.
"""

from __future__ import annotations

import json
import logging
import math
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import trio
from tokenizers import Tokenizer

from trio_direct.engine.transport.server import RpcMethod, serve_grpc
from trio_direct.mock import MOCK_MODEL_NAME
from trio_direct.mock.bootstrap import BootstrapServer, open_bootstrap_server
from trio_direct.mock.engine import EngineInfo, MockEngine, Role
from trio_direct.mock.kv_publisher import KvEventPublishers, KvEventsConfig, describe, open_kv_publishers
from trio_direct.mock.native_service import SERVICE as NATIVE_SERVICE
from trio_direct.mock.native_service import NativeService
from trio_direct.mock.pooling import DEFAULT_EMBEDDING_DIM
from trio_direct.mock.scheduler import SchedulerConfig
from trio_direct.mock.scripted import ScriptedOutputs
from trio_direct.mock.smg_service import SERVICE as SMG_SERVICE
from trio_direct.mock.smg_service import SmgService, health_methods
from trio_direct.mock.tiny_model import default_tiny_model_dir, ensure_tiny_model
from trio_direct.mock.vllm_service import VllmService
from trio_direct.options import internal, option
from trio_direct.text.model_source import ModelFilesNotFound, find_model_directory

__all__ = ["MockEngineConfig", "ModelFiles", "RunningMockEngine", "load_model_files", "run_mock_engine"]

log = logging.getLogger(__name__)

Api = Literal["native", "smg", "both", "vllm"]
#: The levels `--log-level` takes.
LOG_LEVELS = ("debug", "info", "warning", "error")

#: Context length when neither the flag nor the model's config gives one.
_DEFAULT_CONTEXT_LENGTH = 32768


@dataclass(slots=True)
class MockEngineConfig:
    """Everything `trio-direct mock-engine` takes on its command line (see docs/mock-engine.md).

    The command's flags, ``--help`` and the object it runs with all come from these fields (declared
    with `trio_direct.options.option`); tests and the built-in mocks build one directly.
    """

    host: str = option("127.0.0.1", help="address to bind (default %(default)s)")
    port: int = option(0, help="gRPC port; 0 picks a free one (default)")
    api: Api = option(
        "both",
        help="gRPC API(s) to serve on the port: SGLang's native and/or SMG API (both adds grpc.health.v1), "
        "or vLLM's (with grpc.health.v1) (default %(default)s)",
    )
    role: Role = option(
        "aggregated",
        help="PD disaggregation role; under --api vllm reported as kv_role kv_producer/kv_consumer "
        "(default %(default)s)",
    )
    page_size: int = option(1, help="KV page size in tokens (default %(default)s)")
    dp_size: int = option(1, help="data-parallel ranks (default %(default)s)")
    num_blocks: int = option(65536, help="KV pages per rank (default %(default)s)")
    max_running_requests: int = option(256, help="decode batch cap per rank (default %(default)s)")
    max_prefill_tokens: int = option(16384, help="uncached prompt tokens per prefill step (default %(default)s)")
    context_length: int | None = option(
        None, help="context length override (default: the model config's max_position_embeddings)"
    )
    speedup: float = option(
        1.0, help="divide simulated step times by this; 'inf' runs as fast as the CPU allows (default 1)"
    )
    incremental_streaming_output: bool = option(
        False, help="native API streams deltas instead of cumulative output_ids"
    )
    kv_events_config: str | None = option(
        None, metavar="JSON", help='SGLang\'s --kv-events-config JSON (plus "format": "map"|"array")'
    )
    disaggregation_bootstrap_port: int = option(
        8998, help="bootstrap port of a prefill engine; 0 picks a free one (default %(default)s)"
    )
    bootstrap_timeout: float = option(30.0, help="seconds a PD leg waits for its partner (default %(default)s)")
    #: A local tokenizer directory; None uses the tiny ChatML model (written on first use).
    model_path: str | None = option(
        None, help="local tokenizer/model directory (default: the built-in tiny ChatML model)"
    )
    served_model_name: str | None = option(
        MOCK_MODEL_NAME,
        help="model id to report (default: %(default)s, the name `serve` gives its built-in mocks)",
    )
    tool_call_parser: str | None = option(None, help="parser name to advertise in server info")
    reasoning_parser: str | None = option(None, help="parser name to advertise in server info")
    seed: int | None = option(
        None,
        help="seed of the engine's sampling RNG, as SGLang's --random-seed: requests without a seed draw theirs "
        "from it, so a fresh engine answers the same requests in the same order alike (default: fresh entropy)",
    )
    scripted_outputs: str | None = option(
        None,
        metavar="FILE",
        help='JSON [{"match": "prompt substring" | null, "text": "..."}]: fixed answers (then EOS) for matching prompts',
    )
    #: Serve an embedding model (SGLang's ``--is-embedding``): `Embed` answers, `Generate` refuses.
    is_embedding: bool = option(
        False,
        help="serve an embedding model: Embed answers deterministic unit vectors of the config's hidden_size",
    )
    #: Take image input (``image_data``) and report it (``grpc_features``, ``supports_vision``).
    multimodal: bool = option(
        False,
        help="take image input (native image_data), each image counting a fixed number of prompt tokens",
    )
    expose_accounting: bool = option(
        True, help="add a mock_accounting key to the native GetServerInfo json_info (default on)"
    )
    log_level: str = option("info", choices=LOG_LEVELS, help="logging level (default %(default)s)")
    launch_command: str = internal("", why="the command line the engine was started with, for GetServerInfo")

    def validate(self) -> None:
        """Raise ValueError naming the first setting a mock engine cannot run with."""
        if self.api not in ("native", "smg", "both", "vllm"):
            raise ValueError(f"api must be native, smg, both or vllm, not {self.api!r}")
        if self.role not in ("aggregated", "prefill", "decode"):
            raise ValueError(f"role must be aggregated, prefill or decode, not {self.role!r}")
        for name in ("page_size", "dp_size", "num_blocks", "max_running_requests", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be at least 2")
        if not self.speedup > 0:
            raise ValueError("speedup must be > 0")
        if not self.bootstrap_timeout > 0:
            raise ValueError("bootstrap_timeout must be > 0")
        KvEventsConfig.from_json(self.kv_events_config)
        if self.scripted_outputs is not None and not Path(self.scripted_outputs).is_file():
            raise ValueError(f"--scripted-outputs {self.scripted_outputs}: no such file")
        self.model_directory()

    def model_directory(self) -> Path:
        """The folder the model's files are read from: ``--model-path`` as a local folder, or the
        Hugging Face cache's copy of a model id (downloaded when online, as SGLang does); the
        built-in tiny model without one. `ValueError` when neither has it."""
        if not self.model_path:
            return ensure_tiny_model(default_tiny_model_dir())
        try:
            return find_model_directory(self.model_path).path
        except ModelFilesNotFound as error:
            raise ValueError(f"--model-path {self.model_path}: {error}") from None


@dataclass(slots=True, frozen=True)
class ModelFiles:
    """What the mock reads from an HF-style model directory: tokenizer, EOS ids, limits."""

    path: Path
    tokenizer: Tokenizer | None
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    special_token_ids: frozenset[int]
    context_length: int
    model_type: str
    architectures: tuple[str, ...]
    #: `hidden_size` of config.json: the size of an embedding model's vectors.
    hidden_size: int = DEFAULT_EMBEDDING_DIM


@dataclass(slots=True, frozen=True)
class RunningMockEngine:
    """A served mock engine, as `run_mock_engine` reports it once it accepts calls."""

    host: str
    port: int
    bootstrap_port: int | None
    kv_events: dict[str, Any] | None
    engine: MockEngine
    info: EngineInfo
    #: The prefill engine's PD bootstrap listener (None on other roles).
    bootstrap: BootstrapServer | None = None

    def ready_event(self) -> dict[str, Any]:
        """The JSON line the CLI prints when ready."""
        return {
            "event": "ready",
            "host": self.host,
            "port": self.port,
            "bootstrap_port": self.bootstrap_port,
            "kv_events": self.kv_events,
        }


def load_model_files(path: Path) -> ModelFiles:
    """Read tokenizer and configs; EOS ids from generation_config.json, then config.json, then the
    tokenizer config's ``eos_token``, as SGLang resolves them."""
    path = Path(path)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json")) if (path / "tokenizer.json").is_file() else None
    config = _read_json(path / "config.json")
    generation = _read_json(path / "generation_config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    if not eos and tokenizer is not None:
        token = tokenizer_config.get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        token_id = tokenizer.token_to_id(token) if isinstance(token, str) else None
        eos = (token_id,) if token_id is not None else ()
    special: frozenset[int] = frozenset()
    if tokenizer is not None:
        vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        special = frozenset(i for i, added in tokenizer.get_added_tokens_decoder().items() if added.special)
        # Never sampled either: tokens that are no text on their own (partial UTF-8 bytes, control
        # characters), so the mock's made-up answers read as words rather than mojibake.
        special |= frozenset(i for i in range(vocab_size) if not _printable(tokenizer.decode([i])))
    else:
        vocab_size = int(config.get("vocab_size") or 32000)
    context = config.get("max_position_embeddings") or tokenizer_config.get("model_max_length")
    if not isinstance(context, int) or context <= 0 or context > 1 << 24:
        context = _DEFAULT_CONTEXT_LENGTH
    hidden_size = config.get("hidden_size")
    if not isinstance(hidden_size, int) or not 0 < hidden_size <= 1 << 16:
        hidden_size = DEFAULT_EMBEDDING_DIM
    return ModelFiles(
        path=path,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        eos_token_ids=eos,
        special_token_ids=special,
        context_length=context,
        model_type=str(config.get("model_type") or "unknown"),
        architectures=tuple(config.get("architectures") or ()),
        hidden_size=hidden_size,
    )


async def run_mock_engine(
    config: MockEngineConfig,
    *,
    task_status: trio.TaskStatus[RunningMockEngine] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve one mock engine until cancelled; reports a `RunningMockEngine` when it accepts calls.

    Its gRPC server opens a trio-asyncio loop of its own when the caller has none.
    """
    config.validate()
    model_path = config.model_directory()
    model = load_model_files(model_path)
    # Reported as given, as SGLang reports `--model-path ORG/NAME`; the files are read from `model_path`.
    reported_path = config.model_path or str(model_path)
    kv_config = KvEventsConfig.from_json(config.kv_events_config)
    context_length = config.context_length or model.context_length
    max_total = config.num_blocks * config.page_size
    scheduler_config = SchedulerConfig(
        vocab_size=model.vocab_size,
        page_size=config.page_size,
        num_blocks=config.num_blocks,
        max_running_requests=config.max_running_requests,
        max_prefill_tokens=config.max_prefill_tokens,
        context_length=context_length,
        eos_token_ids=frozenset(model.eos_token_ids),
        special_token_ids=model.special_token_ids,
        speedup=config.speedup,
        kv_events=kv_config.enabled,
    )
    tokenizer = model.tokenizer
    decode_text = None
    if tokenizer is not None:
        decode_text = partial(tokenizer.decode, skip_special_tokens=True)

    async with AsyncExitStack() as stack:
        publishers = None
        if kv_config.enabled:
            publishers = await stack.enter_async_context(open_kv_publishers(kv_config, config.dp_size))
        bootstrap = None
        if config.role == "prefill":
            bootstrap = await stack.enter_async_context(
                open_bootstrap_server(
                    config.host, config.disaggregation_bootstrap_port, unmatched_timeout=config.bootstrap_timeout
                )
            )
        engine = MockEngine(
            scheduler_config,
            dp_size=config.dp_size,
            role=config.role,
            bootstrap_timeout=config.bootstrap_timeout,
            decode_text=decode_text,
            bootstrap_server=bootstrap,
            publishers=publishers,
        )
        info = EngineInfo(
            model_path=reported_path,
            served_model_name=config.served_model_name or MOCK_MODEL_NAME,
            tokenizer_path=reported_path,
            model_directory=str(model_path),
            context_length=context_length,
            max_total_num_tokens=max_total,
            max_req_input_len=min(context_length, max_total) - 1,
            vocab_size=model.vocab_size,
            eos_token_ids=list(model.eos_token_ids),
            model_type=model.model_type,
            architectures=list(model.architectures),
            incremental_streaming_output=config.incremental_streaming_output,
            expose_accounting=config.expose_accounting,
            is_embedding=config.is_embedding,
            multimodal=config.multimodal,
            embedding_dim=model.hidden_size,
            random_seed=config.seed,
            tokenizer=tokenizer,
            scripts=ScriptedOutputs.from_file(config.scripted_outputs, tokenizer) if config.scripted_outputs else None,
        )
        kv_events = None
        if publishers is not None:
            described = describe(config.host, publishers.config, config.dp_size, config.page_size)
            kv_events = described["kv_events"]
            info.kv_events = kv_events
            info.kv_event_sources = described.get("kv_event_sources", [])
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            port = await nursery.start(serve_grpc, _methods(config.api, engine, info), config.host, config.port)
            bootstrap_port = bootstrap.port if bootstrap is not None else None
            raw_kv_config = _bound_kv_config(config.kv_events_config, kv_config, publishers)
            info.server_args = _server_args(config, info, port, bootstrap_port, raw_kv_config)
            info.scheduler_info = {
                "status": "ready",
                "max_total_num_tokens": max_total,
                "max_req_input_len": info.max_req_input_len,
                "startup_time": info.start_time,
            }
            running = RunningMockEngine(config.host, port, bootstrap_port, kv_events, engine, info, bootstrap)
            log.info(
                "mock engine ready on %s:%d (api=%s, role=%s, dp_size=%d, bootstrap_port=%s)",
                config.host,
                port,
                config.api,
                config.role,
                config.dp_size,
                bootstrap_port,
            )
            task_status.started(running)


def _methods(api: Api, engine: MockEngine, info: EngineInfo) -> list[RpcMethod]:
    methods: list[RpcMethod] = []
    if api == "vllm":
        return VllmService(engine, info).methods()
    if api in ("native", "both"):
        methods += NativeService(engine, info).methods()
    if api in ("smg", "both"):
        methods += SmgService(engine, info).methods()
        services = ("", SMG_SERVICE, NATIVE_SERVICE) if api == "both" else ("", SMG_SERVICE)
        methods += health_methods(services)
    return methods


def _server_args(
    config: MockEngineConfig, info: EngineInfo, port: int, bootstrap_port: int | None, kv_events_config: str | None
) -> dict[str, Any]:
    """A flat, resolved ``ServerArgs``-like dict with the keys routers read (§7.1)."""
    return {
        "model_path": info.model_path,
        "tokenizer_path": info.tokenizer_path,
        "served_model_name": info.served_model_name,
        "host": config.host,
        "port": port,
        "grpc_port": port,
        "smg_grpc_mode": config.api in ("smg", "both"),
        "launch_command": config.launch_command,
        "page_size": config.page_size,
        "dp_size": config.dp_size,
        "tp_size": 1,
        "pp_size": 1,
        "enable_dp_attention": False,
        "load_balance_method": "round_robin",
        "context_length": config.context_length,
        "max_running_requests": config.max_running_requests,
        "max_prefill_tokens": config.max_prefill_tokens,
        "max_total_tokens": None,
        "chunked_prefill_size": None,
        "schedule_policy": "fcfs",
        "stream_interval": 1,
        "random_seed": config.seed,
        "skip_tokenizer_init": False,
        "is_embedding": config.is_embedding,
        "load_format": "auto",
        "disaggregation_mode": "null" if config.role == "aggregated" else config.role,
        "disaggregation_bootstrap_port": (
            bootstrap_port if bootstrap_port is not None else config.disaggregation_bootstrap_port
        ),
        "disaggregation_transfer_backend": "mooncake",
        "tool_call_parser": config.tool_call_parser,
        "reasoning_parser": config.reasoning_parser,
        "incremental_streaming_output": config.incremental_streaming_output,
        "kv_events_config": kv_events_config,
        "enable_metrics": False,
        "log_level": config.log_level,
        "mock_engine": True,
        "mock_speedup": "inf" if math.isinf(config.speedup) else config.speedup,
        "mock_bootstrap_timeout": config.bootstrap_timeout,
    }


def _bound_kv_config(raw: str | None, config: KvEventsConfig, publishers: KvEventPublishers | None) -> str | None:
    """The raw ``--kv-events-config``, with ephemeral (port 0) endpoints replaced by bound ones."""
    if not raw or publishers is None:
        return raw or None
    bound = publishers.config
    if (bound.endpoint, bound.replay_endpoint) == (config.endpoint, config.replay_endpoint):
        return raw
    parsed = json.loads(raw)
    parsed["endpoint"] = bound.endpoint
    if bound.replay_endpoint:
        parsed["replay_endpoint"] = bound.replay_endpoint
    return json.dumps(parsed)


def _printable(text: str) -> bool:
    return bool(text) and "\ufffd" not in text and (text.isprintable() or text.strip(" \n") == "")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, bool):
        return ()
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return ()
