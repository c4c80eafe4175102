"""Where the engines come from: the command line, discovery sources (DNS, SRV, a file), or built-in mocks.

`engine_sources` turns the settings into discovery sources; `has_engine_sources` says whether any
engine is named at all, and when none is, `start_mock_engines` starts CPU mock engines to try the
frontend without a GPU (both `run_frontend` and the `--workers` supervisor do).
"""

from __future__ import annotations

import logging

import trio

from trio_direct.config import ServeConfig
from trio_direct.fleet.fleet import FleetError
from trio_direct.fleet.sources import (
    DnsResolver,
    DnsSource,
    EngineSource,
    FileSource,
    SrvSource,
    parse_dns_target,
    parse_nameserver,
)
from trio_direct.mock import MOCK_MODEL_NAME  # the built-in mocks' model name (light: no mock engine loaded)

log = logging.getLogger(__name__)


async def start_mock_engines(count: int, speedup: float, nursery: trio.Nursery) -> list[str]:
    """Built-in CPU mock engines on ephemeral loopback ports, for trying trio-direct without a GPU."""
    from trio_direct.mock.server import MockEngineConfig, run_mock_engine

    urls = []
    for index in range(count):
        config = MockEngineConfig(
            speedup=speedup, incremental_streaming_output=True, seed=index, served_model_name=MOCK_MODEL_NAME
        )
        running = await nursery.start(run_mock_engine, config)
        urls.append(f"grpc://{running.host}:{running.port}")
    log.info("no --engine-url given: serving %d built-in mock engines at %s", count, ", ".join(urls))
    return urls


def engine_sources(config: ServeConfig) -> list[EngineSource]:
    """The discovery sources the settings name (`FleetError` for a malformed one)."""
    try:
        nameserver = parse_nameserver(config.discovery_nameserver) if config.discovery_nameserver else None
        resolver = DnsResolver(nameserver, timeout=max(1.0, min(5.0, config.discovery_interval)))
        sources: list[EngineSource] = [DnsSource(*parse_dns_target(name), resolver) for name in config.engine_dns]
    except ValueError as error:
        raise FleetError(str(error)) from None
    sources += [SrvSource(name, resolver) for name in config.engine_dns_srv]
    if config.engine_file:
        sources.append(FileSource(config.engine_file))
    return sources


def has_engine_sources(config: ServeConfig) -> bool:
    """Whether any engine is named (else `serve` runs built-in mock engines)."""
    return bool(
        config.engine_url
        or config.prefill_engine_url
        or config.engine_dns
        or config.engine_dns_srv
        or config.engine_file
    )
