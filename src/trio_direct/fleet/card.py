"""What trio-direct knows about one engine, read from the engine itself (sans-IO).

Block size, role, DP layout, bootstrap port, KV-event endpoints, streaming mode, context length and
parsers all come from the engine's `GetModelInfo`/`GetServerInfo` JSON rather than from flags, so they
cannot silently disagree with the engine (a flag that disagrees with the engine is a bug users
report in peer routers). One reader per engine API (`native_card`, `smg_card`, `vllm_card`, each
registered with its API in `trio_direct.fleet.engine_apis`) turns those two payloads, as the adapters in `trio_direct.engine` decode them, into an `EngineCard`; it does no I/O.

Where the two APIs differ (sglang 0.5.23's native `GetServerInfo` against smg-grpc-servicer's): the
native API describes its KV publisher in a ready-made ``kv_events`` descriptor, the SMG API only
repeats the raw ``--kv-events-config`` JSON; the SMG `GetModelInfo.max_context_length` is the KV pool
size (a servicer quirk) and is never used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "WILDCARD_HOSTS",
    "CardError",
    "EngineCard",
    "KvEventSource",
    "Role",
    "native_card",
    "smg_card",
    "vllm_card",
]

Role = Literal["aggregated", "prefill", "decode"]

#: SGLang's default ``--disaggregation-bootstrap-port``.
DEFAULT_BOOTSTRAP_PORT = 8998

#: Bind-all hosts an engine may report; they name no address anyone can dial.
WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "::", "[::]", ""})

_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
_ROLES: dict[str, Role] = {"null": "aggregated", "prefill": "prefill", "decode": "decode"}
#: SGLang's ``KVEventsConfig.endpoint`` default.
_DEFAULT_KV_ENDPOINT = "tcp://*:5557"


class CardError(ValueError):
    """The engine's info JSON says something trio-direct cannot work with."""


@dataclass(frozen=True, slots=True)
class KvEventSource:
    """One DP rank's KV-event publisher, as a remote subscriber dials it."""

    dp_rank: int
    endpoint: str
    topic: str = ""
    replay_endpoint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "dp_rank": self.dp_rank,
            "endpoint": self.endpoint,
            "topic": self.topic,
            "replay_endpoint": self.replay_endpoint,
        }


@dataclass(frozen=True, slots=True)
class EngineCard:
    """One engine as probed: identity, role, layout and the addresses derived from it.

    ``context_length`` is the longest prompt the engine accepts, taken in this order: the
    scheduler's ``max_req_input_len`` (the limit the engine really checks prompts against: model
    context and KV pool together), then the SMG `GetModelInfo.max_req_input_len`, then the
    ``context_length`` server arg (a user override, usually null). ``block_size`` is the engine's
    ``page_size``; ``kv_block_size`` the block size of its KV events (``page_size × dcp_size``).
    ``bootstrap_host``/``bootstrap_port`` are set on prefill engines only.

    ``is_embedding``: the engine serves an embedding model (``is_generation`` false), which answers
    `Embed` and no `Generate`. ``supports_images``: it takes image input (``image_data``): a native
    0.5.23+ engine whose ``grpc_features.image_inputs`` lists any format. SMG engines never count:
    their servicers read images only as pixel values a gateway's image processor made.
    """

    url: str
    host: str
    port: int
    #: The engine API it speaks (a name of `trio_direct.fleet.engine_apis`).
    api: str
    role: Role
    model_path: str
    served_model_name: str
    tokenizer_path: str
    block_size: int | None
    context_length: int | None
    dp_size: int
    bootstrap_host: str | None
    bootstrap_port: int | None
    kv_events: tuple[KvEventSource, ...]
    kv_block_size: int | None
    incremental_streaming: bool
    tool_call_parser: str | None
    reasoning_parser: str | None
    is_embedding: bool = False
    supports_images: bool = False
    #: vLLM API: the KV connector moving a prefill's cache to its decode engine (GetServerInfo's
    #: ``kv_connector``), and the facts a prefill and a decode must agree on to pair (``pairing``:
    #: name/value pairs of kv_cache_dtype, block_size, model_dtype, attention_backend and
    #: pairing_protocol, the ones the engine reported).
    kv_connector: str | None = None
    pairing: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "host": self.host,
            "port": self.port,
            "api": self.api,
            "role": self.role,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.tokenizer_path,
            "block_size": self.block_size,
            "context_length": self.context_length,
            "dp_size": self.dp_size,
            "bootstrap_host": self.bootstrap_host,
            "bootstrap_port": self.bootstrap_port,
            "kv_events": [source.to_json() for source in self.kv_events],
            "kv_block_size": self.kv_block_size,
            "incremental_streaming": self.incremental_streaming,
            "tool_call_parser": self.tool_call_parser,
            "reasoning_parser": self.reasoning_parser,
            "is_embedding": self.is_embedding,
            "supports_images": self.supports_images,
            "kv_connector": self.kv_connector,
            "pairing": dict(self.pairing),
        }


def native_card(
    url: str, host: str, port: int, model_info: Mapping[str, Any], server_info: Mapping[str, Any]
) -> EngineCard:
    """The card of an engine on SGLang's native API: its KV publisher in a ready-made ``kv_events``
    descriptor, cumulative ids unless it runs with ``--incremental-streaming-output``, image input
    where 0.5.23+'s ``grpc_features`` lists formats."""
    descriptor = server_info.get("kv_events")
    dp_size = _int(server_info.get("dp_size")) or 1
    return _sglang_card(
        url, host, port, "native", model_info, server_info,
        kv_events=_native_kv_sources(descriptor, host, dp_size),
        kv_block_size=_int(descriptor.get("block_size")) if isinstance(descriptor, Mapping) else None,
        incremental=bool(server_info.get("incremental_streaming_output")),
        supports_images=_lists_image_inputs(server_info.get("grpc_features")),
    )  # fmt: skip


def smg_card(
    url: str, host: str, port: int, model_info: Mapping[str, Any], server_info: Mapping[str, Any]
) -> EngineCard:
    """The card of an engine on SGLang's SMG API: only the raw ``--kv-events-config`` JSON names its
    KV publisher; chunks always carry deltas, whatever the server arg says; no image input."""
    dp_size = _int(server_info.get("dp_size")) or 1
    return _sglang_card(
        url, host, port, "smg", model_info, server_info,
        kv_events=_smg_kv_sources(server_info.get("kv_events_config"), host, dp_size, url),
        kv_block_size=None,
        incremental=True,
        supports_images=False,
    )  # fmt: skip


def _model_path(url: str, model_info: Mapping[str, Any], server_info: Mapping[str, Any]) -> str:
    model_path = _text(_first(model_info, server_info, "model_path"))
    if model_path is None:
        raise CardError(f"engine {url} reports no model_path")
    return model_path


def _first(model_info: Mapping[str, Any], server_info: Mapping[str, Any], key: str) -> Any:
    value = model_info.get(key)
    return server_info.get(key) if _text(value) is None else value


def _sglang_card(
    url: str,
    host: str,
    port: int,
    api: str,
    model_info: Mapping[str, Any],
    server_info: Mapping[str, Any],
    *,
    kv_events: tuple[KvEventSource, ...],
    kv_block_size: int | None,
    incremental: bool,
    supports_images: bool,
) -> EngineCard:
    """What SGLang's two APIs report alike (``model_info``/``server_info`` as the adapters in
    `trio_direct.engine` decode them; for SMG: server args and scheduler info flattened into one
    dict). Raises `CardError` when the payloads name no model or an unknown role."""
    model_path = _model_path(url, model_info, server_info)
    mode = _text(server_info.get("disaggregation_mode")) or _text(model_info.get("disaggregation_mode")) or "null"
    role = _ROLES.get(mode)
    if role is None:
        raise CardError(f"engine {url} reports an unknown disaggregation_mode {mode!r}")
    dp_size = _int(server_info.get("dp_size")) or 1
    page_size = _int(server_info.get("page_size"))
    dcp_size = _int(server_info.get("dcp_size")) or 1
    if kv_block_size is None and page_size is not None:
        kv_block_size = page_size * dcp_size
    bootstrap_host = bootstrap_port = None
    if role == "prefill":
        bootstrap_host = _advertised_host(server_info.get("host"), host)
        bootstrap_port = _int(server_info.get("disaggregation_bootstrap_port")) or DEFAULT_BOOTSTRAP_PORT
    return EngineCard(
        url=url,
        host=host,
        port=port,
        api=api,
        role=role,
        model_path=model_path,
        served_model_name=_text(_first(model_info, server_info, "served_model_name")) or model_path,
        tokenizer_path=_text(_first(model_info, server_info, "tokenizer_path")) or model_path,
        block_size=page_size,
        context_length=_context_length(model_info, server_info),
        dp_size=dp_size,
        bootstrap_host=bootstrap_host,
        bootstrap_port=bootstrap_port,
        kv_events=kv_events,
        kv_block_size=kv_block_size,
        incremental_streaming=incremental,
        tool_call_parser=_text(_first(model_info, server_info, "tool_call_parser")),
        reasoning_parser=_text(_first(model_info, server_info, "reasoning_parser")),
        is_embedding=_is_embedding(model_info, server_info),
        supports_images=supports_images,
    )


#: GetServerInfo's ``kv_role`` -> role; "" (no connector) and kv_both serve whole requests.
_VLLM_ROLES: dict[str, Role] = {
    "": "aggregated",
    "kv_both": "aggregated",
    "kv_producer": "prefill",
    "kv_consumer": "decode",
}
#: GetServerInfo's PD pairing fields, in the order the card lists them.
_VLLM_PAIRING = ("kv_cache_dtype", "block_size", "model_dtype", "attention_backend", "pairing_protocol")


def vllm_card(
    url: str, host: str, port: int, model_info: Mapping[str, Any], server_info: Mapping[str, Any]
) -> EngineCard:
    """vLLM's GetModelInfo/GetServerInfo (smg-grpc-servicer): typed fields, no server-args JSON.

    The role comes from the KV connector's role; KV events come over the API's own
    `SubscribeKvEvents` stream (one per engine, every DP rank's batches on it), so every rank's
    source is the engine's gRPC address. ``max_req_input_len`` is vLLM's ``max_model_len``.
    """
    model_path = _model_path(url, model_info, server_info)
    kv_role = _text(server_info.get("kv_role")) or ""
    role = _VLLM_ROLES.get(kv_role)
    if role is None:
        raise CardError(f"engine {url} reports an unknown kv_role {kv_role!r}")
    dp_size = _int(server_info.get("data_parallel_size")) or 1
    block_size = _int(server_info.get("block_size")) or None
    address = f"grpc://[{host}]:{port}" if ":" in host else f"grpc://{host}:{port}"
    pairing = tuple(
        (name, str(value))
        for name in _VLLM_PAIRING
        if (value := _text(server_info.get(name))) is not None and value != "0"
    )
    return EngineCard(
        url=url,
        host=host,
        port=port,
        api="vllm",
        role=role,
        model_path=model_path,
        served_model_name=_text(model_info.get("served_model_name")) or model_path,
        tokenizer_path=_text(model_info.get("tokenizer_path")) or model_path,
        block_size=block_size,
        context_length=_int(model_info.get("max_req_input_len")) or _int(model_info.get("max_context_length")) or None,
        dp_size=dp_size,
        bootstrap_host=None,
        bootstrap_port=None,
        kv_events=tuple(KvEventSource(dp_rank=rank, endpoint=address) for rank in range(dp_size)),
        kv_block_size=block_size,
        incremental_streaming=True,
        tool_call_parser=None,
        reasoning_parser=None,
        is_embedding=_is_embedding(model_info, server_info),
        kv_connector=_text(server_info.get("kv_connector")),
        pairing=pairing,
    )


def _is_embedding(model_info: Mapping[str, Any], server_info: Mapping[str, Any]) -> bool:
    """GetModelInfo's ``is_generation`` (both APIs), else the ``is_embedding`` server arg."""
    generation = model_info.get("is_generation")
    if isinstance(generation, bool):
        return not generation
    return server_info.get("is_embedding") is True


def _lists_image_inputs(features: Any) -> bool:
    """0.5.23's ``grpc_features``: the image formats the model's processor takes (none: text only)."""
    return isinstance(features, Mapping) and bool(features.get("image_inputs"))


def _context_length(model_info: Mapping[str, Any], server_info: Mapping[str, Any]) -> int | None:
    # Order and reasons: see EngineCard. ListModels' max_model_len would sit between the first two
    # but the adapters do not call it; SMG GetModelInfo.max_context_length is the KV pool size.
    for value in (
        server_info.get("max_req_input_len"),
        model_info.get("max_req_input_len"),
        server_info.get("context_length"),
    ):
        length = _int(value)
        if length:
            return length
    return None


def _advertised_host(advertised: Any, dialled: str) -> str:
    """The engine's own host when it names a reachable one, else the host trio-direct dialled.

    A wildcard names nothing; a loopback address is only right if trio-direct dialled the engine on
    the same machine, and then the dialled host works too.
    """
    host = _text(advertised)
    if host is None or host in WILDCARD_HOSTS or host in _LOOPBACK_HOSTS:
        return dialled
    return host.removeprefix("[").removesuffix("]")


def _native_kv_sources(descriptor: Any, host: str, dp_size: int) -> tuple[KvEventSource, ...]:
    """Per-rank sources from the native ``kv_events`` descriptor (one endpoint per DP rank)."""
    if not isinstance(descriptor, Mapping) or (_text(descriptor.get("publisher")) or "zmq") != "zmq":
        return ()
    base = _int(descriptor.get("endpoint_port_base"))
    if base is None:
        return ()
    dial = _dial_host(_text(descriptor.get("endpoint_host")) or "*", host)
    replay_base = _int(descriptor.get("replay_endpoint_port_base"))
    ranks = _int(descriptor.get("dp_size")) or dp_size
    topic = descriptor.get("topic") or ""
    return tuple(
        KvEventSource(
            dp_rank=rank,
            endpoint=_tcp(dial, base + rank),
            topic=topic,
            replay_endpoint=_tcp(dial, replay_base + rank) if replay_base is not None else None,
        )
        for rank in range(ranks)
    )


def _smg_kv_sources(raw: Any, host: str, dp_size: int, url: str) -> tuple[KvEventSource, ...]:
    """Per-rank sources from the raw ``--kv-events-config`` the SMG API repeats (its ``endpoint``, one port per DP rank).

    Only TCP publishers can be dialled from another host; ``ipc://`` ones give no sources.
    """
    if isinstance(raw, str):
        if _text(raw) is None:
            return ()
        try:
            raw = json.loads(raw)
        except ValueError:
            raise CardError(f"engine {url} reports a kv_events_config that is not JSON: {raw!r}") from None
    if not isinstance(raw, Mapping) or raw.get("publisher") != "zmq":
        return ()
    endpoint = _split_tcp(raw.get("endpoint") or _DEFAULT_KV_ENDPOINT)
    if endpoint is None:
        return ()
    replay = _split_tcp(raw["replay_endpoint"]) if raw.get("replay_endpoint") else None
    dial = _dial_host(endpoint[0], host)
    replay_dial = _dial_host(replay[0], host) if replay else ""
    topic = raw.get("topic") or ""
    return tuple(
        KvEventSource(
            dp_rank=rank,
            endpoint=_tcp(dial, endpoint[1] + rank),
            topic=topic,
            replay_endpoint=_tcp(replay_dial, replay[1] + rank) if replay else None,
        )
        for rank in range(dp_size)
    )


def _split_tcp(endpoint: Any) -> tuple[str, int] | None:
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not port.isascii() or not port.isdigit():
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)


def _dial_host(host: str, engine_host: str) -> str:
    return engine_host if host in WILDCARD_HOSTS else host


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _text(value: Any) -> str | None:
    """A string setting, or None for SGLang's spellings of "unset"."""
    if value is None:
        return None
    text = str(value)
    return None if text in ("", "null", "None") else text


def _int(value: Any) -> int | None:
    """An integral setting; SMG Structs carry numbers as doubles, some JSON writers as strings."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
