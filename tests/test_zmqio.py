"""TrioSocket: pyzmq on trio without threads, incl. the edge-triggered FD trap."""

import pytest
import trio
import trio.testing
import zmq

from trio_direct.zmqio import TrioSocket


def _prefilled_pull(ctx: zmq.Context, count: int, name: str) -> TrioSocket:
    """A PULL socket with ``count`` messages queued and its FD edge already consumed."""
    pull = TrioSocket(ctx, zmq.PULL)
    pull.bind(f"inproc://{name}")
    with ctx.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"inproc://{name}")
        for i in range(count):
            push.send_multipart([b"m", i.to_bytes(4, "big")])
    # Reading EVENTS (as poll does) swallows the edge: a bare wait_readable would now hang.
    assert pull.socket.poll(5000) & zmq.POLLIN
    return pull


async def test_recv_batch_drains_queue_whose_edge_was_already_consumed(ctx: zmq.Context) -> None:
    pull = _prefilled_pull(ctx, 1000, "drain")
    with pull:
        got: list[list[bytes]] = []
        with trio.fail_after(10):
            while len(got) < 1000:
                got.extend(await pull.recv_batch(max_batch=256))
    assert [int.from_bytes(m[1], "big") for m in got] == list(range(1000))


async def test_recv_batch_returns_at_most_max_batch(ctx: zmq.Context) -> None:
    with _prefilled_pull(ctx, 10, "batch") as pull, trio.fail_after(10):
        sizes = [len(await pull.recv_batch(max_batch=4)) for _ in range(3)]
    assert sizes == [4, 4, 2]


async def test_recv_multipart_waits_for_a_later_message(ctx: zmq.Context) -> None:
    with TrioSocket(ctx, zmq.PULL) as pull, TrioSocket(ctx, zmq.PUSH) as push:
        endpoint = pull.bind("tcp://127.0.0.1:0")
        push.connect(endpoint)
        async with trio.open_nursery() as nursery:
            received: list[list[bytes]] = []

            async def receive() -> None:
                received.append(await pull.recv_multipart())

            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            assert received == []
            await push.send_multipart([b"hello", b"world"])
            with trio.fail_after(10):
                while not received:
                    await trio.sleep(0.01)
    assert received == [[b"hello", b"world"]]


async def test_send_nowait_reports_a_full_socket(ctx: zmq.Context) -> None:
    with TrioSocket(ctx, zmq.PUSH, sndhwm=1) as push:
        push.bind("tcp://127.0.0.1:0")
        # No peer, so nowhere to queue: a PUSH would block.
        assert push.send_multipart_nowait([b"x"]) is False


async def test_send_and_receive_waiting_together_on_one_socket(ctx: zmq.Context) -> None:
    """Two tasks blocked on the same FD (trio allows one waiter): both must get through."""
    with TrioSocket(ctx, zmq.DEALER) as dealer, TrioSocket(ctx, zmq.ROUTER) as router:
        endpoint = dealer.bind("tcp://127.0.0.1:0")
        replies: list[list[bytes]] = []
        async with trio.open_nursery() as nursery:

            async def receive() -> None:
                replies.append(await dealer.recv_multipart())

            nursery.start_soon(receive)
            # No peer yet: this send blocks as well.
            nursery.start_soon(dealer.send_multipart, [b"ping"])
            await trio.testing.wait_all_tasks_blocked()
            router.connect(endpoint)
            with trio.fail_after(10):
                identity, payload = await router.recv_multipart()
                await router.send_multipart([identity, payload + b"-pong"])
        assert replies == [[b"ping-pong"]]


async def test_close_wakes_a_blocked_receiver(ctx: zmq.Context) -> None:
    sock = TrioSocket(ctx, zmq.PULL)
    sock.bind("tcp://127.0.0.1:0")
    with pytest.RaisesGroup(trio.ClosedResourceError, trio.ClosedResourceError):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sock.recv_multipart)
            nursery.start_soon(sock.recv_batch)
            await trio.testing.wait_all_tasks_blocked()
            sock.close()
    assert sock.closed
    with pytest.raises(trio.ClosedResourceError):
        sock.send_multipart_nowait([b"late"])


async def test_cancelled_receive_loses_no_message(ctx: zmq.Context) -> None:
    with _prefilled_pull(ctx, 3, "cancel") as pull, trio.fail_after(10):
        with trio.CancelScope() as scope:
            scope.cancel()
            await pull.recv_multipart()
        batch = await pull.recv_batch()
    assert [int.from_bytes(m[1], "big") for m in batch] == [0, 1, 2]
