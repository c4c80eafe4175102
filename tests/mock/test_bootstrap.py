"""PD bootstrap rendezvous: either leg first, timeouts, and one leg's failure ending the other."""

import socket

import pytest
import trio
import trio.testing

from trio_direct.mock.bootstrap import (
    BootstrapFailed,
    BootstrapServer,
    BootstrapTimeout,
    encode_message,
    open_bootstrap_server,
    receive_kv,
)

HOST = "127.0.0.1"
LONG = 30.0  # a timeout the test never waits out; failures must come from the other leg


async def _until(predicate, what: str) -> None:
    """Poll a condition that real sockets make true soon; fail loudly, never flakily-fast."""
    with trio.move_on_after(10):
        while not predicate():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"gave up waiting for: {what}")


async def _assert_no_state(server: BootstrapServer) -> None:
    await _until(lambda: server.open_connections == 0, "connections closed")
    assert server.pending_rooms == frozenset()


async def test_prefill_first_then_decode() -> None:
    async with open_bootstrap_server(HOST) as server, trio.open_nursery() as nursery:
        nursery.start_soon(server.transfer, 7, 12, 0.0, LONG)
        await trio.testing.wait_all_tasks_blocked()
        assert server.pending_rooms == {7}
        with trio.fail_after(10):
            assert await receive_kv(HOST, server.port, 7, LONG) == 12
        await _assert_no_state(server)


async def test_decode_first_then_prefill() -> None:
    async with open_bootstrap_server(HOST) as server:
        async with trio.open_nursery() as nursery:
            got: list[int] = []

            async def decode() -> None:
                got.append(await receive_kv(HOST, server.port, 9, LONG))

            nursery.start_soon(decode)
            await _until(lambda: 9 in server.pending_rooms, "decode leg registered")
            with trio.fail_after(10):
                await server.transfer(9, 3, 0.01, LONG)
        assert got == [3]
        await _assert_no_state(server)


async def test_decode_retries_until_the_listener_is_up() -> None:
    with socket.socket() as probe:  # find a free port, then free it for the server
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    async with trio.open_nursery() as nursery:
        got: list[int] = []

        async def decode() -> None:
            got.append(await receive_kv(HOST, port, 1, LONG))

        nursery.start_soon(decode)
        await trio.sleep(0.05)  # let it fail to connect at least once
        async with open_bootstrap_server(HOST, port) as server:
            with trio.fail_after(10):
                await server.transfer(1, 5, 0.0, LONG)
            await _until(lambda: got == [5], "decode leg done")
    assert got == [5]


async def test_prefill_times_out_without_decode(autojump_clock: trio.testing.MockClock) -> None:
    server = BootstrapServer()  # no listener needed: nobody connects
    with pytest.raises(BootstrapTimeout):
        await server.wait_for_decode(4, timeout=60)
    assert server.pending_rooms == frozenset()


async def test_second_prefill_leg_for_a_room_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    server = BootstrapServer()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.wait_for_decode, 4, 60.0)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(BootstrapFailed, match="already has a prefill leg"):
            await server.wait_for_decode(4, 60.0)
        nursery.cancel_scope.cancel()
    assert server.pending_rooms == frozenset()


async def test_decode_times_out_without_prefill() -> None:
    async with open_bootstrap_server(HOST, unmatched_timeout=0.05) as server:
        with pytest.raises(BootstrapTimeout):
            await receive_kv(HOST, server.port, 2, timeout=0.3)
        await _assert_no_state(server)


async def test_unmatched_decode_connection_is_dropped_after_the_timeout() -> None:
    async with open_bootstrap_server(HOST, unmatched_timeout=0.05) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(HOST, server.port)
            async with stream:
                await stream.send_all(encode_message({"room": 3}))
                reply = b""
                while chunk := await stream.receive_some():
                    reply += chunk
        assert b'"status":"unmatched"' in reply
        await _assert_no_state(server)


async def test_garbage_hello_is_refused() -> None:
    async with open_bootstrap_server(HOST) as server:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream(HOST, server.port)
            async with stream:
                await stream.send_all(b'{"rooms": "x"}\n')
                reply = await stream.receive_some()
        assert b'"status":"error"' in reply
        await _assert_no_state(server)


async def test_cancelled_prefill_fails_decode_promptly() -> None:
    async with open_bootstrap_server(HOST) as server:
        outcome: list[BootstrapFailed] = []

        async def decode_leg() -> None:
            try:
                await receive_kv(HOST, server.port, 5, LONG)
            except BootstrapFailed as exc:
                outcome.append(exc)

        with trio.fail_after(10):  # far below LONG: the failure must come from the prefill leg
            async with trio.open_nursery() as nursery:
                nursery.start_soon(decode_leg)
                handle = await server.wait_for_decode(5, LONG)
                transfer = trio.CancelScope()

                async def prefill_leg() -> None:
                    with transfer:
                        await server.send_kv(handle, 10, LONG)

                nursery.start_soon(prefill_leg)
                await trio.testing.wait_all_tasks_blocked()  # mid-transfer
                transfer.cancel()
        assert len(outcome) == 1 and "aborted" in outcome[0].message
        await _assert_no_state(server)


async def test_aborted_handle_fails_decode_with_the_reason() -> None:
    async with open_bootstrap_server(HOST) as server, trio.open_nursery() as nursery:
        outcome: list[BootstrapFailed] = []

        async def decode_leg() -> None:
            try:
                await receive_kv(HOST, server.port, 6, LONG)
            except BootstrapFailed as exc:
                outcome.append(exc)

        nursery.start_soon(decode_leg)
        with trio.fail_after(10):
            handle = await server.wait_for_decode(6, LONG)
            handle.abort("engine shutting down")
            await _until(lambda: bool(outcome), "decode failed")
        assert outcome[0].message == "engine shutting down"
        await _assert_no_state(server)


async def test_cancelled_decode_fails_prefill_promptly() -> None:
    async with open_bootstrap_server(HOST) as server:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                decode = trio.CancelScope()

                async def decode_leg() -> None:
                    with decode:
                        await receive_kv(HOST, server.port, 8, LONG)

                nursery.start_soon(decode_leg)
                handle = await server.wait_for_decode(8, LONG)
                decode.cancel()
                with pytest.raises(BootstrapFailed, match="disconnected"):
                    await server.send_kv(handle, 10, LONG)
        await _assert_no_state(server)
