"""Small helpers for tests (importable from every test folder: `from support import ...`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
from google.protobuf import json_format, struct_pb2

from trio_direct.engine.errors import EngineError
from trio_direct.engine.native import NativeEngineClient
from trio_direct.engine.transport import EngineChannel
from trio_direct.engine.transport.server import RpcMethod, ServerCall
from trio_direct.mock.kv_publisher import KvEventsConfig
from trio_direct.mock.vllm_service import ACCOUNTING_METHOD

#: The first 600 requests of the Mooncake conversation trace (FAST'25 release, Apache-2.0): enough for
#: the trace tests' multi-turn conversations, and committed so a clean clone runs them.
TRACE_SAMPLE = Path(__file__).parent / "data" / "mooncake_conversation_trace.jsonl"


def kv_events_config(fmt: str = "map", *, replay: bool = True, **extra: object) -> KvEventsConfig:
    """A ZMQ publisher config on ephemeral loopback ports (with a replay endpoint unless told not)."""
    return KvEventsConfig.from_dict(
        {
            "publisher": "zmq",
            "endpoint": "tcp://127.0.0.1:0",
            "replay_endpoint": "tcp://127.0.0.1:0" if replay else None,
            "topic": "kv",
            "format": fmt,
            **extra,
        }
    )


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.005) -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds."""
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(interval)


class FakeEngine:
    """Serves whatever handlers a test installs, by method path, on an ephemeral loopback port."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[ServerCall], None]] = {}
        self.port = 0

    def channel(self) -> EngineChannel:
        return EngineChannel("127.0.0.1", self.port, connect_timeout=2.0)

    def methods(self, types: dict[str, tuple[bool, type, type]]) -> list[RpcMethod]:
        def dispatch(path: str) -> Callable[[ServerCall], None]:
            return lambda call: self.handlers[path](call)

        return [RpcMethod(path, streaming, req, resp, dispatch(path)) for path, (streaming, req, resp) in types.items()]


# ---- real processes and servers for scenario tests --------------------------------------------------


@dataclass(slots=True)
class MockEngineProcess:
    """A `trio-direct mock-engine` child process, killed when the test's nursery closes."""

    process: trio.Process
    host: str
    port: int
    ready: dict

    @property
    def url(self) -> str:
        return f"grpc://{self.host}:{self.port}"


class EngineExited(RuntimeError):
    """A mock engine process ended before it was ready (`returncode` 2: a usage error, such as a
    port in use)."""

    def __init__(self, command: list[str], returncode: int | None) -> None:
        super().__init__(f"mock engine exited before it was ready (status {returncode}): {command}")
        self.returncode = returncode


async def start_mock_engine(nursery: trio.Nursery, *args: str) -> MockEngineProcess:
    """Start `python -m trio_direct mock-engine --port 0 ARGS` and wait for its ready line."""
    command = [sys.executable, "-m", "trio_direct", "mock-engine", "--port", "0", *args]
    process = await nursery.start(partial(trio.run_process, command, stdout=subprocess.PIPE, check=False))
    buffer = b""
    with trio.fail_after(30):
        while b"\n" not in buffer:
            data = await process.stdout.receive_some()
            if not data:
                raise EngineExited(command, await process.wait())
            buffer += data
    ready = json.loads(buffer.split(b"\n", 1)[0])
    return MockEngineProcess(process, ready["host"], ready["port"], ready)


async def engine_accounting(url: str) -> dict:
    """The mock engine's request accounting (requires an open asyncio loop)."""
    host, port = url.removeprefix("grpc://").rsplit(":", 1)
    channel = EngineChannel(host, int(port))
    try:
        try:
            return (await NativeEngineClient(channel, incremental=True).server_info())["mock_accounting"]
        except EngineError:  # a mock serving vLLM's API (no native service): its own accounting method
            reply = await channel.unary(ACCOUNTING_METHOD, struct_pb2.Struct(), struct_pb2.Struct, timeout=10)
            return _integral(json_format.MessageToDict(reply))
    finally:
        channel.close()


def _integral(value):
    """A Struct's numbers are doubles: give the integral ones back as ints, as JSON had them."""
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def aborts_caught_up(account: dict) -> bool:
    """Every request the engine saw cut short has its Abort recorded. The frontend resets a call's
    stream first and sends the Abort after it (`core.engine_call.open_engine_call`), so an engine can
    count a request cancelled, and hold nothing live, a moment before that Abort arrives."""
    aborts = sum(1 for rid, _ in account["abort_rpcs"] if not rid.startswith("HEALTH_CHECK"))
    return account["cancelled"] + account["aborted"] <= aborts


async def settled_accounts(urls: list[str], timeout: float = 20.0, abort_grace: float = 5.0) -> list[dict]:
    """The engines' accounts once none holds a live request and (for at most `abort_grace` seconds
    more) the Aborts still owed for requests they saw cut short have arrived."""
    with trio.fail_after(timeout):
        while True:
            accounts = [await engine_accounting(url) for url in urls]
            if all(not account["live"] for account in accounts):
                break
            await trio.sleep(0.05)
    with trio.move_on_after(abort_grace):
        while not all(aborts_caught_up(account) for account in accounts):
            await trio.sleep(0.05)
            accounts = [await engine_accounting(url) for url in urls]
    return accounts


async def start_frontend(nursery: trio.Nursery, *argv: str) -> str:
    """An in-process `trio-direct serve` on an ephemeral loopback port; returns its base URL."""
    from trio_direct.config import parse_serve_args
    from trio_direct.service import serve

    config = parse_serve_args(["--host", "127.0.0.1", "--port", "0", "--engine-wait-timeout", "30", *argv], environ={})
    binds = await nursery.start(serve, config)
    return binds[0]


class RawSseClient:
    """A bare HTTP/1.1 SSE client on a trio socket: it can hang up at any byte, like a real client.

    (httpx leaves its nested body generators unfinalized when a stream is abandoned early.)
    """

    def __init__(self, base_url: str) -> None:
        host, port = base_url.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)

    async def events(self, path: str, body: dict):
        """Async iterator over the parsed `data:` payloads (of named events too); closing it closes
        the connection."""
        import h11

        payload = json.dumps(body).encode()
        stream = await trio.open_tcp_stream(self.host, self.port)
        connection = h11.Connection(h11.CLIENT)
        try:
            headers = [
                ("Host", self.host),
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                ("Connection", "close"),
            ]
            await stream.send_all(connection.send(h11.Request(method="POST", target=path, headers=headers)))
            await stream.send_all(connection.send(h11.Data(data=payload)) + connection.send(h11.EndOfMessage()))
            pending = b""
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    connection.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Response):
                    if event.status_code != 200:
                        raise AssertionError(f"status {event.status_code}")
                elif isinstance(event, h11.Data):
                    pending += bytes(event.data)
                    *complete, pending = pending.split(b"\n\n")
                    for record in complete:
                        # a named event (`event: ...` then `data: ...`) yields its data too
                        data = next((line for line in record.split(b"\n") if line.startswith(b"data: ")), None)
                        if data is not None:
                            data = data[len(b"data: ") :]
                            yield "[DONE]" if data == b"[DONE]" else json.loads(data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return
        finally:
            await stream.aclose()


# ---- discovery: a real DNS server on loopback, and who is connected to an engine ---------------------


class LoopbackDns:
    """A real DNS server (dnslib's, UDP, in a thread of the test process) on 127.0.0.1 and an
    ephemeral port, answering from records the test changes as it runs.

    Names it knows nothing of get NXDOMAIN; a known name without records of the asked type, an
    empty answer. `queries` counts the questions per (name, type).
    """

    def __init__(self) -> None:
        from dnslib.server import DNSLogger, DNSServer

        self._records: dict[tuple[str, str], list] = {}
        self.queries: dict[tuple[str, str], int] = {}
        quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
        self._server = DNSServer(self, address="127.0.0.1", port=0, logger=quiet)
        self.port = self._server.server.server_address[1]
        self._server.start_thread()
        self.running = True

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_a(self, name: str, addresses: list[str]) -> None:
        from dnslib import A

        self._records[(name.lower(), "A")] = [A(address) for address in addresses]
        self._records.setdefault((name.lower(), "AAAA"), [])

    def set_srv(self, name: str, targets: list[tuple[str, int]]) -> None:
        from dnslib import SRV

        self._records[(name.lower(), "SRV")] = [SRV(priority=0, weight=1, port=port, target=t) for t, port in targets]

    def forget(self, name: str) -> None:
        """`name` no longer exists (NXDOMAIN)."""
        for key in [key for key in self._records if key[0] == name.lower()]:
            del self._records[key]

    def resolve(self, request, handler):  # dnslib's resolver interface; runs in the server's thread
        from dnslib import QTYPE, RCODE, RR

        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        self.queries[(name, kind)] = self.queries.get((name, kind), 0) + 1
        reply = request.reply()
        if not any(known == name for known, _ in self._records):
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for rdata in self._records.get((name, kind), []):
            reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=rdata, ttl=1))
        return reply

    def stop(self) -> None:
        if self.running:
            self.running = False
            self._server.stop()
            self._server.server.server_close()


def established_connections(host: str, port: int) -> int:
    """TCP connections in state ESTABLISHED to `host:port` (IPv4), from Linux's /proc/net/tcp: the
    engine's side of every connection a client has open to it."""
    import ipaddress

    packed = ipaddress.IPv4Address(host).packed
    local = f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[1] == local and fields[3] == "01":
                count += 1
    return count


# ---- raw HTTP/1.1 on loopback, for what clients with a library cannot do ---------------------------


async def read_to_eof(stream: trio.SocketStream, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too)."""
    received = b""
    with trio.fail_after(timeout):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return received
            if not chunk:
                return received
            received += chunk


async def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a new connection and read until the server closes it."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(data)
        return await read_to_eof(stream, timeout)
    finally:
        await stream.aclose()


def sockets_in_close_wait(port: int) -> int:
    """Server-side sockets of `port` that the client closed but the server has not (TCP state CLOSE-WAIT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "08":
                count += 1
    return count


async def read_response(stream: trio.SocketStream, timeout: float = 10.0) -> bytes:
    """One whole response with a Content-Length body, on a connection that stays open."""
    received = b""
    with trio.fail_after(timeout):
        while b"\r\n\r\n" not in received:
            received += await stream.receive_some(65536)
        head, body = received.split(b"\r\n\r\n", 1)
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:"))
        while len(body) < length:
            body += await stream.receive_some(65536)
    return head + b"\r\n\r\n" + body
