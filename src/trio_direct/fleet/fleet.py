"""The engines of one served model, probed and checked against each other.

`Fleet.connect` (and `probe_fleet`, which start-up uses to group engines by model first) probes every engine concurrently and waits for late ones (engines are often
started together with the frontend), then refuses a fleet whose engines do not serve the same model
or use different block sizes: routing across such engines would return answers from the wrong model
or mis-key the KV index, silently. Each refusal is one `FleetError` naming the engine and the field.

It does not wait for the slowest engine, though: one dead engine of ten must not keep the other nine
from serving. Engines still down when start-up ends are kept as `PendingEngine`s (their ``e{index}``
ids reserved, so ids stay positions in the URL list), probed until they are up; `Fleet.join` and
`Fleet.add` admit an engine that is up and agrees with the fleet, `Fleet.withdraw` takes one out of
routing at once when it leaves (it drains, then `Fleet.forget`).

The agreement rules are plain code (`fleet_model`), testable without engines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from trio_direct.engine.errors import EngineDeadlineExceeded, EngineError, EngineUnavailable, EngineUnimplemented
from trio_direct.engine.transport import ChannelPool
from trio_direct.engine.types import EngineClient
from trio_direct.fleet.card import CardError, EngineCard
from trio_direct.fleet.engine_apis import AUTO, UnknownEngineApi, engine_api
from trio_direct.fleet.engine_url import parse_engine_url
from trio_direct.fleet.probe import ProbedEngine, probe_engine

__all__ = [
    "Engine",
    "Fleet",
    "FleetError",
    "FleetModel",
    "FleetOverrides",
    "PendingEngine",
    "Worker",
    "fleet_model",
]

log = logging.getLogger(__name__)

#: Retry delays while waiting for an engine to come up: 0.2 s doubling to 5 s.
FIRST_RETRY_DELAY = 0.2
MAX_RETRY_DELAY = 5.0
#: Upper bound on one probe attempt, whatever is left of the wait.
PROBE_TIMEOUT = 10.0


class FleetError(Exception):
    """The fleet cannot be served from (no engine came up, or the engines disagree), or an engine
    cannot join it."""


@dataclass(frozen=True, slots=True)
class FleetOverrides:
    """Settings the user gives instead of the probed ones.

    An overridden field is not checked for agreement between engines; a probed value that differs
    from the override is logged as a warning.
    """

    model_path: str | None = None
    served_model_name: str | None = None
    kv_cache_block_size: int | None = None


@dataclass(frozen=True, slots=True)
class FleetModel:
    """The one model the fleet serves, as the frontend presents and tokenizes it.

    ``context_length`` is the smallest any engine accepts, so a prompt that fits fits everywhere;
    ``supports_images`` holds only if every engine takes image input. ``is_embedding`` must agree:
    an embedding model serves `Embed` and no `Generate`, so its engines form a pool of their own.
    """

    served_model_name: str
    model_path: str
    tokenizer_path: str
    block_size: int | None
    context_length: int | None
    tool_call_parser: str | None
    reasoning_parser: str | None
    is_embedding: bool = False
    supports_images: bool = False


@dataclass(slots=True, eq=False)
class Engine:
    """One probed engine. ``healthy`` is flipped by health checking; routing skips unhealthy ones."""

    id: str
    card: EngineCard
    client: EngineClient
    healthy: bool = True

    def __repr__(self) -> str:
        return f"Engine({self.id}, {self.card.url}, {self.card.role}, healthy={self.healthy})"


@dataclass(slots=True, eq=False)
class PendingEngine:
    """An engine that was not up when start-up ended: never routed to, probed until it joins.

    ``reason`` is why its last probe failed (for logs and `GET /debug/routing`).
    """

    id: str
    url: str
    reason: str = ""

    def __repr__(self) -> str:
        return f"PendingEngine({self.id}, {self.url})"


@dataclass(frozen=True, slots=True)
class Worker:
    """What a router picks: an engine, and the DP rank to pin (None on single-rank engines)."""

    engine: Engine
    dp_rank: int | None = None


class Fleet:
    """The probed engines of one model, in the order of their ids (``e0``, ``e1``, ...: positions in
    the URL list, then order of discovery), the ones still `pending` (not up yet; they keep their
    ids), and the ones `draining` (left, finishing their requests: never routed to)."""

    def __init__(
        self,
        engines: Sequence[Engine],
        model: FleetModel,
        pending: Sequence[PendingEngine] = (),
        overrides: FleetOverrides | None = None,
    ) -> None:
        self.engines = list(engines)
        self.model = model
        self.pending = list(pending)
        self.draining: list[Engine] = []
        self.overrides = overrides or FleetOverrides()

    @classmethod
    async def connect(
        cls,
        urls: Sequence[str],
        pool: ChannelPool,
        *,
        api: str = AUTO,
        wait_timeout: float = 60.0,
        join_grace: float = 5.0,
        overrides: FleetOverrides | None = None,
    ) -> Fleet:
        """Probe every engine, retrying those not up yet, and return once there is a fleet to serve.

        That is: as soon as every engine is up; or ``join_grace`` seconds after the first one came
        up; or after ``wait_timeout`` seconds. Engines not up by then are `pending`.

        Raises `FleetError` (one message, naming the engine) for a malformed or repeated URL, an
        engine that answers but cannot be used, no engine up within ``wait_timeout``, and engines
        that disagree.
        """
        overrides = overrides or FleetOverrides()
        probed, pending = await probe_fleet(urls, pool, api=api, wait_timeout=wait_timeout, join_grace=join_grace)
        engines = [Engine(engine_id, p.card, p.client) for engine_id, p in probed]
        return cls(engines, fleet_model([(e.id, e.card) for e in engines], overrides), pending, overrides)

    def join(
        self, pending: PendingEngine, probed: ProbedEngine, check: Callable[[Engine], None] | None = None
    ) -> Engine:
        """Admit `pending`, now probed, into the fleet; `FleetError` (and no change) if it cannot join.

        It must agree with the fleet by `fleet_model`'s rules, and pass ``check`` (the frontend's
        own rules: role, KV routing block). The fleet model is recomputed: the smallest context
        length may shrink.
        """
        if pending not in self.pending:
            raise ValueError(f"{pending!r} is not pending in this fleet")
        engine = self.add(Engine(pending.id, probed.card, probed.client), check)
        self.pending.remove(pending)
        return engine

    def admits(self, engine: Engine, check: Callable[[Engine], None] | None = None) -> FleetModel:
        """The fleet model with `engine` in it; `FleetError` if it disagrees with the fleet
        (`fleet_model`'s rules) or fails ``check``. Changes nothing."""
        cards = [(e.id, e.card) for e in self.engines] + [(engine.id, engine.card)]
        model = fleet_model(cards, self.overrides)
        if check is not None:
            check(engine)
        return model

    def add(self, engine: Engine, check: Callable[[Engine], None] | None = None) -> Engine:
        """Make `engine` routable; `FleetError` (and no change) if the fleet does not admit it.

        Engines stay in the order of their ids. The smallest context length may shrink.
        """
        model = self.admits(engine, check)
        if model.context_length != self.model.context_length:
            log.warning(
                "engine %s accepts prompts of up to %s tokens: the fleet's context length is now %s (was %s)",
                engine.id, engine.card.context_length, model.context_length, self.model.context_length,
            )  # fmt: skip
        position = sum(1 for e in self.engines if _url_index(e.id) < _url_index(engine.id))
        self.engines.insert(position, engine)
        self.model = model
        return engine

    def withdraw(self, engine: Engine) -> None:
        """Stop routing to `engine` at once: it leaves the fleet and drains (`draining`) until
        `forget`. The fleet model follows the engines left (a context length may grow back)."""
        self.engines.remove(engine)
        self.draining.append(engine)
        if self.engines:
            self.model = fleet_model([(e.id, e.card) for e in self.engines], self.overrides)

    def forget(self, engine: Engine) -> None:
        """`engine` drained: nothing of it is left here."""
        if engine in self.draining:
            self.draining.remove(engine)

    def workers(self) -> list[Worker]:
        """Healthy engines that generate (aggregated or decode), one worker per DP rank."""
        return _expand(e for e in self.engines if e.healthy and e.card.role != "prefill")

    def prefill_workers(self) -> list[Worker]:
        """Healthy prefill engines, one worker per DP rank."""
        return _expand(e for e in self.engines if e.healthy and e.card.role == "prefill")


async def probe_fleet(
    urls: Sequence[str],
    pool: ChannelPool,
    *,
    api: str = AUTO,
    wait_timeout: float = 60.0,
    join_grace: float = 5.0,
) -> tuple[list[tuple[str, ProbedEngine]], list[PendingEngine]]:
    """Probe the engines at `urls` (ids ``e{position}``) as `Fleet.connect` does: the ones up, and
    the ones still `pending` when the wait ended. Agreement between them is not checked here.

    Raises `FleetError` for a malformed or repeated URL, an engine that answers but cannot be used,
    and no engine up within ``wait_timeout``.
    """
    if api != AUTO:
        try:
            engine_api(api)
        except UnknownEngineApi as error:
            raise FleetError(str(error)) from None
    if not urls:
        raise FleetError("no engine URLs given")
    addresses: dict[tuple[str, int], str] = {}
    for index, url in enumerate(urls):
        try:
            address = parse_engine_url(url)
        except ValueError as error:
            raise FleetError(f"engine e{index}: {error}") from None
        if address in addresses:
            raise FleetError(f"engine e{index} ({url}) is the same engine as {addresses[address]}")
        addresses[address] = f"e{index} ({url})"

    waiting = [PendingEngine(f"e{index}", url) for index, url in enumerate(urls)]
    probed: list[ProbedEngine | None] = [None] * len(urls)
    failure: list[FleetError] = []
    first_up, all_up = trio.Event(), trio.Event()
    deadline = trio.current_time() + wait_timeout

    async def probe_one(index: int, cancel: trio.CancelScope) -> None:
        try:
            probed[index] = await _wait_for_engine(waiting[index], pool, api, deadline)
        except FleetError as error:
            if not failure:
                failure.append(error)
            cancel.cancel()
            return
        first_up.set()
        if all(p is not None for p in probed):
            all_up.set()

    async with trio.open_nursery() as nursery:
        for index in range(len(urls)):
            nursery.start_soon(probe_one, index, nursery.cancel_scope)
        with trio.move_on_at(deadline):
            await first_up.wait()
            with trio.move_on_after(join_grace):
                await all_up.wait()
        nursery.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not first_up.is_set():
        raise FleetError(
            "; ".join(
                f"engine {p.id} ({p.url}) did not come up within {wait_timeout:g}s: {p.reason or 'no answer'}"
                for p in waiting
            )
        )
    up = [(w.id, p) for w, p in zip(waiting, probed, strict=True) if p is not None]
    pending = [w for w, p in zip(waiting, probed, strict=True) if p is None]
    for engine in pending:
        log.warning(
            "engine %s (%s) is not up yet; it joins when it comes up (last probe: %s)",
            engine.id, engine.url, engine.reason or "no answer",
        )  # fmt: skip
    return up, pending


def _expand(engines: Iterable[Engine]) -> list[Worker]:
    workers: list[Worker] = []
    for engine in engines:
        if engine.card.dp_size > 1:
            workers.extend(Worker(engine, rank) for rank in range(engine.card.dp_size))
        else:
            workers.append(Worker(engine, None))
    return workers


def _url_index(engine_id: str) -> int:
    """The number of an ``e{number}`` id (-1 for other ids): ids are handed out in order."""
    digits = engine_id[1:]
    return int(digits) if engine_id.startswith("e") and digits.isdigit() else -1


async def _wait_for_engine(engine: PendingEngine, pool: ChannelPool, api: str, deadline: float) -> ProbedEngine:
    """Probe until it works (the caller cancels at its deadline); retry only "not up yet" failures,
    noting the last one in ``engine.reason``."""
    name = f"engine {engine.id} ({engine.url})"
    delay = FIRST_RETRY_DELAY
    while True:
        remaining = deadline - trio.current_time()
        try:
            return await probe_engine(engine.url, pool, api=api, timeout=max(min(PROBE_TIMEOUT, remaining), 0.5))
        except (EngineUnavailable, EngineDeadlineExceeded) as error:
            reason = error.message or str(error)
        except EngineUnimplemented as error:
            apis = "the native or the SMG gRPC API" if api == "auto" else f"the {api} gRPC API"
            raise FleetError(f"{name} does not serve {apis}: {error}") from None
        except (EngineError, CardError, ValueError) as error:
            raise FleetError(f"{name} cannot be used: {error}") from None
        remaining = deadline - trio.current_time()
        if reason != engine.reason and remaining > 0:
            log.warning("%s is not up yet (%s); retrying for up to %.1fs more", name, reason, remaining)
        engine.reason = reason
        await trio.sleep(max(min(delay, remaining), 0.0))
        delay = min(delay * 2, MAX_RETRY_DELAY)


def fleet_model(cards: Sequence[tuple[str, EngineCard]], overrides: FleetOverrides | None = None) -> FleetModel:
    """The model of a fleet of ``(engine id, card)``; `FleetError` when the engines disagree.

    Checked: served model name, model path and block size (``page_size``), except where overridden;
    for prefill and decode engines, that they pair (`_pairing_agreed`). Parsers that differ are only
    logged: the frontend parses with one of them either way.
    """
    overrides = overrides or FleetOverrides()
    if not cards:
        raise FleetError("no engines")
    served = _agreed(cards, "served_model_name", overrides.served_model_name, "--served-model-name")
    model_path = _agreed(cards, "model_path", overrides.model_path, "--model-path")
    block_size = _agreed(cards, "block_size", overrides.kv_cache_block_size, "--page-size (vLLM: --block-size)")
    is_embedding = _agreed(cards, "is_embedding", None, "--is-embedding (or without it)")
    _pairing_agreed(cards)
    first = cards[0][1]
    tool_parser = _agreed(cards, "tool_call_parser", None, "--tool-call-parser", strict=False)
    reasoning_parser = _agreed(cards, "reasoning_parser", None, "--reasoning-parser", strict=False)
    lengths = [card.context_length for _, card in cards if card.context_length is not None]
    return FleetModel(
        served_model_name=served,
        model_path=model_path,
        tokenizer_path=overrides.model_path or first.tokenizer_path,
        block_size=block_size,
        context_length=min(lengths) if lengths else None,
        tool_call_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        is_embedding=bool(is_embedding),
        supports_images=all(card.supports_images for _, card in cards),
    )


def _pairing_agreed(cards: Sequence[tuple[str, EngineCard]]) -> None:
    """Refuse prefill and decode engines that could not hand a request's KV cache to each other.

    SGLang's bootstrap and vLLM's KV connectors do not talk to each other, so the PD engines speak
    one API. On vLLM's they must use the same connector and agree on what vLLM's NIXL handshake
    checks (`EngineCard.pairing`: KV cache dtype, block size, model dtype, attention backend, the
    operator's pairing protocol), each compared where the engines report it: the engines would
    otherwise reject each other at the first handoff, request after request.
    """
    pd = [(engine_id, card) for engine_id, card in cards if card.role in ("prefill", "decode")]
    if not pd:
        return
    first_id, first = pd[0]
    for engine_id, card in pd[1:]:
        if engine_api(card.api).handoff != engine_api(first.api).handoff:
            raise FleetError(
                f"engine {engine_id} ({card.url}) speaks the {card.api} API but engine {first_id} ({first.url}) the "
                f"{first.api} API: prefill and decode engines hand KV over through one engine family"
            )
    connected = [(engine_id, card) for engine_id, card in pd if engine_api(card.api).handoff == "connector"]
    facts: dict[str, list[tuple[str, EngineCard, str]]] = {}
    for engine_id, card in connected:
        facts.setdefault("kv_connector", []).append((engine_id, card, card.kv_connector or ""))
        for name, value in card.pairing:
            facts.setdefault(name, []).append((engine_id, card, value))
    for name, known in facts.items():
        a_id, a, a_value = known[0]
        for b_id, b, b_value in known[1:]:
            if b_value != a_value:
                raise FleetError(
                    f"engine {b_id} ({b.url}) has {name} {b_value!r}, but engine {a_id} ({a.url}) has {a_value!r}: "
                    "a vLLM prefill and decode engine must agree on it to hand over KV"
                )


def _agreed(
    cards: Sequence[tuple[str, EngineCard]], field: str, override: Any, flag: str, *, strict: bool = True
) -> Any:
    """The value every engine that knows ``field`` reports, or the override.

    Disagreement is a `FleetError` (a warning when overridden or not ``strict``).
    """
    known = [(engine_id, card) for engine_id, card in cards if getattr(card, field) is not None]
    if override is not None:
        for engine_id, card in known:
            if getattr(card, field) != override:
                log.warning(
                    "engine %s (%s) has %s %r; using the configured %r instead",
                    engine_id, card.url, _label(field), getattr(card, field), override,
                )  # fmt: skip
        return override
    if not known:
        return None
    first_id, first = known[0]
    for engine_id, card in known[1:]:
        if getattr(card, field) != getattr(first, field):
            message = (
                f"engine {engine_id} ({card.url}) has {_label(field)} {getattr(card, field)!r}, "
                f"but engine {first_id} ({first.url}) has {getattr(first, field)!r}"
            )
            if not strict:
                log.warning("%s; using %r", message, getattr(first, field))
                continue
            raise FleetError(f"{message}: start every engine with the same {flag}")
    return getattr(first, field)


def _label(field: str) -> str:
    return "block size (page_size)" if field == "block_size" else field
