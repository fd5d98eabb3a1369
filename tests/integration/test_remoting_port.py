"""The remoting port on broker stubs, driven by our own remoting client as a 4.x client
would drive it: routes, where requests go, errors, what brokers ask of a client, and the
drain. The official Java client runs through it in tests/interop/test_remoting_clients.py."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from proxy import descriptors
from proxy.descriptors import DescriptorBudget
from proxy.remoting.client import RemotingClient, RemotingError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import SendMessageHeader, now_ms
from proxy.remoting.message import Prop, encode_properties
from proxy.remoting.popinfo import PopCheckpointInfo, batch_ack_body
from proxy.remoting_port.port import GO_AWAY_MIN_VERSION
from proxy.security.config import SecurityConfig, TlsMode
from proxy.security.signing import RemotingSigner, remoting_signature
from testkit.event_log import part_files, read_records
from testkit.metrics_text import total
from testkit.waits import wait_until
from tests.support.remoting import pop_fields

TIMEOUT_S = 5.0


@pytest.fixture
async def port(start_proxy):
    """A proxy on two broker stubs, its remoting port on; a client of the port."""
    proxy = await start_proxy(brokers=2, topics=("T",), proxy_options={"remoting_port": 0})
    clients: list[RemotingClient] = []

    def connect(**options) -> RemotingClient:
        client = RemotingClient(f"127.0.0.1:{proxy.remoting_port}", **options)
        clients.append(client)
        return client

    yield proxy, connect
    for client in clients:
        await client.close()


def send_v2(topic: str, broker: str | None, body: bytes, **properties: str) -> RemotingCommand:
    header = SendMessageHeader(
        producer_group="PG", topic=topic, queue_id=0,
        properties=encode_properties({Prop.UNIQ_KEY: body.hex(), **properties}),
    )  # fmt: skip
    fields = header.encode_v2()
    if broker is not None:
        fields["n"] = broker
    else:
        fields.pop("n", None)
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, fields, body)


def stored_port(answer: RemotingCommand) -> int:
    """The broker port in a send answer's offset message id (ip, port, offset)."""
    return int(answer.fields["msgId"][8:16], 16)


async def test_a_route_names_the_port_for_every_broker(port):
    proxy, connect = port
    client = connect()
    answer = await client.invoke(
        RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), TIMEOUT_S
    )
    assert answer.code == ResponseCode.SUCCESS
    route = orjson.loads(answer.body)  # standard JSON, whatever the name server wrote
    names = sorted(b.name for b in proxy.cluster.brokers)
    assert sorted(b["brokerName"] for b in route["brokerDatas"]) == names
    for broker in route["brokerDatas"]:
        assert broker["brokerAddrs"] == {"0": f"127.0.0.1:{proxy.remoting_port}"}
    assert sorted(q["brokerName"] for q in route["queueDatas"]) == names


async def test_a_send_goes_to_the_broker_it_names(port):
    proxy, connect = port
    client = connect()
    for broker in proxy.cluster.brokers:
        answer = await client.invoke(send_v2("T", broker.name, b"hello"), TIMEOUT_S)
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert stored_port(answer) == int(broker.address.rpartition(":")[2])


async def test_requests_the_port_cannot_route_get_the_apache_proxys_errors(port):
    _, connect = port
    client = connect()
    unnamed = await client.invoke(send_v2("T", None, b"x"), TIMEOUT_S)
    assert (unnamed.code, unnamed.remark) == (
        ResponseCode.VERSION_NOT_SUPPORTED,
        "Request doesn't have field bname",
    )
    unknown = await client.invoke(RemotingCommand(12345, {"bname": "broker-0"}), TIMEOUT_S)
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert unknown.remark == " request type 12345 not supported"
    # An admin request is not relayed either, whatever broker it names.
    admin = RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "X", "bname": "b"})
    refused = await client.invoke(admin, TIMEOUT_S)
    assert refused.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    gone = await client.invoke(send_v2("T", "no-such-broker", b"x"), TIMEOUT_S)
    assert gone.code == ResponseCode.SYSTEM_ERROR and "no-such-broker" in (gone.remark or "")


async def test_a_heartbeat_reaches_every_broker_on_the_clients_own_connection(port):
    proxy, connect = port
    producers = [connect(), connect()]
    for n, producer in enumerate(producers):
        heartbeat = {"clientID": f"p-{n}", "producerDataSet": [{"groupName": "PG"}]}
        answer = await producer.invoke(
            RemotingCommand(RequestCode.HEART_BEAT, {}, orjson.dumps(heartbeat)), TIMEOUT_S
        )
        assert answer.code == ResponseCode.SUCCESS
    # Each broker knows the group on two connections: one per client, as without a proxy
    # (a broker's transaction check goes to one connection of the group).
    for broker in proxy.cluster.brokers:
        connections = broker.transactions.producers["PG"]
        assert len([c for c in connections if not c.closed]) == 2, broker.name


async def test_a_port_per_broker_serves_clients_whose_requests_name_none(start_proxy):
    """With ``remoting_broker_ports`` routes name each broker at its own port, and what
    comes in on a broker's port goes to that broker, a heartbeat included: a client that
    tells brokers apart by address (the C++ client) sees one address per broker. A
    broker's advertised address, when given, is what routes name for it (a balancer's)."""
    brokers = ("broker-a", "broker-b")
    options = {
        "remoting_port": 0,
        "remoting_broker_ports": dict.fromkeys(brokers, 0),
        "remoting_broker_advertise_addresses": {"broker-b": "lb.example:18092"},
    }
    proxy = await start_proxy(brokers=2, topics=("T",), proxy_options=options)
    ports = proxy.remoting_broker_ports
    assert sorted(ports) == list(brokers) and proxy.remoting_port not in ports.values()
    clients = {name: RemotingClient(f"127.0.0.1:{ports[name]}") for name in brokers}
    shared = RemotingClient(f"127.0.0.1:{proxy.remoting_port}")
    try:
        answer = await shared.invoke(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), TIMEOUT_S
        )
        named = {
            b["brokerName"]: b["brokerAddrs"] for b in orjson.loads(answer.body)["brokerDatas"]
        }
        assert named == {
            "broker-a": {"0": f"127.0.0.1:{ports['broker-a']}"},
            "broker-b": {"0": "lb.example:18092"},
        }
        by_name = {b.name: b for b in proxy.cluster.brokers}
        for name, client in clients.items():
            sent = await client.invoke(send_v2("T", None, name.encode()), TIMEOUT_S)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
            assert stored_port(sent) == int(by_name[name].address.rpartition(":")[2])
        # A request that names its broker goes there, whichever port it came in on.
        crossed = await clients["broker-a"].invoke(send_v2("T", "broker-b", b"x"), TIMEOUT_S)
        assert stored_port(crossed) == int(by_name["broker-b"].address.rpartition(":")[2])
        heartbeat = {"clientID": "cpp", "producerDataSet": [{"groupName": "PG"}]}
        beat = RemotingCommand(RequestCode.HEART_BEAT, {}, orjson.dumps(heartbeat))
        assert (await clients["broker-a"].invoke(beat, TIMEOUT_S)).code == ResponseCode.SUCCESS
        assert len(by_name["broker-a"].transactions.producers["PG"]) == 1
        assert "PG" not in by_name["broker-b"].transactions.producers
    finally:
        for client in (shared, *clients.values()):
            await client.close()


async def test_a_brokers_transaction_check_reaches_the_producers_connection(port):
    proxy, connect = port
    checks: asyncio.Queue[RemotingCommand] = asyncio.Queue(maxsize=16)

    def on_request(cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            checks.put_nowait(cmd)

    producer = connect(server_handler=on_request)
    heartbeat = {"clientID": "p-1", "producerDataSet": [{"groupName": "PG"}]}
    await producer.invoke(
        RemotingCommand(RequestCode.HEART_BEAT, {}, orjson.dumps(heartbeat)), TIMEOUT_S
    )
    broker = proxy.cluster.brokers[1]
    half = send_v2("T", broker.name, b"open", **{Prop.TRANSACTION_PREPARED: "true", "PGROUP": "PG"})
    half.fields["f"] = "4"  # TRANSACTION_PREPARED_TYPE
    answer = await producer.invoke(half, TIMEOUT_S)
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    # Left open past the stub's transaction timeout (3 s): the broker checks with the
    # producer, on the connection the proxy opened for this client.
    check = await asyncio.wait_for(checks.get(), 15)
    assert check.body  # the half message itself
    assert check.fields["msgId"] == b"open".hex()  # its unique key


async def test_a_draining_port_tells_new_clients_to_go_away(port):
    proxy, connect = port
    client = connect()
    ok = await client.invoke(send_v2("T", proxy.cluster.brokers[0].name, b"a"), TIMEOUT_S)
    assert ok.code == ResponseCode.SUCCESS
    proxy.remoting.draining = True  # what the stop's first step sets
    late = send_v2("T", proxy.cluster.brokers[0].name, b"b")
    late.version = GO_AWAY_MIN_VERSION
    away = await client.invoke(late, TIMEOUT_S)
    assert (away.code, away.remark) == (ResponseCode.GO_AWAY, "please go away")
    # A client too old to understand GO_AWAY is still served until the port closes.
    old = send_v2("T", proxy.cluster.brokers[0].name, b"c")
    old.version = GO_AWAY_MIN_VERSION - 1
    served = await client.invoke(old, TIMEOUT_S)
    assert served.code == ResponseCode.SUCCESS


async def test_a_draining_port_tells_a_parked_consumer_to_go_away(port):
    """A consumer that only polls sends nothing while its poll is parked: the drain answers
    the poll itself, GO_AWAY, before the port closes (a poll of an older client is cut
    when the port closes, as before)."""
    proxy, connect = port
    client = connect()
    broker = proxy.cluster.brokers[0].name
    fields = {"consumerGroup": "G", "topic": "T", "queueId": "-1", "pollTime": "20000",
              "bornTime": str(now_ms()), "bname": broker}  # fmt: skip
    poll = RemotingCommand(RequestCode.NOTIFICATION, fields)
    poll.version = GO_AWAY_MIN_VERSION
    parked = asyncio.ensure_future(client.invoke(poll, 30.0))
    await wait_until(lambda: proxy.remoting._cuttable == 1, 5.0)
    await asyncio.wait_for(proxy.remoting.close(), 10.0)
    answer = await asyncio.wait_for(parked, 5.0)
    assert (answer.code, answer.remark) == (ResponseCode.GO_AWAY, "please go away")


async def test_a_torn_frame_closes_its_connection_only(port):
    proxy, connect = port
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.remoting_port)
    writer.write((2**31 - 1).to_bytes(4, "big") + b"\x00\x00\x00\x10{")  # a huge length
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), TIMEOUT_S) == b""  # closed by the port
    writer.close()
    client = connect()
    answer = await client.invoke(send_v2("T", proxy.cluster.brokers[0].name, b"ok"), TIMEOUT_S)
    assert answer.code == ResponseCode.SUCCESS


MALFORMED_LOCKS = {
    "nested too deep": b"[" * 100_000,
    "an object nested too deep": b'{"mqSet":' * 100_000,
    "a key object with keys of two types": b'{{1:2,"a":3}:4}',
    "the queues an object": b'{"mqSet":{"a":1}}',
    "the queues a number": b'{"mqSet":7}',
    "a queue without its broker's name a string": b'{"mqSet":[{"brokerName":1}]}',
}


async def test_a_queue_lock_whose_body_does_not_parse_is_answered_without_a_traceback(port, caplog):
    # Parsed before any authentication: each used to fail with a RecursionError, a
    # TypeError or a KeyError, answered SYSTEM_ERROR with a traceback in the log.
    _, connect = port
    client = connect()
    caplog.set_level(logging.WARNING)
    for what, body in MALFORMED_LOCKS.items():
        lock = RemotingCommand(RequestCode.LOCK_BATCH_MQ, {}, body)
        answer = await client.invoke(lock, TIMEOUT_S)
        assert (answer.code, answer.remark) == (
            ResponseCode.VERSION_NOT_SUPPORTED,
            "Request doesn't have field bname",
        ), what
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


async def test_each_request_of_the_port_is_on_the_metrics(port):
    proxy, connect = port
    client = connect()
    broker = proxy.cluster.brokers[0].name
    await client.invoke(send_v2("T", broker, b"counted"), TIMEOUT_S)
    await client.invoke(RemotingCommand(12345, {}), TIMEOUT_S)
    text = proxy.metrics.render()[0]
    count = "rocketmq_proxy_rpc_latency_seconds_count"
    port = {"protocol_type": "remoting_port", "is_long_polling": "false"}
    sent = total(text, count, **port, request_code="send_message_v2", broker=broker)
    assert sent == 1 and total(text, count, **port, response_code="success") == 1
    # The code a client chose is no label: a refusal is counted under its own name.
    refused = total(
        text, count, **port, request_code="not_served", response_code="request_code_not_supported"
    )
    assert refused == 1
    assert "12345" not in text.decode()


def series(text: bytes, prefix: str) -> int:
    return sum(1 for line in text.decode().splitlines() if line.startswith(prefix))


async def test_a_flood_of_refused_and_unknown_names_leaves_metrics_bounded(guarded):
    """10,000 requests a client made up (a broker, a group and a topic of its own each),
    refused by the guard: /metrics gains no series and none of their names, and the port
    serves a real request meanwhile."""
    proxy, connect, _ = guarded
    broker = proxy.cluster.brokers[0].name
    alice, mallory = connect("alice", "alice-secret"), connect()
    first = await alice.invoke(send_v2("orders", broker, b"first"), TIMEOUT_S)
    assert first.code == ResponseCode.SUCCESS, first.remark
    refused = await mallory.invoke(RemotingCommand(RequestCode.POP_MESSAGE, {}), TIMEOUT_S)
    assert refused.code == ResponseCode.NO_PERMISSION
    before = proxy.metrics.render()[0]

    async def flood(first: int) -> None:
        for i in range(first, first + 2_500):
            fields = pop_fields(f"g-{i}", f"t-{i}", bname=f"b-{i}")
            client = alice if i % 2 else mallory  # forbidden, and unsigned
            answer = await client.invoke(
                RemotingCommand(RequestCode.POP_MESSAGE, fields), TIMEOUT_S
            )
            assert answer.code == ResponseCode.NO_PERMISSION, answer.remark

    flooding = asyncio.gather(*(flood(n * 2_500) for n in range(4)))
    sent = await alice.invoke(send_v2("orders", broker, b"served"), TIMEOUT_S)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    await flooding
    after = proxy.metrics.render()[0]
    assert b"g-1" not in after and b"b-1" not in after and b"t-1" not in after
    # Every label set the flood and the send make was there after one of each.
    for family in ("rocketmq_proxy_rpc_latency_seconds_bucket", "rocketmq_proxy_receive_total"):
        assert series(after, family) == series(before, family), family


USERS = """
[[users]]
access_key = "alice"
secret_key = "alice-secret"
publish = ["orders"]
subscribe = [{ group = "billing", topic = "orders" }]
"""


@pytest.fixture
async def guarded(start_proxy, tmp_path):
    """A proxy whose users file guards its remoting port too, signing what it sends on
    to the brokers with credentials of its own."""
    users = tmp_path / "users.toml"
    users.write_text(USERS)
    security = SecurityConfig(
        users_file=str(users), broker_access_key="proxy", broker_secret_key="proxy-secret"
    )
    proxy = await start_proxy(
        brokers=1, topics=("orders", "hidden"), security=security,
        proxy_options={"remoting_port": 0},
    )  # fmt: skip
    seen: list[RemotingCommand] = []
    broker = proxy.cluster.brokers[0]
    processor = broker.server._processor  # what the broker is sent, as it arrives

    def seeing(cmd: RemotingCommand, conn: object):
        seen.append(cmd)
        return processor(cmd, conn)

    broker.server._processor = seeing
    clients: list[RemotingClient] = []

    def connect(access_key: str | None = None, secret_key: str = "") -> RemotingClient:
        hook = RemotingSigner(access_key, secret_key) if access_key else None
        client = RemotingClient(f"127.0.0.1:{proxy.remoting_port}", request_hook=hook)
        clients.append(client)
        return client

    yield proxy, connect, seen
    for client in clients:
        await client.close()


async def test_the_port_takes_only_what_a_user_may_do_and_signs_as_the_proxy(guarded):
    proxy, connect, seen = guarded
    broker = proxy.cluster.brokers[0].name
    alice = connect("alice", "alice-secret")
    sent = await alice.invoke(send_v2("orders", broker, b"ok"), TIMEOUT_S)
    assert sent.code == ResponseCode.SUCCESS, sent.remark
    # The broker got it signed by the proxy, not by alice.
    [send] = [c for c in seen if c.code == RequestCode.SEND_MESSAGE_V2]
    assert send.fields["AccessKey"] == "proxy"
    assert send.fields["Signature"] == remoting_signature(send.fields, send.body, "proxy-secret")

    forbidden = await alice.invoke(send_v2("hidden", broker, b"no"), TIMEOUT_S)
    assert forbidden.code == ResponseCode.NO_PERMISSION
    assert forbidden.remark == "user 'alice' may not publish to 'hidden'"
    for client in (connect(), connect("alice", "wrong"), connect("mallory", "x")):
        refused = await client.invoke(send_v2("orders", broker, b"no"), TIMEOUT_S)
        assert refused.code == ResponseCode.NO_PERMISSION, refused.remark
    assert [c for c in seen if c.code == RequestCode.SEND_MESSAGE_V2] == [send]
    text = proxy.metrics.render()[0]
    denied = "rocketmq_proxy_auth_denied_total"
    assert total(text, denied, rpc="send_message_v2", reason="forbidden") == 1
    assert total(text, denied, rpc="send_message_v2", reason="missing") == 1
    assert total(text, denied, rpc="send_message_v2", reason="bad_signature") == 1
    assert total(text, denied, rpc="send_message_v2", reason="unknown_user") == 1


async def test_a_guarded_consumer_may_use_its_own_retry_topic_only(guarded):
    _, connect, _ = guarded
    alice = connect("alice", "alice-secret")

    async def heartbeat(group: str, topic: str) -> RemotingCommand:
        body = {"clientID": "c", "consumerDataSet": [
            {"groupName": group, "subscriptionDataSet": [{"topic": topic, "subString": "*"}]}
        ]}  # fmt: skip
        request = RemotingCommand(RequestCode.HEART_BEAT, {}, orjson.dumps(body))
        return await alice.invoke(request, TIMEOUT_S)

    assert (await heartbeat("billing", "orders")).code == ResponseCode.SUCCESS
    assert (await heartbeat("billing", "%RETRY%billing")).code == ResponseCode.SUCCESS
    other = await heartbeat("billing", "%RETRY%shipping")
    assert other.code == ResponseCode.NO_PERMISSION
    assert (await heartbeat("shipping", "orders")).code == ResponseCode.NO_PERMISSION


async def test_each_pop_of_the_port_is_a_receive_record(start_proxy, tmp_path):
    """A pop through the port is counted and logged as a receive of mode ``remoting``."""
    events = tmp_path / "events"
    proxy = await start_proxy(
        brokers=1, topics=("T",), event_log_dir=str(events), proxy_options={"remoting_port": 0}
    )
    broker = proxy.cluster.brokers[0].name
    client = RemotingClient(f"127.0.0.1:{proxy.remoting_port}")
    try:
        assert (await client.invoke(send_v2("T", broker, b"one"), TIMEOUT_S)).code == 0
        for _ in range(2):  # the message, then nothing (held 200 ms)
            pop = RemotingCommand(
                RequestCode.POP_MESSAGE, {**pop_fields("G", "T", pollTime=200), "bname": broker}
            )
            await client.invoke(pop, TIMEOUT_S)
    finally:
        await client.close()
    text = proxy.metrics.render()[0]
    receives = {"mode": "remoting", "group": "G", "topic": "T", "is_long_polling": "true"}
    assert total(text, "rocketmq_proxy_receive_total", **receives, result="found") == 1
    assert total(text, "rocketmq_proxy_receive_total", **receives, result="empty") == 1
    await proxy.stop()  # publishes the event log's file
    records = read_records(part_files(events))
    assert [(r["mode"], r["result"], r["messages"], r["broker"]) for r in records] == [
        ("remoting", "found", 1, broker),
        ("remoting", "empty", 0, None),
    ]
    assert all(r["polling_ms"] == 200 and r["pops"] == 1 for r in records)


async def test_a_guarded_batch_ack_is_checked_by_the_keys_the_broker_reads(guarded):
    """A client writes a batch ack's group and topic under the short keys; a broker reads
    the long ones too, the last written winning (tests/interop/test_remoting_bodies.py
    holds the guard to the broker's own reading)."""
    proxy, connect, seen = guarded
    broker = proxy.cluster.brokers[0].name
    alice = connect("alice", "alice-secret")
    checkpoint = PopCheckpointInfo(0, now_ms(), 30_000, 0, 0, broker, 0, 0)

    async def batch_ack(body: bytes) -> RemotingCommand:
        request = RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, {"bname": broker}, body)
        return await alice.invoke(request, TIMEOUT_S)

    own = await batch_ack(batch_ack_body(broker, "billing", "orders", [checkpoint]))
    assert own.code != ResponseCode.NO_PERMISSION, own.remark
    entry = {"consumerGroup": "billing", "c": "shipping", "t": "orders",
             "q": 0, "so": 0, "pt": 0, "it": 30_000, "b": "AQ=="}  # fmt: skip
    crafted = await batch_ack(orjson.dumps({"brokerName": broker, "acks": [entry]}))
    assert crafted.code == ResponseCode.NO_PERMISSION
    assert crafted.remark == "user 'alice' may not subscribe to 'orders' as group 'shipping'"
    unnamed = await batch_ack(orjson.dumps({"acks": [{"c": ["billing"], "t": "orders"}]}))
    assert unnamed.code == ResponseCode.NO_PERMISSION
    acks = [c for c in seen if c.code == RequestCode.BATCH_ACK_MESSAGE]
    assert len(acks) == 1  # only the client's own reached the broker
    end = RemotingCommand(
        RequestCode.END_TRANSACTION,
        {"bname": broker, "producerGroup": "orders", "tranStateTableOffset": "0",
         "commitLogOffset": "0", "commitOrRollback": "8", "fromTransactionCheck": "false",
         "msgId": "m"},
    )  # fmt: skip
    refused = await alice.invoke(end, TIMEOUT_S)
    assert refused.code == ResponseCode.NO_PERMISSION
    assert refused.remark == "END_TRANSACTION names no topic"


async def test_the_remoting_port_holds_its_clients_within_the_process_budget(
    start_proxy, monkeypatch
):
    """Clients of a port they reach directly (TLS off) hold a descriptor of the process's
    open-files budget each, and so does each of their connections to a broker: past it a
    client is closed at once (or its request refused), and what a client held comes back
    when it leaves."""
    budget = DescriptorBudget(4)
    monkeypatch.setattr(descriptors, "_process", budget)
    proxy = await start_proxy(
        brokers=1, topics=("T",), security=SecurityConfig(tls_mode=TlsMode.DISABLED),
        proxy_options={"remoting_port": 0},
    )  # fmt: skip
    broker = proxy.cluster.brokers[0].name
    address = f"127.0.0.1:{proxy.remoting_port}"
    first = RemotingClient(address)
    second = RemotingClient(address)
    try:
        sent = await first.invoke(send_v2("T", broker, b"one"), TIMEOUT_S)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        assert budget.held == 2  # its socket, its broker connection
        sent = await second.invoke(send_v2("T", broker, b"two"), TIMEOUT_S)
        assert sent.code == ResponseCode.SUCCESS, sent.remark
        assert budget.held == 4
        third = RemotingClient(address)
        with pytest.raises(RemotingError):  # no descriptor left: closed at once
            await third.invoke(send_v2("T", broker, b"three"), TIMEOUT_S)
        await third.close()
        assert budget.refused >= 1
        await first.close()
        await wait_until(lambda: budget.held == 2, 5.0)
    finally:
        await first.close()
        await second.close()


async def test_requests_at_once_to_a_fresh_port_all_find_their_broker(port):
    """A consumer a drain moved to a proxy that has just started sends its pulls at once,
    each naming its broker: those that arrive while the port asks the name server for the
    cluster's brokers wait for its answer, rather than hear "not known to the proxy"."""
    proxy, connect = port
    client = connect()
    brokers = [b.name for b in proxy.cluster.brokers]
    sends = [send_v2("T", brokers[i % 2], f"m-{i}".encode()) for i in range(8)]
    answers = await asyncio.gather(*(client.invoke(s, TIMEOUT_S) for s in sends))
    assert [(a.code, a.remark) for a in answers] == [(ResponseCode.SUCCESS, None)] * 8
