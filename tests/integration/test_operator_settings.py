"""What an operator who replaces the Apache proxy brings along, through both proxies on the
same real RocketMQ 5.5.0 brokers, with the same assertions: SQL92 subscriptions (the cases
of Apache's end-to-end SqlFilterTest and SqlFilterWithOrderMsgTest, in our words), a
group's retry policy in its consumers' settings and at its dead-letter cut, consumers of
%DLQ% and %RETRY% topics, and trace contexts (docs/api.md, "What an operator configures").

Each test runs once through ours (``notify``) and once through the Apache proxy 5.5.0
(the session's ``apache_proxy``); the clients are the lean SettingsClient, which opens its
Telemetry settings before it receives as the official clients do.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import grpc
import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.security.config import SecurityConfig
from rocketmq_local import admin
from testkit.balancer import Balancer
from testkit.lean_client import SettingsClient, consumer_settings
from testkit.official.harness import run_client
from tests.support.raw_connection import first_answer

pytestmark = pytest.mark.real

Code = pb.Code
SQL = pb.FilterType.SQL
_ids = itertools.count()


class Peer:
    """One proxy in front of the session's real cluster, and what a test makes on it."""

    def __init__(self, name: str, endpoint: str, cluster, min_poll_ms: int) -> None:
        self.name = name
        self.endpoint = endpoint
        self.cluster = cluster
        self.min_poll_ms = min_poll_ms
        self.clients: list[SettingsClient] = []

    def unique(self, prefix: str) -> str:
        return f"{prefix}{self.name}{next(_ids)}x{int(time.time() * 1000) % 10**8}"

    def client(self) -> SettingsClient:
        client = SettingsClient(self.endpoint, f"operator-{self.name}-{next(_ids)}")
        self.clients.append(client)
        return client

    async def topic(self, prefix: str = "T", *, message_type: str | None = None) -> str:
        name = self.unique(prefix)
        await self.create_topic(name, message_type=message_type)
        return name

    async def create_topic(self, name: str, *, message_type: str | None = None) -> None:
        await asyncio.to_thread(
            admin.create_topic, self.cluster.namesrv_address, name, message_type=message_type,
            brokers=self._brokers(),
        )  # fmt: skip

    async def group(self, prefix: str = "G", **config) -> str:
        name = self.unique(prefix)
        await asyncio.to_thread(
            admin.create_group, self.cluster.namesrv_address, name, brokers=self._brokers(),
            **config,
        )  # fmt: skip
        return name

    def _brokers(self) -> dict[str, str]:
        return {b.name: b.address for b in self.cluster.brokers}

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


@pytest.fixture(params=["ours", "apache"])
async def peer(request, real_cluster, start_proxy):
    if request.param == "apache":
        apache = request.getfixturevalue("apache_proxy")
        peer = Peer("apache", apache.grpc_address, real_cluster, 5000)
    else:
        # With the PROXY protocol on, as the Apache proxy always reads it (a connection
        # without a header is the client itself).
        app = await start_proxy(
            mode="notify", namesrv=real_cluster.namesrv_address,
            security=SecurityConfig(proxy_protocol=True),
        )  # fmt: skip
        rc = app.config.receive
        peer = Peer("ours", f"127.0.0.1:{app.grpc_port}", real_cluster, rc.min_polling_ms)
    try:
        yield peer
    finally:
        await peer.close()


async def send(client: SettingsClient, topic: str, body: bytes, **kw) -> None:
    response = await client.send(topic, body, **kw)
    assert response.status.code == Code.OK, response.status


async def collect(
    peer: Peer,
    client: SettingsClient,
    group: str,
    topic: str,
    want: int,
    *,
    expression: str = "*",
    filter_type: int = pb.FilterType.TAG,
    timeout_s: float = 30.0,
    quiet_polls: int = 2,
) -> list[pb.Message]:
    """Receive (and ack) until ``want`` messages came, then ``quiet_polls`` more polls that
    must bring nothing more (what the filter should leave out must not come late). Each
    poll names the next broker, as the official SimpleConsumer names its queues in turn:
    the Apache proxy polls the broker a request names, else one it picks in turn for all
    the topic's consumers, which can leave a consumer among several on one broker."""
    got: list[pb.Message] = []
    deadline = time.monotonic() + timeout_s
    quiet = 0
    brokers = itertools.cycle(b.name for b in peer.cluster.brokers)
    await client.prepare(group, topic, peer.min_poll_ms)
    while time.monotonic() < deadline and (len(got) < want or quiet < quiet_polls):
        result = await client.receive(
            group, topic, await_ms=peer.min_poll_ms, batch=32, expression=expression,
            filter_type=filter_type, broker=next(brokers),
        )  # fmt: skip
        assert result.status in (Code.OK, Code.MESSAGE_NOT_FOUND), (result.status, result.message)
        if result.messages:
            got += result.messages
            acked = await client.ack(group, topic, result.messages)
            assert acked.status.code == Code.OK, acked.status
        elif len(got) >= want:
            quiet += 1
    return got


# -- SQL92 ----------------------------------------------------------------------------------

# Properties of the messages the SQL cases filter: message i has a = i, s = "x" for odd i
# and "y" for even, and the last one has neither.
_PROPS = [{"a": str(i), "s": "x" if i % 2 else "y"} for i in range(6)] + [{}]

# Expression -> the indices of the messages it matches (the cases of Apache's SqlFilterTest:
# a comparison, a range, a set, a missing property, both properties, everything).
SQL_CASES = {
    "a > 2": {3, 4, 5},
    "a BETWEEN 1 AND 3": {1, 2, 3},
    "s IN ('x')": {1, 3, 5},
    "a IS NULL": {6},
    "s = 'y' AND a < 4": {0, 2},
    "a = 1 OR s = 'y'": {0, 1, 2, 4},
    "TRUE": set(range(7)),
    "b = 1": set(),
}


async def test_sql92_subscriptions_get_only_what_they_match(peer):
    topic = await peer.topic("Tsql")
    producer = peer.client()
    for i, props in enumerate(_PROPS):
        await send(producer, topic, f"m{i}".encode(), tag=f"t{i % 2}", properties=props)

    async def case(expression: str) -> tuple[str, set[int]]:
        group = await peer.group("Gsql")
        got = await collect(
            peer, peer.client(), group, topic, len(SQL_CASES[expression]),
            expression=expression, filter_type=SQL,
        )  # fmt: skip
        return expression, {int(m.body[1:]) for m in got}

    results = dict(await asyncio.gather(*(case(e) for e in SQL_CASES)))
    assert results == SQL_CASES


async def test_sql92_on_a_fifo_group_keeps_each_message_groups_order(peer):
    """SqlFilterWithOrderMsgTest: FIFO messages of two message groups, a SQL92 filter that
    keeps about half of them; what comes is in each group's order."""
    topic = await peer.topic("Tfifo", message_type="FIFO")
    group = await peer.group("Gfifo", fifo=True)
    producer = peer.client()
    for i in range(20):
        await send(
            producer, topic, f"m{i}".encode(), message_group=f"g{i % 2}",
            properties={"n": str(i), "keep": "yes" if i % 3 else "no"},
        )  # fmt: skip
    want = [i for i in range(20) if i % 3]
    got = await collect(
        peer, peer.client(), group, topic, len(want), expression="keep = 'yes'",
        filter_type=SQL, timeout_s=60,
    )  # fmt: skip
    numbers = [int(m.body[1:]) for m in got]
    assert sorted(numbers) == want
    for g in (0, 1):
        of_group = [n for n in numbers if n % 2 == g]
        assert of_group == sorted(of_group), f"group g{g} out of order: {numbers}"


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("a = = 1", (Code.INTERNAL_SERVER_ERROR, "parse the consumer's subscription failed")),
        ("", (Code.ILLEGAL_FILTER_EXPRESSION, "Expression can't be null! SQL92")),
    ],
)
async def test_a_bad_sql92_expression_gets_the_apache_proxys_answer(peer, expression, answer):
    topic = await peer.topic("Tbad")
    group = await peer.group("Gbad")
    client = peer.client()
    result = await client.receive(
        group, topic, await_ms=peer.min_poll_ms, expression=expression, filter_type=SQL
    )
    assert (result.status, result.message) == answer
    # ... and the client's next, good poll is served
    await send(client, topic, b"after", properties={"a": "1"})
    got = await collect(peer, client, group, topic, 1, expression="a = 1", filter_type=SQL)
    assert [m.body for m in got] == [b"after"]


async def java(tmp_path, *args: str | int, timeout: float = 120) -> dict:
    """The official Java client 5.2.0 (its driver), in its default configuration: TLS on."""
    home = tmp_path / f"java-{next(_ids)}-{args[0]}"
    return await asyncio.to_thread(run_client, "java", *args, timeout=timeout, home=home)


async def test_the_java_clients_sql92_consumers_get_only_what_they_match(peer, tmp_path):
    """SqlFilterTest's consumers: the official Java SimpleConsumer and PushConsumer, each
    with a SQL92 subscription, get exactly the messages it matches."""
    topic = await peer.topic("Tjsql")
    simple, push = await peer.group("Gjsimple"), await peer.group("Gjpush")
    producer = peer.client()
    for i, props in enumerate(_PROPS):
        await send(producer, topic, f"m{i}".encode(), properties=props)
    common = ("--endpoint", peer.endpoint, "--topic", topic, "--filter", "a BETWEEN 1 AND 3",
              "--filter-type", "SQL92", "--expect", 3)  # fmt: skip
    simple_out, push_out = await asyncio.gather(
        java(tmp_path, "consume", "--group", simple, *common, "--await-seconds", 5,
             "--max-rounds", 12, "--ack"),
        java(tmp_path, "push", "--group", push, *common),
    )  # fmt: skip
    for out in (simple_out, push_out):
        assert not out["errors"], out["errors"]
        assert sorted(m["body"] for m in out["messages"]) == ["m1", "m2", "m3"]


async def test_the_java_clients_namespace_leaves_names_as_they_are(peer, tmp_path):
    """A Java client with a namespace (ClientConfiguration.setNamespace) sends it in every
    request (``x-mq-namespace``, ``resource_namespace``); the Apache proxy 5.5.0 uses the
    names as sent, so its messages are in the plain topic, where any client reads them, and
    its consumer reads that topic. Answers split a topic stored as ``<ns>%<name>``."""
    topic = await peer.topic("Tns")
    out = await java(tmp_path, "produce", "--endpoint", peer.endpoint, "--topic", topic,
                     "--count", 2, "--namespace", "ns1", "--body-prefix", "ns")  # fmt: skip
    assert len(out["ids"]) == 2
    plain = await collect(peer, peer.client(), await peer.group("Gplainns"), topic, 2)
    assert sorted(m.body for m in plain) == [b"ns-0", b"ns-1"]
    assert {m.topic.resource_namespace for m in plain} == {""}
    out = await java(tmp_path, "consume", "--endpoint", peer.endpoint, "--topic", topic,
                     "--group", await peer.group("Gjns"), "--namespace", "ns1", "--expect", 2,
                     "--await-seconds", 5, "--max-rounds", 12, "--ack")  # fmt: skip
    assert not out["errors"], out["errors"]
    assert sorted(m["body"] for m in out["messages"]) == ["ns-0", "ns-1"]

    # A topic a 4.x namespaced client stored as "ns1%<name>": split in the answer.
    stored = f"ns1%{topic}"
    await peer.create_topic(stored)
    client = peer.client()
    client.metadata = (*client.metadata, ("x-mq-namespace", "bad ns!"))  # never validated
    await send(client, stored, b"stored")
    [got] = await collect(peer, client, await peer.group("Gstored"), stored, 1)
    assert (got.topic.name, got.topic.resource_namespace) == (topic, "ns1")
    route = await client.stub.QueryRoute(
        api.QueryRouteRequest(topic=pb.Resource(name=topic, resource_namespace="x")),
        metadata=client.metadata,
    )
    assert route.status.code == Code.OK
    assert {q.topic.resource_namespace for q in route.message_queues} == {"x"}


# -- a group's retry policy -------------------------------------------------------------------


async def settings_answer(peer: Peer, group: str, topic: str) -> pb.Settings:
    """The Settings a SimpleConsumer of ``group`` is answered on its Telemetry stream."""
    client = peer.client()
    settings = consumer_settings(pb.ClientType.SIMPLE_CONSUMER, group, topic, peer.min_poll_ms)
    call = client.stub.Telemetry(metadata=client.metadata)
    try:
        await call.write(api.TelemetryCommand(settings=settings))
        answer = await asyncio.wait_for(call.read(), 15)
    finally:
        call.cancel()
    assert answer.status.code == Code.OK, answer.status
    return answer.settings


async def test_a_groups_retry_policy_is_in_its_consumers_settings(peer):
    topic = await peer.topic("Tpolicy")
    exponential = await peer.group(
        "Gexp",
        retry_max_times=3,
        retry_policy={
            "type": "EXPONENTIAL",
            "exponentialRetryPolicy": {"initial": 2000, "max": 60000, "multiplier": 3},
        },
    )
    customized = await peer.group(
        "Gcus",
        retry_max_times=5,
        retry_policy={"type": "CUSTOMIZED", "customizedRetryPolicy": {"next": [1000, 4000]}},
    )
    plain = await peer.group("Gplain")

    policy = (await settings_answer(peer, exponential, topic)).backoff_policy
    assert policy.max_attempts == 4
    backoff = policy.exponential_backoff
    assert (backoff.initial.ToMilliseconds(), backoff.max.ToMilliseconds()) == (2000, 60000)
    assert backoff.multiplier == 3.0

    policy = (await settings_answer(peer, customized, topic)).backoff_policy
    assert policy.max_attempts == 6
    assert [d.ToMilliseconds() for d in policy.customized_backoff.next] == [1000, 4000]

    policy = (await settings_answer(peer, plain, topic)).backoff_policy
    assert policy.max_attempts == 17
    steps = [d.ToMilliseconds() for d in policy.customized_backoff.next]
    assert (len(steps), steps[0], steps[-1]) == (18, 1000, 7_200_000)


async def test_retry_max_times_one_delivers_twice_then_dead_letters(peer):
    """``mqadmin updateSubGroup -r 1``: a SimpleConsumer that never acks gets the message
    twice; then it is in %DLQ%<group>, where a consumer of that topic reads (and acks) it.
    Sending to a %RETRY% topic is allowed through both. Receiving from one: the Apache
    proxy pops it, and a 5.5.0 broker then cannot revive that message and stops the revive
    queue it is on for good (every later redelivery there), so this suite never does that
    to the shared brokers; ours refuses it (docs/api.md)."""
    topic = await peer.topic("Tdlq")
    group = await peer.group("Gdlq", retry_max_times=1)
    client = peer.client()
    await send(client, topic, b"poison", properties={"k": "v"})
    attempts: list[int] = []
    deadline = time.monotonic() + 90
    dlq = f"%DLQ%{group}"
    reader = peer.client()
    reader_group = await peer.group("Gread")
    dead: list[pb.Message] = []
    await client.prepare(group, topic, peer.min_poll_ms)
    brokers = itertools.cycle(b.name for b in peer.cluster.brokers)
    while not dead and time.monotonic() < deadline:
        result = await client.receive(
            group, topic, await_ms=peer.min_poll_ms, invisible_ms=10_000, batch=32,
            broker=next(brokers),
        )  # fmt: skip
        attempts += [m.system_properties.delivery_attempt for m in result.messages]
        if len(attempts) >= 2:
            # Once the third pop moved it, its topic has a route.
            try:
                got = await reader.receive(
                    reader_group, dlq, await_ms=peer.min_poll_ms, broker=next(brokers)
                )
            except grpc.aio.AioRpcError:
                continue
            dead += got.messages
    assert attempts == [1, 2]
    assert [m.body for m in dead] == [b"poison"]
    assert dict(dead[0].user_properties)["k"] == "v"
    acked = await reader.ack(reader_group, dlq, dead)
    assert acked.status.code == Code.OK, acked.status

    retry_topic = f"%RETRY%{group}"
    await peer.create_topic(retry_topic)
    await send(client, retry_topic, b"again")
    if peer.name == "ours":
        refused = await reader.receive(reader_group, retry_topic, await_ms=peer.min_poll_ms)
        assert refused.status == Code.ILLEGAL_TOPIC, refused.message


# -- trace context --------------------------------------------------------------------------

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_messages_trace_context_reaches_its_consumer(peer):
    topic = await peer.topic("Ttrace")
    group = await peer.group("Gtrace")
    client = peer.client()
    message = pb.Message(
        topic=pb.Resource(name=topic),
        body=b"traced",
        system_properties=pb.SystemProperties(
            message_id=f"TRACE{next(_ids):027d}",
            body_encoding=pb.Encoding.IDENTITY,
            message_type=pb.MessageType.NORMAL,
            trace_context=TRACEPARENT,
        ),
    )
    response = await client.stub.SendMessage(
        api.SendMessageRequest(messages=[message]), metadata=client.metadata
    )
    assert response.status.code == Code.OK, response.status
    [got] = await collect(peer, client, group, topic, 1)
    assert got.system_properties.trace_context == TRACEPARENT
    assert dict(got.user_properties) == {"TRACE_CONTEXT": TRACEPARENT}


# -- client addresses behind a load balancer ------------------------------------------------


def v1_header(client: tuple[str, int]) -> bytes:
    """What the balancer says of each client: the documentation address 203.0.113.7."""
    return f"PROXY TCP4 203.0.113.7 127.0.0.1 {client[1]} 8081\r\n".encode()


async def test_behind_a_balancer_the_born_host_is_the_client_the_header_names(peer):
    """A message whose client names no born host is born at the address the balancer's
    PROXY header gives (``host:port``); one that names its own keeps it."""
    balancer = Balancer([(peer.endpoint, None)], header=v1_header)
    endpoint = await balancer.start()
    try:
        topic = await peer.topic("Tborn")
        behind = SettingsClient(endpoint, f"operator-balanced-{next(_ids)}")
        peer.clients.append(behind)
        await send(behind, topic, b"anonymous")
        named = pb.Message(
            topic=pb.Resource(name=topic),
            body=b"named",
            system_properties=pb.SystemProperties(
                message_id=f"BORN{next(_ids):028d}", body_encoding=pb.Encoding.IDENTITY,
                message_type=pb.MessageType.NORMAL, born_host="app-7",
            ),
        )  # fmt: skip
        response = await behind.stub.SendMessage(
            api.SendMessageRequest(messages=[named]), metadata=behind.metadata
        )
        assert response.status.code == Code.OK, response.status
        got = await collect(peer, peer.client(), await peer.group("Gborn"), topic, 2)
    finally:
        await balancer.close()
    hosts = {m.body: m.system_properties.born_host for m in got}
    assert hosts[b"named"] == "app-7"
    host, _, port = hosts[b"anonymous"].rpartition(":")
    assert host == "203.0.113.7" and port.isdigit(), hosts


async def test_a_malformed_proxy_header_closes_the_connection_unanswered(peer):
    for opening in (b"PROXY TCP4 203.0.113.7 nonsense\r\n", b"PROXY TCP4 " + b"9" * 200):
        assert await first_answer(peer.endpoint, opening) == b""
