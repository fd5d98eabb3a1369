"""AckMessage: each broker's share of the entries goes in one BATCH_ACK_MESSAGE, a broker
that does not know that code gets single acks, and every entry gets its own status."""

from __future__ import annotations

from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.codes import RequestCode
from tests.integration.test_proxy_observability import value
from tests.support.brokers import send_to

Code = pb.Code
T, G = "T", "G"
PER_BROKER = 6


async def receive_all(client, count: int, group: str = G, topic: str = T) -> list:
    """Receive until ``count`` messages are in hand (bounded)."""
    got: list = []
    for _ in range(20):
        result = await client.receive(group, topic, await_ms=1000, batch=32)
        got.extend(result.messages)
        if len(got) >= count:
            return got
    raise AssertionError(f"received {len(got)} of {count}")


def remoting_calls(app, request: str, response: str | None = None) -> float:
    labels = {"response_code": response} if response else {}
    return value(
        app,
        "rocketmq_proxy_rpc_latency_seconds_count",
        protocol_type="remoting",
        request_code=request,
        **labels,
    )


async def fill(app, brokers: list[str]) -> None:
    for name in brokers:
        for i in range(PER_BROKER):
            await send_to(app, name, f"{name}-{i}".encode())


async def fill_backend(backend, brokers: list[str]) -> None:
    for name in brokers:
        for i in range(PER_BROKER):
            await backend.send_to(name, f"{name}-{i}".encode())


async def test_one_batch_ack_per_broker(backend, lean):
    app = await backend.start(mode="notify")
    group, topic = backend.group, backend.topic
    await fill_backend(backend, ["broker-a", "broker-b"])
    client = lean(app)
    messages = await receive_all(client, 2 * PER_BROKER, group, topic)
    singles_before = remoting_calls(app, "ack_message")

    acked = await client.ack(group, topic, messages)

    assert acked.status.code == Code.OK
    assert [e.status.code for e in acked.entries] == [Code.OK] * len(messages)
    assert remoting_calls(app, "batch_ack_message") == 2  # one per broker
    assert remoting_calls(app, "ack_message") == singles_before
    assert remoting_calls(app, "batch_ack_message", "success") == 2  # the brokers took them
    if backend.stub:
        for name in ("broker-a", "broker-b"):
            assert backend.cluster.broker(name).pop.checkpoint_count == 0
    again = await client.receive(group, topic, await_ms=1000)
    assert again.status == Code.MESSAGE_NOT_FOUND


async def test_broker_without_batch_ack_gets_single_acks(start_proxy, lean):
    app = await start_proxy(mode="notify")
    old = app.cluster.broker("broker-a")
    # An older broker: the stub answers REQUEST_CODE_NOT_SUPPORTED for codes it lacks.
    del old.processor.handlers[RequestCode.BATCH_ACK_MESSAGE]
    await fill(app, ["broker-a"])
    client = lean(app)
    messages = await receive_all(client, PER_BROKER)
    half = len(messages) // 2

    first = await client.ack(G, T, messages[:half])
    second = await client.ack(G, T, messages[half:])

    for acked in (first, second):
        assert [e.status.code for e in acked.entries] == [Code.OK] * len(acked.entries)
    assert remoting_calls(app, "batch_ack_message") == 1  # tried once, then remembered
    assert remoting_calls(app, "ack_message") == len(messages)
    assert old.pop.checkpoint_count == 0


async def test_each_entry_gets_its_own_status(backend, lean):
    app = await backend.start(mode="notify")
    group, topic = backend.group, backend.topic
    await fill_backend(backend, ["broker-a"])
    client = lean(app)
    messages = await receive_all(client, PER_BROKER, group, topic)
    bad = pb.Message()
    bad.CopyFrom(messages[0])
    bad.system_properties.receipt_handle = "not a handle"

    acked = await client.ack(group, topic, [*messages, bad])

    assert acked.status.code == Code.MULTIPLE_RESULTS
    codes = [e.status.code for e in acked.entries]
    assert codes == [Code.OK] * len(messages) + [Code.INVALID_RECEIPT_HANDLE]
    if backend.stub:
        assert backend.cluster.broker("broker-a").pop.checkpoint_count == 0
