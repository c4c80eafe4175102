"""One choice served by a prefill engine and a decode engine, both legs in the request's nursery.

The two `Generate` calls carry the same rid and the same bootstrap triple (the prefill engine's
bootstrap host and port, a fresh random room); the engines pair up by themselves. The decode stream
drives the client's output; the prefill stream is read to its end (its usage holds the prompt's
cached tokens) and a prefill failure fails the choice even when decode already produced tokens.

On vLLM's API the engines pair through the KV connector instead: the prefill leg asks for a remote
decode (`remote_decode_leg`: one token, the connector's ``do_remote_decode``), runs to its end,
and the transfer parameters its completion returns go verbatim to the decode leg, which starts then
(both legs still in the request's nursery) and pulls the KV before its first token.

Cancellation (client gone, shutdown, the other leg failed):
- the prefill leg is reset and aborted at once (`open_engine_call`, as for any call);
- the decode leg is **not** torn down before its first message: until then a KV transfer may be in
  flight, and resetting a receiving decode request can crash or leak the engine. The leg runs in a
  shielded scope; `DecodeLeg.abandon` (called from the watcher's ``finally``) either cancels it at
  once (first message seen) or lets it run until its first message, bounded by
  `--decode-abort-deadline`. Then its stream is reset and it is aborted like any call.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import replace

import trio

from trio_direct.core.choices import ChoiceFailed, ChoiceReader, ChoiceRun, EngineLeg, RunControl, offer, stream_choice
from trio_direct.core.engine_call import open_engine_call
from trio_direct.engine.errors import EngineError, EngineInternal, EngineUnavailable
from trio_direct.engine.types import EngineClient, GenerateInput
from trio_direct.fleet.engine_apis import engine_api

log = logging.getLogger(__name__)


#: What a vLLM prefill leg asks its KV connector for (vLLM's own disaggregation proxy sends the same):
#: keep the KV for a decode engine that will pull it, and say in the completion how to.
REMOTE_DECODE = json.dumps(
    {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
)


def remote_decode_leg(decode_request: GenerateInput, dp_rank: int | None) -> GenerateInput:
    """The prefill twin of a vLLM decode request: same rid and prompt, one token, not streamed,
    no logprobs, asking the connector for a remote decode."""
    return replace(
        decode_request,
        routed_dp_rank=dp_rank,
        sampling=replace(decode_request.sampling, max_new_tokens=1, min_new_tokens=0),
        stream=False,
        return_logprob=False,
        kv_transfer_params=REMOTE_DECODE,
    )


def new_room(*clients: EngineClient) -> int:
    """A fresh non-negative bootstrap room that fits every leg's API."""
    bits = min(engine_api(c.api).room_bits for c in clients)
    return random.getrandbits(bits)


class DecodeLeg:
    """The decode leg's lifetime, decided by the leg's own state rather than by the request's."""

    __slots__ = ("scope", "first_message", "done", "abandoned", "deadline")

    def __init__(self, deadline: float) -> None:
        self.scope = trio.CancelScope()
        self.first_message = False
        self.done = False
        self.abandoned = False
        self.deadline = deadline

    def abandon(self) -> None:
        """The request no longer wants this leg's output: end it as soon as that is safe."""
        if self.done or self.abandoned:
            return
        self.abandoned = True
        if self.first_message:
            self.scope.cancel()
        else:
            self.scope.deadline = trio.current_time() + self.deadline

    def saw_first_message(self) -> None:
        self.first_message = True
        if self.abandoned:
            self.scope.cancel()


async def run_disaggregated_choice(
    run: ChoiceRun,
    control: RunControl,
    *,
    abort_timeout: float,
    decode_abort_deadline: float,
    send: trio.MemorySendChannel,
    written: Callable[[], None],
    readers: list[ChoiceReader] | None = None,
) -> None:
    """Run both legs of one choice; events and failures go to `send`; `written` is called once
    both requests are on the wire, on vLLM's API once the prefill request is (or could not be sent).

    A decode leg that fails mid-stream continues on a fresh prefill + decode pair (or an aggregated
    engine, as routing decides): its prefill leg starts here, and the new decode leg is shielded
    like the first until its own first message."""
    leg = DecodeLeg(decode_abort_deadline)
    prefill = run.prefill
    assert prefill is not None
    # vLLM: the decode leg needs what the prefill's completion says, so it waits for it; the choice
    # counts as sent once its prefill request is (the decode request cannot go before it returns).
    sequential = prefill.request.kv_transfer_params is not None
    legs_written = _Countdown(1 if sequential else 2, written)
    decode_written = _nothing if sequential else legs_written.done
    async with send, trio.open_nursery() as nursery:
        if sequential:
            handoff = await _prefill_leg(prefill, run, control, abort_timeout, send.clone(), legs_written.done)
            if handoff is None:
                return  # no decode request goes out; the failure is in `send`
            run.plan.request.kv_transfer_params = handoff
        else:
            nursery.start_soon(_prefill_leg, prefill, run, control, abort_timeout, send.clone(), legs_written.done)

        def migrated(prefill: EngineLeg | None) -> None:
            if prefill is not None:
                leg.first_message = False  # a KV transfer is coming again: shielded until it arrived
                nursery.start_soon(_prefill_leg, prefill, run, control, abort_timeout, send.clone(), _nothing, False)

        watcher = trio.CancelScope()
        nursery.start_soon(_watch, leg, watcher)
        try:
            with trio.CancelScope(shield=True), leg.scope:
                await stream_choice(
                    run, control, abort_timeout, send, written=decode_written,
                    on_first_message=leg.saw_first_message, on_migrate=migrated, readers=readers,
                )  # fmt: skip
        finally:
            leg.done = True
            watcher.cancel()
    if leg.abandoned and not leg.first_message:
        log.warning("decode leg %s gave no first message within %.1fs; aborted", run.plan.request.rid, leg.deadline)


class _Countdown:
    """Calls `then` once `done` was called `count` times (each leg's request written)."""

    __slots__ = ("_left", "_then")

    def __init__(self, count: int, then: Callable[[], None]) -> None:
        self._left = count
        self._then = then

    def done(self) -> None:
        self._left -= 1
        if self._left == 0:
            self._then()


async def _watch(leg: DecodeLeg, scope: trio.CancelScope) -> None:
    """Turns the request's cancellation into `leg.abandon()`, which the shielded leg cannot see."""
    with scope:
        try:
            await trio.sleep_forever()
        finally:
            leg.abandon()


def _nothing() -> None:
    pass


async def _prefill_leg(
    prefill: EngineLeg,
    run: ChoiceRun,
    control: RunControl,
    abort_timeout: float,
    send: trio.MemorySendChannel,
    written: Callable[[], None],
    first: bool = True,
) -> str | None:
    """One prefill leg; the `first` one's cache hit is the choice's (a continuation's is not the client's).

    Returns the KV-connector parameters its completion handed on (vLLM's API), None otherwise or
    when it failed (the failure then went to `send`)."""
    announced = False
    handoff: str | None = None
    async with send:
        try:
            async with open_engine_call(
                prefill.client, prefill.request, abort_timeout=abort_timeout, watch=control.watch,
                trace=control.trace, role="prefill",
            ) as call:  # fmt: skip
                try:
                    await call.wait_written()
                finally:
                    announced = True
                    written()
                while batch := await call.next_batch():
                    last = batch[-1]
                    if last.finish_reason is None:
                        continue
                    if first:
                        run.plan.output.prompt_cached_tokens = last.cached_tokens
                    if last.finish_reason == "abort":
                        raise EngineInternal(f"prefill aborted: {last.abort_message or 'no reason given'}")
                    handoff = last.kv_transfer_params
            if prefill.request.kv_transfer_params is not None and handoff is None:
                raise EngineInternal("the prefill engine's completion carried no kv_transfer_params for the decode")
        except EngineError as error:
            log.warning("prefill leg %s on %s failed: %s", prefill.request.rid, prefill.client.name, error)
            if isinstance(error, EngineUnavailable):
                control.unreachable(prefill.client, error)
            offer(send, ChoiceFailed(error))
            return None
        finally:
            if not announced:
                written()
    return handoff
