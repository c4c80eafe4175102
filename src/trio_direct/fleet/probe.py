"""Asking one engine what it is, before serving from it.

`probe_engine` dials the engine, works out which gRPC API it speaks (``auto``: SGLang's native API
first; a server that does not speak it answers the native call with UNIMPLEMENTED, or, if it is a
grpclib server, with UNKNOWN "Missing content-type header", so any engine error that is not
"unreachable" moves on to SGLang's SMG API, and likewise from there to vLLM's: each API is recognised
by its service answering `GetModelInfo`), reads
its `GetModelInfo` and `GetServerInfo` and returns the card with a client already configured for the
engine's streaming mode. It does not retry: an engine that is down raises `EngineUnavailable` and the
caller (`Fleet.connect`) decides how long to wait.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable
from trio_direct.engine.transport import ChannelPool, open_transport
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.card import CardError, EngineCard
from trio_direct.fleet.engine_apis import AUTO, engine_api, engine_api_choices, engine_api_names
from trio_direct.fleet.engine_url import parse_engine_url
from trio_direct.options import option

__all__ = ["ProbeOptions", "ProbedEngine", "probe_command", "probe_engine"]


@dataclass(frozen=True, slots=True)
class ProbedEngine:
    """An engine's card and the client to reach it with."""

    card: EngineCard
    client: EngineClient


async def probe_engine(url: str, pool: ChannelPool, *, api: str = AUTO, timeout: float = 10.0) -> ProbedEngine:
    """Probe the engine at ``url`` (see `parse_engine_url` for the accepted forms).

    Raises `ValueError` for a malformed URL or an unknown API (`UnknownEngineApi`),
    `EngineUnavailable` when the engine cannot be reached, `EngineDeadlineExceeded` when the probe as
    a whole takes longer than ``timeout`` seconds, `EngineUnimplemented` when the engine speaks none
    of the APIs asked for, `CardError` when its info makes no sense, and other `EngineError`s as the
    engine reports them.
    """
    apis = [engine_api(name) for name in engine_api_names()] if api == AUTO else [engine_api(api)]
    host, port = parse_engine_url(url)
    channel = pool.get(host, port)
    first_error: EngineError | None = None
    with trio.move_on_after(timeout) as scope:
        for candidate in apis:
            probe = candidate.probe_client(channel)
            try:
                model_info = await probe.model_info(timeout=timeout)
            except (EngineUnavailable, EngineDeadlineExceeded):
                raise
            except EngineError as error:
                # The first API's answer says more (it may be an engine error, not a mismatch).
                first_error = first_error or error
                continue
            server_info = await probe.server_info(timeout=timeout)
            card = candidate.read_card(url, host, port, model_info, server_info)
            return ProbedEngine(card, candidate.serving_client(channel, card, model_info, probe))
        assert first_error is not None
        raise first_error
    assert scope.cancelled_caught
    raise EngineDeadlineExceeded(f"probe took longer than {timeout:g}s", engine=channel.name)


@dataclass(slots=True)
class ProbeOptions:
    """What `trio-direct probe` takes (no environment variables: each probe names its engines)."""

    urls: list[str] = option(
        factory=list, positional=True, metavar="URL", help="engine gRPC address (grpc://h:p, http://h:p or h:p)"
    )
    engine_api: str = option(AUTO, choices=engine_api_choices, help="default %(default)s")
    timeout: float = option(10.0, help="seconds per engine (default %(default)s)")


async def probe_command(urls: Sequence[str], api: str = AUTO, timeout: float = 10.0) -> int:
    """``trio-direct probe URL...``: print one JSON array of engine cards; 0 when every probe worked.

    Probes run concurrently. The array holds the card of each engine that answered, in the order of
    ``urls`` (each card names its ``url``), and is an array for one URL too, so output is always
    parsed the same way; failures go to stderr. Opens its own trio-asyncio loop, so call it
    straight from `trio.run`.
    """
    results: list[EngineCard | str] = ["" for _ in urls]

    async def probe_one(index: int, url: str) -> None:
        try:
            results[index] = (await probe_engine(url, pool, api=api, timeout=timeout)).card
        except (EngineError, CardError, ValueError) as error:
            results[index] = f"{url}: {error}"

    async with open_transport():
        pool = ChannelPool(connect_timeout=min(timeout, 5.0))
        try:
            async with trio.open_nursery() as nursery:
                for index, url in enumerate(urls):
                    nursery.start_soon(probe_one, index, url)
        finally:
            pool.close()
    failures = [result for result in results if not isinstance(result, EngineCard)]
    for failure in failures:
        print(f"probe failed: {failure}", file=sys.stderr, flush=True)
    cards = [result.to_json() for result in results if isinstance(result, EngineCard)]
    print(json.dumps(cards, indent=2), flush=True)
    return 1 if failures else 0
