"""Fuzzing the remoting protocol, both directions.

- The codec: any bytes fed to ``FrameDecoder`` give commands or ``RemotingProtocolError``,
  never another exception, never a hang.
- Into ``broker_stub``: random and truncated frames, absurd lengths, bad JSON headers,
  wrong serialize types on one connection; the broker closes that connection (or answers
  it) and serves another client as before.
- Out of a hostile broker: a man in the middle in front of a stub broker, registered with
  the name server as ``broker-h``, garbles, truncates, oversizes, delays, duplicates or
  mismatches the broker's responses. The proxy answers every client call with a RocketMQ
  code within the call's deadline, and serves normally once the broker behaves.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
import zlib
from dataclasses import dataclass

import grpc
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import (
    FrameDecoder,
    RemotingCommand,
    RemotingProtocolError,
    encode,
)
from proxy.remoting.headers import RegisterBrokerHeader, now_ms
from testkit.waits import wait_for
from tests.fuzz._proxy_thread import ProxyThread
from tests.fuzz.test_grpc_fuzz import _BASES, CODES, GROUP, call_stream, call_unary

TOPIC = "FuzzTopic"

# -- frames -------------------------------------------------------------------------------

# What orjson writes: integers from -2**63 to 2**64 - 1 (larger ones are in the samples).
_JSON_INTEGERS = st.integers(-(2**63), 2**64 - 1)

_HEADER_JSON = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(
        [
            b"{}",
            b"[]",
            b"null",
            b'{"code":"x"}',
            b'{"code":1e400}',
            b'{"code":99999999999999999999}',
            b'{"extFields":[1]}',
            b'{"extFields":{"a":null,"b":{"c":1}}}',
            b'{"language":{}}',
            b'{"remark":123,"code":10}',
            b'{"opaque":-1,"flag":-1,"code":-1}',
        ]
    ),
    st.dictionaries(
        st.sampled_from(
            [
                "code",
                "opaque",
                "flag",
                "remark",
                "language",
                "version",
                "extFields",
                "serializeTypeCurrentRPC",
            ]
        ),
        st.one_of(
            _JSON_INTEGERS,
            st.text(max_size=8),
            st.none(),
            st.booleans(),
            st.floats(),
            st.lists(_JSON_INTEGERS, max_size=2),
            st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
        ),
    ).map(orjson.dumps),
)


@st.composite
def binary_headers(draw) -> bytes:
    """The ROCKETMQ binary layout with lying lengths."""
    fixed = struct.pack(
        ">hbhii",
        draw(st.integers(-32768, 32767)),
        draw(st.integers(-128, 127)),
        draw(st.integers(-32768, 32767)),
        draw(st.integers(-(2**31), 2**31 - 1)),
        draw(st.integers(-(2**31), 2**31 - 1)),
    )
    remark = draw(st.binary(max_size=8))
    table = b""
    for _ in range(draw(st.integers(0, 3))):
        key, value = draw(st.binary(max_size=6)), draw(st.binary(max_size=6))
        table += struct.pack(">h", draw(st.sampled_from([len(key), -len(key) - 1, -2, 32767])))
        table += key
        table += struct.pack(
            ">i", draw(st.sampled_from([len(value), -len(value), -4, -6, 2**31 - 1]))
        )
        table += value
    lie = st.sampled_from([0, 1, -1, -4, 2**31 - 1])
    remark_len = len(remark) + draw(lie) if draw(st.booleans()) else len(remark)
    table_len = len(table) + draw(lie) if draw(st.booleans()) else len(table)
    return (
        fixed
        + struct.pack(">i", max(min(remark_len, 2**31 - 1), -(2**31)))
        + remark
        + struct.pack(">i", max(min(table_len, 2**31 - 1), -(2**31)))
        + table
    )


@st.composite
def frames(draw) -> bytes:
    """One frame: a header of any serialize type, any body, lengths true or absurd."""
    serialize = draw(st.sampled_from([0, 1, 2, 255]))
    header = draw(binary_headers()) if serialize == 1 else draw(_HEADER_JSON)
    body = draw(st.binary(max_size=32))
    header_len = draw(st.sampled_from([len(header), len(header) + 1, 0, 0xFFFFFF]))
    word = ((serialize << 24) | (header_len & 0xFFFFFF)) & 0xFFFFFFFF
    length = 4 + len(header) + len(body)
    length = draw(st.sampled_from([length, length, length - 1, 0, 3, -1, 2**31 - 1, 16 << 20]))
    return struct.pack(">iI", length, word) + header + body


_STREAMS = st.one_of(
    st.binary(max_size=200),
    st.lists(frames(), min_size=1, max_size=3).map(b"".join),
    frames().flatmap(lambda f: st.integers(0, len(f)).map(lambda n: f[:n])),  # truncated
)


@given(data=_STREAMS, chunk=st.integers(1, 64))
def test_the_codec_decodes_or_refuses_any_bytes(data, chunk):
    decoder = FrameDecoder()
    started = time.monotonic()
    try:
        for i in range(0, len(data), chunk):
            for command in decoder.feed(data[i : i + chunk]):
                assert isinstance(command, RemotingCommand)
                encode(command)  # what was decoded can be answered
    except RemotingProtocolError:
        pass
    assert time.monotonic() - started < 5


# -- into broker_stub ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def stubs():
    thread = ProxyThread(brokers=1, topics=(TOPIC,)).start()
    yield thread
    thread.stop()


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _healthy_send(thread: ProxyThread, address: str) -> None:
    async def send() -> None:
        client = BrokerClient("broker-a", address)
        try:
            await client.send(TOPIC, b"still serving")
        finally:
            await client.close()

    thread.run(send(), timeout=10)


def _answered_or_closed(address: str, data: bytes) -> None:
    """Send ``data`` on a new connection to ``address``: the server answers or closes it
    within 5 s, never stays silent."""
    with socket.create_connection(_host_port(address), timeout=5) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if not sock.recv(65536):
                    return
            except (ConnectionResetError, TimeoutError):
                return
        raise AssertionError(f"{address} neither answered nor closed")


@given(data=_STREAMS)
def test_broker_stub_survives_any_bytes_on_a_connection(stubs, data):
    address = stubs.cluster.brokers[0].address
    _answered_or_closed(address, data)
    _healthy_send(stubs, address)


# -- into the proxy's remoting port --------------------------------------------------------


@pytest.fixture(scope="module")
def remoting_port():
    """The port, and a port of its own for the one broker (``broker-a``)."""
    options = {"remoting_port": 0, "remoting_broker_ports": {"broker-a": 0}}
    thread = ProxyThread(brokers=1, topics=(TOPIC,), options=options).start()
    yield thread
    thread.stop()


def _port_address(thread: ProxyThread, broker_port: bool = False) -> str:
    port = thread.app.remoting_broker_ports["broker-a"] if broker_port else thread.app.remoting_port
    return f"127.0.0.1:{port}"


def _healthy_port_send(thread: ProxyThread) -> None:
    """A send through the port still lands on the broker."""

    async def send() -> None:
        client = RemotingClient(_port_address(thread))
        try:
            fields = {"a": "PG", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0",
                      "g": str(now_ms()), "h": "0", "i": "", "j": "0", "k": "false",
                      "m": "false", "n": thread.cluster.brokers[0].name}  # fmt: skip
            request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, fields, b"still serving")
            answer = await client.invoke(request, 5)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        finally:
            await client.close()

    thread.run(send(), timeout=10)


@given(data=_STREAMS, broker_port=st.booleans())
def test_the_remoting_port_survives_any_bytes_on_a_connection(remoting_port, data, broker_port):
    _answered_or_closed(_port_address(remoting_port, broker_port), data)
    _healthy_port_send(remoting_port)


_PORT_CODES = st.one_of(
    st.sampled_from([int(c) for c in RequestCode]), st.integers(-(2**15), 2**31 - 1)
)
_FIELD_TEXT = st.text(max_size=12)


@settings(max_examples=max(10, settings().max_examples // 3))
@given(
    code=_PORT_CODES,
    fields=st.dictionaries(
        st.sampled_from(["bname", "n", "topic", "b", "i", "properties", "suspendTimeoutMillis",
                         "pollTime", "consumerGroup", "queueId"]) | _FIELD_TEXT,
        _FIELD_TEXT | st.sampled_from(["broker-a", "-1", "99999999999", "0"]),
        max_size=6,
    ),
    body=st.binary(max_size=80) | st.sampled_from([b'{"mqSet":[]}', b'{"mqSet":[{}]}', b"{}"]),
    broker_port=st.booleans(),
)  # fmt: skip
def test_any_request_on_the_remoting_port_is_answered_in_time(
    remoting_port, code, fields, body, broker_port
):
    """A request of any code, with any fields and body, on the shared port or a broker's
    own, gets an answer (a broker's, or the port's error) within its deadline, and the
    port serves on."""
    # A long poll the request asks for is bounded to keep the example short.
    for name in ("suspendTimeoutMillis", "pollTime"):
        if name in fields:
            fields[name] = "100"

    async def ask() -> RemotingCommand:
        client = RemotingClient(_port_address(remoting_port, broker_port))
        try:
            return await client.invoke(RemotingCommand(code, fields, body), 15)
        finally:
            await client.close()

    answer = remoting_port.run(ask(), timeout=20)
    assert answer.is_response
    _healthy_port_send(remoting_port)


# -- out of a hostile broker --------------------------------------------------------------

MISCHIEF = (
    "garbage",
    "oversized",
    "truncated",
    "late",
    "duplicate",
    "mismatch",
    "code",
    "fields",
    "body",
    "close",
    "drop",
    "pass",
)


class HostileBroker:
    """A man in the middle: requests go to ``upstream`` unchanged, each response suffers a
    mischief drawn from ``weights`` (``pass``: none)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.weights = {"pass": 1.0}
        self.rng = random.Random(0)
        self.late_s = 4.0
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.address

    async def stop(self) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(self, reader, writer) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection's handler runs as a task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        up_reader, up_writer = await asyncio.open_connection(*_host_port(self.upstream))

        async def forward() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
            up_writer.close()

        self._spawn(forward())
        decoder = FrameDecoder()
        try:
            while data := await up_reader.read(65536):
                for cmd in decoder.feed(data):
                    self._answer(cmd, writer)
        finally:
            writer.close()

    def _answer(self, cmd: RemotingCommand, writer) -> None:
        kinds, weights = zip(*self.weights.items(), strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        frame = encode(cmd)
        if kind == "garbage":
            frame = self.rng.randbytes(self.rng.randint(1, 40))
        elif kind == "oversized":
            frame = struct.pack(">i", 2**31 - 1) + frame[4:]
        elif kind == "truncated":
            frame = frame[: self.rng.randint(0, len(frame) - 1)]
        elif kind == "duplicate":
            frame = frame + frame
        elif kind == "mismatch":
            cmd.opaque += self.rng.choice([1, -1, 10_000])
            frame = encode(cmd)
        elif kind == "code":
            cmd.code = self.rng.choice([1, 2, 3, 14, 25, 206, 209, 210, 9999, -1])
            frame = encode(cmd)
        elif kind == "fields":
            fields = cmd.fields
            for key in list(fields):
                fields[key] = self.rng.choice(["", "x", "-1", "99999999999999999999", "1;2"])
            if fields and self.rng.random() < 0.5:
                fields.pop(self.rng.choice(list(fields)))
            frame = encode(cmd)
        elif kind == "body":
            body = bytearray(cmd.body or b"\0")
            for _ in range(self.rng.randint(1, 8)):
                body[self.rng.randrange(len(body))] = self.rng.randrange(256)
            cmd.body = bytes(body[: self.rng.randint(0, len(body))])
            frame = encode(cmd)
        elif kind == "late":
            self._spawn(self._later(frame, writer))
            return
        elif kind == "close":
            writer.close()
            return
        elif kind == "drop":
            return
        if not writer.is_closing():
            writer.write(frame)

    async def _later(self, frame: bytes, writer) -> None:
        await asyncio.sleep(self.late_s)  # the hostile broker's late answer: the subject
        if not writer.is_closing():
            writer.write(frame)


async def _register(namesrv: str, name: str, address: str, topics: list[dict]) -> None:
    body = orjson.dumps(
        {
            "filterServerList": [],
            "topicConfigSerializeWrapper": {
                "dataVersion": {"counter": 1, "stateVersion": 0, "timestamp": now_ms()},
                "topicConfigTable": {t["topicName"]: t for t in topics},
            },
        }
    )
    header = RegisterBrokerHeader(
        broker_name=name,
        broker_addr=address,
        cluster_name="DefaultCluster",
        ha_server_addr=address,
        broker_id=0,
        heartbeat_timeout_millis=600_000,
        body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
    )
    client = RemotingClient(namesrv)
    try:
        response = await client.invoke(
            RemotingCommand(RequestCode.REGISTER_BROKER, header.encode(), body), 5
        )
        assert response.code == ResponseCode.SUCCESS, response
    finally:
        await client.close()


@dataclass
class Hostile:
    """The proxy (on its thread), the hostile broker in front of broker-h, and a client."""

    thread: ProxyThread
    mitm: HostileBroker
    stub: service_pb2_grpc.MessagingServiceStub


@pytest.fixture(scope="module")
def hostile():
    thread = ProxyThread(brokers=1, topics=(TOPIC,), broker_timeout_s=1.0).start()

    async def setup() -> HostileBroker:
        broker = thread.cluster.brokers[0]
        mitm = HostileBroker(broker.address)
        await mitm.start()
        topics = [t.to_json() for t in broker.topics.all() if t.name == TOPIC]
        await _register(thread.cluster.namesrv_address, "broker-h", mitm.address, topics)
        return mitm

    mitm = thread.run(setup())
    channel = grpc.insecure_channel(thread.endpoint)
    yield Hostile(thread, mitm, service_pb2_grpc.MessagingServiceStub(channel))
    channel.close()
    thread.run(mitm.stop())
    thread.stop()


def _to_hostile(request):
    """The base send, aimed at a queue of broker-h (QueryRoute interleaves a0 h0 a1 h1)."""
    out = type(request)()
    out.CopyFrom(request)
    for message in out.messages:
        message.system_properties.queue_id = 1
    return out


METADATA = (("x-mq-client-id", "fuzz-hostile"),)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=max(8, settings().max_examples // 6))
@given(
    weights=st.dictionaries(st.sampled_from(MISCHIEF), st.floats(0.1, 1.0), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_a_hostile_broker_gets_clients_errors_not_failures(hostile, weights, seed):
    mitm = hostile.mitm
    mitm.weights, mitm.rng = weights, random.Random(seed)
    stub = hostile.stub
    for _ in range(2):
        call_unary(stub, "SendMessage", _to_hostile(_BASES["SendMessage"]), METADATA)
        receive = api.ReceiveMessageRequest.FromString(_BASES["ReceiveMessage"].SerializeToString())
        receive.message_queue.broker.name = "broker-h"
        answers = call_stream(stub, "ReceiveMessage", receive, METADATA)
        messages = [a.message for a in answers if a.WhichOneof("content") == "message"]
        if messages:
            ack = call_unary(stub, "AckMessage", _ack_of(messages), METADATA)
            assert ack.status.code in CODES


def _ack_of(messages):
    return api.AckMessageRequest(
        group=pb.Resource(name=GROUP),
        topic=pb.Resource(name=TOPIC),
        entries=[
            api.AckMessageEntry(
                message_id=m.system_properties.message_id,
                receipt_handle=m.system_properties.receipt_handle,
            )
            for m in messages
        ],
    )


def test_after_the_hostile_broker_behaves_the_proxy_serves_through_it(hostile):
    hostile.mitm.weights = {"pass": 1.0}
    statuses: list = []

    def sent() -> bool:
        request = _to_hostile(_BASES["SendMessage"])
        statuses[:] = [call_unary(hostile.stub, "SendMessage", request, METADATA).status]
        return statuses[0].code == pb.Code.OK

    # A connection in back-off after a close comes back within seconds.
    wait_for(sent, timeout=20, step=0.5, what=lambda: f"a send served ({statuses[0]})")
