"""The gRPC API: happy paths of each RPC the official clients call, and every validation
answered with the status code a client expects, the proxy serving on afterwards."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from testkit.waits import wait_until

Code = pb.Code


@pytest.fixture
async def app(backend):
    """A notify-mode proxy in front of the stubs or the real cluster (``backend``)."""
    return await backend.start(mode="notify")


@pytest.fixture
def T(backend):  # the topic, named as the tests always named it
    return backend.topic


@pytest.fixture
def G(backend):
    return backend.group


async def test_query_route_points_every_queue_at_the_proxy(app, lean, T):
    route = await lean(app).query_route(T)
    assert route.status.code == Code.OK
    assert len(route.message_queues) == 2 * 4  # two brokers, four queues each
    assert {q.broker.name for q in route.message_queues} == {"broker-a", "broker-b"}
    for queue in route.message_queues:
        address = queue.broker.endpoints.addresses[0]
        assert (address.host, address.port) == ("127.0.0.1", app.grpc_port)
        assert queue.broker.endpoints.scheme == pb.AddressScheme.IPv4
        assert queue.permission == pb.Permission.READ_WRITE
        assert pb.MessageType.NORMAL in queue.accept_message_types


async def test_query_route_and_assignment_answer_the_fleet_the_client_dialled(app, lean, T, G):
    """A client given a fleet's endpoints ("p1;p2") gets them back as every queue's
    endpoints, so its one channel fails over between proxies (the Apache proxy answers
    with the request's endpoints as well); without an advertise address set, that is."""
    fleet = pb.Endpoints(
        scheme=pb.AddressScheme.IPv4,
        addresses=[pb.Address(host="127.0.0.1", port=app.grpc_port),
                   pb.Address(host="127.0.0.1", port=1)],
    )  # fmt: skip
    client = lean(app)
    route = await client.stub.QueryRoute(
        api.QueryRouteRequest(topic=pb.Resource(name=T), endpoints=fleet),
        metadata=client.metadata,
    )
    assert route.status.code == Code.OK
    assert route.message_queues
    assert all(q.broker.endpoints == fleet for q in route.message_queues)
    assignment = await client.stub.QueryAssignment(
        api.QueryAssignmentRequest(
            topic=pb.Resource(name=T), group=pb.Resource(name=G), endpoints=fleet
        ),
        metadata=client.metadata,
    )
    assert assignment.status.code == Code.OK
    assert assignment.assignments
    assert all(a.message_queue.broker.endpoints == fleet for a in assignment.assignments)


async def test_sends_take_the_queues_in_turn_and_a_message_group_keeps_one(app, lean, backend, T):
    """The proxy chooses the queue, as the Apache proxy does (the Python client names
    none): plain messages take the writable queues in turn, so 8 sends fill each of the
    two brokers' 4 queues once; every message of a group goes to one queue."""
    client = lean(app)
    brokers = sorted({q.broker.name for q in (await client.query_route(T)).message_queues})
    before = {(b, q): await backend.max_offset(b, T, q) for b in brokers for q in range(4)}
    for i in range(8):
        assert (await client.send(T, b"m%d" % i)).status.code == Code.OK

    async def grown() -> dict[tuple[str, int], int]:
        now = {(b, q): await backend.max_offset(b, T, q) for b, q in before}
        return {key: now[key] - before[key] for key in before if now[key] != before[key]}

    async def sends_counted(total: int) -> bool:
        # A real broker counts a stored message in its queue's offset a moment after the
        # send returns (its dispatch thread).
        return sum((await grown()).values()) >= total

    await wait_until(lambda: sends_counted(8), timeout=10, what="8 sends in the offsets")
    assert await grown() == {key: 1 for key in before}
    for i in range(6):
        sent = await client.send(T, b"g%d" % i, message_group="order-42")
        assert sent.status.code == Code.OK
    await wait_until(lambda: sends_counted(14), timeout=10, what="14 sends in the offsets")
    [(queue, count)] = [(k, n) for k, n in (await grown()).items() if n > 1]
    assert count == 1 + 6, queue


async def test_send_receive_change_ack(app, lean, backend, T, G):
    client = lean(app)
    sent = await client.send(T, b"body-1", tag="tagA", keys=["k1", "k2"], properties={"p": "v"})
    assert sent.status.code == Code.OK and sent.entries[0].status.code == Code.OK
    message_id = sent.entries[0].message_id
    got = await client.receive(G, T, await_ms=1000, expression="tagA || tagB")
    assert got.status == Code.OK and got.stream[0] == "status"
    assert got.stream[-1] == "delivery_timestamp"
    [msg] = got.messages
    system = msg.system_properties
    assert (msg.body, system.tag, list(system.keys)) == (b"body-1", "tagA", ["k1", "k2"])
    assert system.message_id == message_id and msg.user_properties["p"] == "v"
    assert system.body_digest.type == pb.DigestType.MD5 and len(system.body_digest.checksum) == 32
    assert system.delivery_attempt == 1 and system.receipt_handle.count(" ") == 8
    changed = await client.change_invisible(G, T, msg, 20_000)
    assert changed.status.code == Code.OK
    assert changed.receipt_handle and changed.receipt_handle != system.receipt_handle
    msg.system_properties.receipt_handle = changed.receipt_handle
    acked = await client.ack(G, T, [msg])
    assert acked.status.code == Code.OK
    if backend.stub:
        broker = backend.cluster.broker(system.receipt_handle.split(" ")[5])
        assert broker.pop.checkpoint_count == 0


async def test_telemetry_answers_settings_with_status_ok(app, lean, G):
    client = lean(app)
    consumer = pb.Settings(
        client_type=pb.ClientType.SIMPLE_CONSUMER,
        subscription=pb.Subscription(group=pb.Resource(name=G)),
    )
    producer = pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=pb.Publishing())
    call = client.stub.Telemetry(metadata=client.metadata)
    await call.write(api.TelemetryCommand(settings=consumer))
    answer = await call.read()
    assert answer.status.code == Code.OK
    assert answer.settings.subscription.receive_batch_size == 32
    assert answer.settings.backoff_policy.max_attempts == 17
    assert len(answer.settings.backoff_policy.customized_backoff.next) == 18
    await call.write(api.TelemetryCommand(settings=producer))
    answer = await call.read()
    assert answer.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert answer.settings.backoff_policy.max_attempts == 3
    await call.write(api.TelemetryCommand(settings=pb.Settings()))
    answer = await call.read()
    assert answer.status.code == Code.UNRECOGNIZED_CLIENT_TYPE
    await call.done_writing()


async def test_heartbeat_and_termination(app, lean):
    client = lean(app)
    beat = await client.stub.Heartbeat(api.HeartbeatRequest(), metadata=client.metadata)
    bye = await client.stub.NotifyClientTermination(
        api.NotifyClientTerminationRequest(), metadata=client.metadata
    )
    assert beat.status.code == bye.status.code == Code.OK


async def test_forward_to_dead_letter_queue(app, lean, backend, T, G):
    client = lean(app)
    await client.send(T, b"poison")
    [msg] = (await client.receive(G, T, await_ms=1000)).messages
    response = await client.forward_to_dead_letter(G, T, msg, 17)
    assert response.status.code == Code.OK
    broker = msg.system_properties.receipt_handle.split(" ")[5]
    assert await backend.max_offset(broker, f"%DLQ%{G}", 0) == 1
    if backend.stub:
        assert backend.cluster.broker(broker).pop.checkpoint_count == 0


async def test_past_max_attempts_a_message_goes_to_the_dead_letter_queue(backend, lean):
    """A group that allows two attempts (retryMaxTimes 1): the third delivery goes to
    %DLQ%<group>, not the client. The proxy's own default (17) does not apply to it."""
    app = await backend.start(mode="notify")
    group, topic = backend.group, backend.topic
    await backend.create_group(group, retry_max_times=1)
    client = lean(app)
    await backend.send_to("broker-a", b"poison")
    attempts = []
    deadline = asyncio.get_running_loop().time() + 20
    broker = "broker-a"
    while asyncio.get_running_loop().time() < deadline:
        if await backend.max_offset(broker, f"%DLQ%{group}", 0) == 1:
            break
        got = (await client.receive(group, topic, await_ms=1000)).messages
        for msg in got:  # fail the attempt: visible again at once
            attempts.append(msg.system_properties.delivery_attempt)
            assert (await client.change_invisible(group, topic, msg, 0)).status.code == Code.OK
    assert attempts == [1, 2]
    assert await backend.max_offset(broker, f"%DLQ%{group}", 0) == 1


async def test_unsupported_rpcs_say_so(app, lean):
    client = lean(app)
    response = await client.stub.UpdateOffset(api.UpdateOffsetRequest(), metadata=client.metadata)
    assert response.status.code == Code.NOT_IMPLEMENTED
    assert "not supported" in response.status.message


# -- bad input ---------------------------------------------------------------------------


async def receive_status(client, group_, topic_, **kwargs) -> int:
    """The status of one receive of (group_, topic_); ``group=``/``topic=`` override them."""
    kwargs.setdefault("await_ms", 300)
    group, topic = kwargs.pop("group", group_), kwargs.pop("topic", topic_)
    return (await client.receive(group, topic, **kwargs)).status


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"group": "bad group!"}, Code.ILLEGAL_CONSUMER_GROUP),
        ({"group": ""}, Code.ILLEGAL_CONSUMER_GROUP),
        ({"topic": "bad/topic"}, Code.ILLEGAL_TOPIC),
        ({"topic": "x" * 128}, Code.ILLEGAL_TOPIC),
        ({"topic": "rmq_sys_T"}, Code.ILLEGAL_TOPIC),
        ({"topic": "%DLQ%NoSuchGroup"}, Code.TOPIC_NOT_FOUND),  # not a system topic
        ({"topic": "%RETRY%G_T"}, Code.ILLEGAL_TOPIC),  # never popped (docs/api.md)
        ({"topic": "NoSuchTopic"}, Code.TOPIC_NOT_FOUND),
        ({"batch": 0}, Code.BAD_REQUEST),
        ({"invisible_ms": 9_999}, Code.ILLEGAL_INVISIBLE_TIME),
        ({"invisible_ms": 12 * 3600 * 1000 + 1}, Code.ILLEGAL_INVISIBLE_TIME),
        ({"invisible_ms": None}, Code.ILLEGAL_INVISIBLE_TIME),
        ({"expression": "||"}, Code.ILLEGAL_FILTER_EXPRESSION),
        ({"expression": "", "filter_type": pb.FilterType.SQL}, Code.ILLEGAL_FILTER_EXPRESSION),
        # a poll longer than the deadline leaves: the deadline is too short to poll at all
        # (BAD_REQUEST: this client tells no version, so it may predate ILLEGAL_POLLING_TIME)
        ({"await_ms": 5000, "timeout_s": 0.15}, Code.BAD_REQUEST),
    ],
)
async def test_receive_validation(app, lean, T, G, kwargs, code):
    client = lean(app)
    assert await receive_status(client, G, T, **kwargs) == code
    # ... and the proxy keeps serving
    await client.send(T, b"after")
    assert await receive_status(client, G, T, await_ms=500) == Code.OK


async def test_batch_size_over_32_is_clamped(app, lean, T, G):
    client = lean(app)
    for i in range(40):
        await client.send(T, f"m{i}".encode())
    got = []
    for _ in range(10):
        result = await client.receive(G, T, await_ms=300, batch=100)
        assert len(result.messages) <= 32
        got += result.messages
        if len(got) == 40:
            break
    assert len(got) == 40


async def test_polling_time_beyond_the_deadline_is_cut_to_it(app, lean, T, G):
    result = await lean(app).receive(G, T, await_ms=20_000, timeout_s=1.5)
    assert result.status == Code.MESSAGE_NOT_FOUND  # answered before the 1.5 s deadline


async def test_missing_client_id(app, lean, T, G):
    client = lean(app, client_id=None)
    assert await receive_status(client, G, T) == Code.CLIENT_ID_REQUIRED
    route = await client.query_route(T)
    assert route.status.code == Code.CLIENT_ID_REQUIRED


@pytest.mark.parametrize(
    ("handle", "code"),
    [
        ("", Code.INVALID_RECEIPT_HANDLE),
        ("garbage", Code.INVALID_RECEIPT_HANDLE),
        ("0 1000 10000 0 0 broker-a 0 0 0", Code.INVALID_RECEIPT_HANDLE),  # expired long ago
    ],
)
async def test_bad_receipt_handles(app, lean, T, G, handle, code):
    client = lean(app)
    msg = pb.Message(system_properties=pb.SystemProperties(receipt_handle=handle, message_id="x"))
    acked = await client.ack(G, T, [msg])
    assert acked.entries[0].status.code == code
    changed = await client.change_invisible(G, T, msg, 10_000)
    assert changed.status.code == code


async def test_send_validation(app, lean, T):
    client = lean(app)
    cases = [
        (dict(topic="bad topic", body=b"x"), Code.ILLEGAL_TOPIC),
        (dict(topic=T, body=b""), Code.MESSAGE_BODY_EMPTY),
        (dict(topic=T, body=b"x" * (4 * 1024 * 1024 + 1)), Code.MESSAGE_BODY_TOO_LARGE),
        (dict(topic=T, body=b"x", tag="a|b"), Code.ILLEGAL_MESSAGE_TAG),
        (dict(topic=T, body=b"x", keys=[" "]), Code.ILLEGAL_MESSAGE_KEY),
        (dict(topic=T, body=b"x", properties={"UNIQ_KEY": "1"}), Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
        (dict(topic="NoSuchTopic", body=b"x"), Code.TOPIC_NOT_FOUND),
    ]
    for kwargs, code in cases:
        response = await client.send(**kwargs)
        assert response.status.code == code, kwargs.get("topic")
    assert (await client.send(T, b"fine")).status.code == Code.OK


async def test_corrupted_body_digest(app, lean, T):
    client = lean(app)
    message = pb.Message(
        topic=pb.Resource(name=T),
        body=b"abc",
        system_properties=pb.SystemProperties(
            message_id="D1", body_digest=pb.Digest(type=pb.DigestType.MD5, checksum="0" * 32)
        ),
    )
    response = await client.stub.SendMessage(
        api.SendMessageRequest(messages=[message]), metadata=client.metadata
    )
    assert response.status.code == Code.MESSAGE_CORRUPTED


async def test_too_many_long_polls(start_proxy, lean):
    app = await start_proxy(mode="notify", max_in_flight=2)
    client = lean(app)
    parked = [asyncio.ensure_future(client.receive("G", "T", await_ms=1500)) for _ in range(2)]
    await wait_until(lambda: app.engine.in_flight_total == 2)
    assert await receive_status(client, "G", "T", await_ms=1000) == Code.TOO_MANY_REQUESTS
    assert [r.status for r in await asyncio.gather(*parked)] == [Code.MESSAGE_NOT_FOUND] * 2


async def test_grpc_deadline_is_respected(app, lean, T, G):
    """The answer comes before the client's deadline even at the maximum poll."""
    client = lean(app)
    try:
        result = await client.receive(G, T, await_ms=1000, timeout_s=1.2)
    except grpc.aio.AioRpcError as exc:  # pragma: no cover - the failure this guards against
        pytest.fail(f"deadline exceeded: {exc.code()}")
    assert result.status == Code.MESSAGE_NOT_FOUND


async def test_change_invisible_of_an_offset_the_broker_never_had(app, lean, T, G):
    """A well-formed, unexpired handle for a queue offset past the end: the broker refuses
    it and the client is told the handle is invalid (not an internal error)."""
    client = lean(app)
    await client.send(T, b"one")
    [msg] = (await client.receive(G, T, await_ms=1000)).messages
    fields = msg.system_properties.receipt_handle.split(" ")
    fields[7] = str(int(fields[7]) + 1000)  # the queue offset
    msg.system_properties.receipt_handle = " ".join(fields)
    changed = await client.change_invisible(G, T, msg, 10_000)
    assert changed.status.code == Code.INVALID_RECEIPT_HANDLE
