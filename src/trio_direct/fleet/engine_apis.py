"""The engine APIs trio-direct speaks, one registry entry each: the only place their names are spelled.

An entry (`EngineApi`) brings everything that differs between APIs above the gRPC adapters: the client
that probes an engine, how its two info payloads become an `EngineCard`, the client that then serves
from it (configured from the card), how a prefill hands its KV cache to its decode engine, how wide a
bootstrap room may be, and how KV events arrive (`kv_feed`). Code elsewhere asks the entry
(`engine_api(card.api)`) rather than comparing names, so adding an API is one `register` call and no
edit elsewhere (CONTRIBUTING.md, "Add an engine API").

Registration order is the order ``--engine-api auto`` tries the APIs in: SGLang's native API first, then
its SMG API, then vLLM's. An unknown name fails with the list of known ones (`UnknownEngineApi`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.smg import SmgEngineClient
from trio_direct.engine.types import EngineClient
from trio_direct.engine.vllm import VllmEngineClient, sampling_defaults
from trio_direct.fleet.card import EngineCard, native_card, smg_card, vllm_card

__all__ = [
    "AUTO",
    "EngineApi",
    "UnknownEngineApi",
    "engine_api",
    "engine_api_choices",
    "engine_api_names",
    "engine_card",
    "register",
]

#: ``--engine-api auto``: try every registered API in turn.
AUTO = "auto"

CardReader = Callable[[str, str, int, Mapping[str, Any], Mapping[str, Any]], EngineCard]


class UnknownEngineApi(ValueError):
    """A name no engine API is registered under; the message lists the known ones."""


@dataclass(frozen=True, slots=True)
class EngineApi:
    """One engine API, as the fleet, KV sync and the request core need it."""

    name: str
    #: A client to probe an engine with (`model_info`, `server_info`), given the engine's channel.
    probe_client: Callable[[Any], Any]
    #: The engine's card from its GetModelInfo/GetServerInfo payloads (url, host, port, model, server).
    read_card: CardReader
    #: The client that serves from a probed engine: (channel, card, model info, the probing client).
    serving_client: Callable[[Any, EngineCard, Mapping[str, Any], Any], EngineClient]
    #: How a prefill's KV reaches its decode engine: SGLang's bootstrap rendezvous (both legs carry a
    #: bootstrap triple), or the engine's KV connector (the prefill leg asks for a remote decode).
    handoff: Literal["bootstrap", "connector"]
    #: How KV events arrive: a ZMQ publisher per DP rank, or the API's own gRPC stream.
    kv_feed: Literal["zmq", "grpc"]
    #: Bits a bootstrap room may use on this API (the narrowest of both legs wins).
    room_bits: int = 63


_REGISTRY: dict[str, EngineApi] = {}


def register(api: EngineApi) -> EngineApi:
    """Add an engine API; ``auto`` tries it after those registered before it."""
    if api.name == AUTO or api.name in _REGISTRY:
        raise ValueError(f"engine API {api.name!r} is already taken")
    _REGISTRY[api.name] = api
    return api


def engine_api(name: str) -> EngineApi:
    """The registered API called `name`; raises `UnknownEngineApi` listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownEngineApi(f"unknown engine API {name!r} (known: {', '.join(engine_api_choices())})") from None


def engine_api_names() -> tuple[str, ...]:
    """The registered APIs, in the order ``auto`` probes them."""
    return tuple(_REGISTRY)


def engine_api_choices() -> tuple[str, ...]:
    """Every ``--engine-api`` value: ``auto`` and each registered API."""
    return (AUTO, *_REGISTRY)


def engine_card(
    url: str, host: str, port: int, api: str, model_info: Mapping[str, Any], server_info: Mapping[str, Any]
) -> EngineCard:
    """The card of the engine dialled at ``host:port`` that speaks `api`, from its two info payloads."""
    return engine_api(api).read_card(url, host, port, model_info, server_info)


register(
    EngineApi(
        name=NativeEngineClient.api,
        probe_client=NativeEngineClient,
        read_card=native_card,
        serving_client=lambda channel, card, _info, _probe: NativeEngineClient(
            channel, incremental=card.incremental_streaming
        ),
        handoff="bootstrap",
        kv_feed="zmq",
        room_bits=63,
    )
)
register(
    EngineApi(
        name=SmgEngineClient.api,
        probe_client=SmgEngineClient,
        read_card=smg_card,
        serving_client=lambda _channel, _card, _info, probe: probe,
        handoff="bootstrap",
        kv_feed="zmq",
        # The SMG servicer carries the room in an int32-sized field.
        room_bits=31,
    )
)
register(
    EngineApi(
        name=VllmEngineClient.api,
        probe_client=VllmEngineClient,
        read_card=vllm_card,
        serving_client=lambda channel, _card, info, _probe: VllmEngineClient(
            channel, defaults=sampling_defaults(info.get("default_sampling_params_json", ""))
        ),
        handoff="connector",
        kv_feed="grpc",
    )
)
