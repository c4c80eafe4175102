"""The mock's SGLang KV-event publisher as a subscriber sees it: frames, seqs, encodings, replay."""

import msgspec
import pytest
import trio
import zmq
from support import kv_events_config

from trio_direct.mock.kv_publisher import (
    END_SEQ,
    EventFormat,
    KvEventPublisher,
    KvEventsConfig,
    bind_kv_publishers,
    decode_batch,
    describe,
    encode_batch,
    open_kv_publishers,
    rank_endpoint,
)
from trio_direct.mock.kv_types import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from trio_direct.zmqio import TrioSocket

STORED = BlockStored(block_hashes=(11, 12), parent_block_hash=10, token_ids=(1, 2, 3, 4), block_size=2)
ROOT_STORED = BlockStored(block_hashes=(5,), parent_block_hash=None, token_ids=(9, 9), block_size=2)
REMOVED = BlockRemoved(block_hashes=(11,))
EVENTS: list[KvEvent] = [STORED, ROOT_STORED, REMOVED, AllBlocksCleared()]


def _seq(frame: bytes) -> int:
    return int.from_bytes(frame, "big")


async def _subscribe(ctx: zmq.Context, publisher: KvEventPublisher) -> TrioSocket:
    """A SUB that is surely joined (a SUB misses whatever precedes its subscription).

    Probe batches are published until one arrives; they use up sequence numbers.
    """
    sub = TrioSocket(ctx, zmq.SUB, rcvhwm=100_000)
    sub.connect(publisher.bound_endpoint)
    sub.subscribe(b"")
    with trio.fail_after(10):
        while True:
            publisher.publish([AllBlocksCleared()])
            with trio.move_on_after(0.02):
                await sub.recv_multipart()
                break
        # Drain probes still in flight so the next message is the test's own.
        with trio.move_on_after(0.05):
            while True:
                await sub.recv_multipart()
    return sub


async def _replay(ctx: zmq.Context, endpoint: str | None, start_seq: int) -> list[list[bytes]]:
    assert endpoint is not None, "the publisher has no replay socket"
    """Everything a DEALER receives for one replay request, END marker included."""
    with TrioSocket(ctx, zmq.DEALER) as dealer, trio.fail_after(10):
        dealer.connect(endpoint)
        await dealer.send_multipart([b"", start_seq.to_bytes(8, "big")])
        replies = []
        while True:
            frames = await dealer.recv_multipart()
            replies.append(frames)
            if frames[-2] == END_SEQ:
                return replies


# -- wire encoding -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["map", "array"])
def test_batch_round_trips(fmt: EventFormat) -> None:
    payload = encode_batch(1.5, EVENTS, 3, fmt)
    assert decode_batch(payload) == (1.5, EVENTS, 3)


def test_map_encoding_is_sglang_0_5_23() -> None:
    ts, events, rank = msgspec.msgpack.decode(encode_batch(2.0, EVENTS, 0, "map"))
    assert (ts, rank) == (2.0, 0)
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": [11, 12],
            "parent_block_hash": 10,
            "token_ids": [1, 2, 3, 4],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
        },
        {
            "type": "BlockStored",
            "block_hashes": [5],
            "parent_block_hash": None,
            "token_ids": [9, 9],
            "block_size": 2,
            "lora_id": None,
            "medium": "GPU",
        },
        {"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
    ]


def test_array_encoding_is_sglang_0_5_19() -> None:
    _, events, _ = msgspec.msgpack.decode(encode_batch(2.0, EVENTS, 1, "array"))
    assert events == [
        ["BlockStored", [11, 12], 10, [1, 2, 3, 4], 2, None, "GPU"],
        ["BlockStored", [5], None, [9, 9], 2, None, "GPU"],
        ["BlockRemoved", [11], "GPU"],
        ["AllBlocksCleared"],
    ]


def test_decode_skips_bad_events_and_accepts_older_shapes() -> None:
    payload = msgspec.msgpack.encode(
        [
            7.0,
            [
                ["BlockStored", [1], None, [4, 5], 2, None],  # 0.5.4: no medium
                {"type": "BlockStored", "block_hashes": ["x"], "token_ids": [], "block_size": 2},
                {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU_PINNED", "extra": 1},
                ["Unknown", 1],
                42,
                {"type": "AllBlocksCleared", "whatever": True},
            ],
            0,
        ]
    )
    _, events, rank = decode_batch(payload)
    assert events == [
        BlockStored(block_hashes=(1,), parent_block_hash=None, token_ids=(4, 5), block_size=2),
        BlockRemoved(block_hashes=(1,)),
        AllBlocksCleared(),
    ]
    assert rank == 0


def test_decode_rejects_a_non_batch() -> None:
    with pytest.raises(ValueError):
        decode_batch(msgspec.msgpack.encode({"not": "a batch"}))


# -- config and endpoints ------------------------------------------------------------


def test_config_defaults_follow_sglang() -> None:
    off = KvEventsConfig.from_json(None)
    assert not off.enabled
    config = KvEventsConfig.from_json('{"publisher": "zmq", "max_queue_size": 5, "bind": true}')
    assert config == KvEventsConfig(
        publisher="zmq",
        endpoint="tcp://*:5557",
        replay_endpoint=None,
        buffer_steps=10000,
        hwm=100000,
        topic="",
        format="map",
    )
    assert KvEventsConfig.from_json('{"publisher": "zmq", "format": "default"}').format == "map"
    with pytest.raises(ValueError):
        KvEventsConfig.from_json('{"publisher": "kafka"}')
    with pytest.raises(ValueError):
        KvEventsConfig.from_json('{"publisher": "zmq", "format": "dynamo"}')


def test_rank_endpoints() -> None:
    assert rank_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert rank_endpoint("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert rank_endpoint("inproc://kv", 1) == "inproc://kv_dp1"


async def test_ranks_get_consecutive_ports_and_their_own_rank(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 3, ctx) as publishers:
        ports = [p.bound_port for p in publishers]
        replay_ports = [p.bound_replay_port for p in publishers]
        assert ports[0] is not None and ports == [ports[0] + r for r in range(3)]
        assert replay_ports[0] is not None and replay_ports == [replay_ports[0] + r for r in range(3)]
        assert publishers.config.endpoint == f"tcp://127.0.0.1:{ports[0]}"
        sub = await _subscribe(ctx, publishers[2])
        with sub, trio.fail_after(10):
            publishers[2].publish([STORED])
            _, _, payload = await sub.recv_multipart()
        assert decode_batch(payload)[2] == 2


def test_describe_matches_sglang_server_info(ctx: zmq.Context) -> None:
    publishers = bind_kv_publishers(kv_events_config(), 2, ctx)
    with_replay = publishers.config
    publishers.close()
    port = int(with_replay.endpoint.rsplit(":", 1)[1])
    assert with_replay.replay_endpoint is not None
    replay_port = int(with_replay.replay_endpoint.rsplit(":", 1)[1])
    info = describe("10.0.0.5", with_replay, 2, 16)
    assert info["kv_events"] == {
        "publisher": "zmq",
        "endpoint_host": "127.0.0.1",
        "endpoint_port_base": port,
        "topic": "kv",
        "block_size": 16,
        "dp_size": 2,
        "replay_endpoint_port_base": replay_port,
    }
    assert info["kv_event_sources"] == [
        {
            "dp_rank": r,
            "endpoint": f"tcp://127.0.0.1:{port + r}",
            "topic": "kv",
            "block_size": 16,
            "replay_endpoint": f"tcp://127.0.0.1:{replay_port + r}",
        }
        for r in range(2)
    ]

    wildcard = KvEventsConfig(publisher="zmq", endpoint="tcp://*:5557")
    info = describe("10.0.0.5", wildcard, 1, 1)
    assert info["kv_events"]["endpoint_host"] == "*"
    assert "replay_endpoint_port_base" not in info["kv_events"]
    assert info["kv_event_sources"] == [{"dp_rank": 0, "endpoint": "tcp://10.0.0.5:5557", "topic": "", "block_size": 1}]

    old = KvEventsConfig(publisher="zmq", endpoint="tcp://*:5557", replay_endpoint="tcp://*:5558", format="array")
    assert describe("h", old, 1, 1) == {
        "kv_events": {
            "publisher": "zmq",
            "endpoint_host": "*",
            "endpoint_port_base": 5557,
            "topic": "",
            "block_size": 1,
            "dp_size": 1,
        }
    }
    assert describe("h", KvEventsConfig(), 1, 1) == {"kv_events": None, "kv_event_sources": []}
    with pytest.raises(ValueError):
        describe("h", kv_events_config(), 1, 1)  # port 0: not yet bound


# -- live publishing -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["map", "array"])
async def test_subscriber_sees_topic_seq_and_payload(ctx: zmq.Context, fmt: str) -> None:
    async with open_kv_publishers(kv_events_config(fmt), 1, ctx) as publishers:
        publisher = publishers[0]
        sub = await _subscribe(ctx, publisher)
        with sub, trio.fail_after(10):
            first = publisher.next_seq
            publisher.publish([STORED, REMOVED], ts=12.5)
            publisher.publish([])  # an idle step publishes nothing
            publisher.publish([AllBlocksCleared()], ts=13.0)
            one = await sub.recv_multipart()
            two = await sub.recv_multipart()
    assert one[0] == two[0] == b"kv"
    assert (_seq(one[1]), _seq(two[1])) == (first, first + 1)
    assert len(one[1]) == 8
    assert decode_batch(one[2]) == (12.5, [STORED, REMOVED], 0)
    assert decode_batch(two[2]) == (13.0, [AllBlocksCleared()], 0)


async def test_seq_starts_at_one_as_sglangs_and_counts_batches(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        assert publisher.next_seq == 1
        publisher.publish([STORED])
        publisher.publish([REMOVED, AllBlocksCleared()])
        assert publisher.next_seq == 3
        replies = await _replay(ctx, publisher.bound_replay_endpoint, 0)
    assert [_seq(r[2]) for r in replies[:-1]] == [1, 2]


@pytest.mark.parametrize("fmt", ["map", "array"])
async def test_replay_layouts(ctx: zmq.Context, fmt: str) -> None:
    async with open_kv_publishers(kv_events_config(fmt), 1, ctx) as publishers:
        publisher = publishers[0]
        for step in range(3):
            publisher.publish([STORED], ts=float(step))
        replies = await _replay(ctx, publisher.bound_replay_endpoint, 2)
    if fmt == "map":  # 0.5.23: [b"", topic, seq, payload], end [b"", b"", END, b""]
        assert [r[:3] for r in replies[:-1]] == [[b"", b"kv", (n).to_bytes(8, "big")] for n in (2, 3)]
        assert replies[-1] == [b"", b"", END_SEQ, b""]
    else:  # 0.5.19: [b"", seq, payload], end [b"", END, b""]
        assert [r[:2] for r in replies[:-1]] == [[b"", (n).to_bytes(8, "big")] for n in (2, 3)]
        assert replies[-1] == [b"", END_SEQ, b""]
    assert [decode_batch(r[-1])[0] for r in replies[:-1]] == [1.0, 2.0]


async def test_replay_reveals_lost_history(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(buffer_steps=2), 1, ctx) as publishers:
        publisher = publishers[0]
        endpoint = publisher.bound_replay_endpoint
        assert await _replay(ctx, endpoint, 0) == [[b"", b"", END_SEQ, b""]]  # nothing yet
        for step in range(5):
            publisher.publish([STORED], ts=float(step))
        # Only seqs 4 and 5 are kept: a suffix starting past 1 proves 1..3 are gone.
        assert [_seq(r[2]) for r in (await _replay(ctx, endpoint, 0))[:-1]] == [4, 5]
        assert await _replay(ctx, endpoint, 6) == [[b"", b"", END_SEQ, b""]]


async def test_long_replay_to_a_slow_reader_arrives_complete(ctx: zmq.Context) -> None:
    """More data than the HWMs and socket buffers hold: the ROUTER waits instead of dropping."""
    big = BlockStored(block_hashes=tuple(range(64)), parent_block_hash=None, token_ids=(100_000,) * 1024, block_size=16)
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        for _ in range(3000):  # ~15 MB, seqs 1..3000
            publisher.publish([big], ts=1.0)
        assert publisher.bound_replay_endpoint is not None
        with TrioSocket(ctx, zmq.DEALER, rcvhwm=100) as dealer, trio.fail_after(30):
            dealer.connect(publisher.bound_replay_endpoint)
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            await trio.sleep(0.2)  # let the replay run into full buffers before reading
            seqs = []
            while (frames := await dealer.recv_multipart())[-2] != END_SEQ:
                seqs.append(_seq(frames[2]))
    assert seqs == list(range(1, 3001))


async def test_drop_next_makes_a_gap_that_replay_fills(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        sub = await _subscribe(ctx, publisher)
        with sub, trio.fail_after(10):
            lost = publisher.next_seq
            publisher.drop_next(1)
            publisher.publish([STORED], ts=1.0)
            publisher.publish([REMOVED], ts=2.0)
            _, seq, _ = await sub.recv_multipart()
            assert _seq(seq) == lost + 1  # the subscriber sees a gap
            replies = await _replay(ctx, publisher.bound_replay_endpoint, lost)
    assert [_seq(r[2]) for r in replies[:-1]] == [lost, lost + 1]
    assert decode_batch(replies[0][3])[1] == [STORED]


async def test_malformed_replay_request_is_ignored(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        endpoint = publishers[0].bound_replay_endpoint
        assert endpoint is not None
        with TrioSocket(ctx, zmq.DEALER) as dealer:
            dealer.connect(endpoint)
            await dealer.send_multipart([b"", b"short"])
        # The server carries on answering well-formed requests.
        assert await _replay(ctx, endpoint, 0) == [[b"", b"", END_SEQ, b""]]


async def test_sockets_close_when_the_block_ends(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 2, ctx) as publishers:
        pass
    with pytest.raises(trio.ClosedResourceError):
        publishers[1].publish([STORED])


async def test_null_publisher_opens_nothing(ctx: zmq.Context) -> None:
    async with open_kv_publishers(KvEventsConfig(), 4, ctx) as publishers:
        assert len(publishers) == 0


# -- fault-injection hooks -------------------------------------------------------------


async def test_publish_payload_sends_anything_under_the_next_seq(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        sub = await _subscribe(ctx, publisher)
        with sub, trio.fail_after(10):
            expected = publisher.next_seq
            assert publisher.publish_payload(b"\xc1 not msgpack") == expected
            assert publisher.next_seq == expected + 1
            assert await sub.recv_multipart() == [b"kv", expected.to_bytes(8, "big"), b"\xc1 not msgpack"]
            replies = await _replay(ctx, publisher.bound_replay_endpoint, expected)
    assert [(_seq(r[2]), r[3]) for r in replies[:-1]] == [(expected, b"\xc1 not msgpack")]


async def test_send_frames_uses_no_seq(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        sub = await _subscribe(ctx, publisher)
        with sub, trio.fail_after(10):
            expected = publisher.next_seq
            publisher.send_frames([b"kv", b"short"])
            assert await sub.recv_multipart() == [b"kv", b"short"]
            assert publisher.next_seq == expected


async def test_restart_sequence_numbers_from_the_start_with_no_history(ctx: zmq.Context) -> None:
    async with open_kv_publishers(kv_events_config(), 1, ctx) as publishers:
        publisher = publishers[0]
        for step in range(3):
            publisher.publish([STORED], ts=float(step))
        publisher.drop_next(1)
        publisher.restart_sequence()
        assert publisher.next_seq == 1
        assert await _replay(ctx, publisher.bound_replay_endpoint, 0) == [[b"", b"", END_SEQ, b""]]
        sub = await _subscribe(ctx, publisher)  # not dropped: the restart forgot drop_next
        with sub:
            publisher.publish([REMOVED], ts=9.0)
            with trio.fail_after(10):
                _, seq, payload = await sub.recv_multipart()
    assert decode_batch(payload)[1] == [REMOVED] and _seq(seq) == publisher.next_seq - 1
