"""Priority messages through the proxy, on stubs and on real brokers: a PRIORITY topic's
route accepts priority messages only, the priority reaches the broker (which picks the
queue by it) and comes back on receive, and each pop hands the highest priorities out
first, in every receive mode."""

from __future__ import annotations

import time

import pytest

from proxy.api.v2 import definition_pb2 as pb
from testkit.waits import wait_until
from tests.integration._backend import BROKERS

OK = pb.Code.OK
CONFLICT = pb.Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
QUEUES = 4


async def _wait_stored(backend, topic: str, count: int, timeout_s: float = 10.0) -> None:
    """Until the brokers' queues of ``topic`` hold ``count`` messages (a real broker
    indexes a message a moment after it answers the send)."""
    held = [0]

    async def stored() -> bool:
        offsets = [await backend.max_offset(b, topic, q) for b in BROKERS for q in range(QUEUES)]
        held[0] = sum(offsets)
        return held[0] >= count

    await wait_until(
        stored, timeout=timeout_s, step=0.02, what=lambda: f"{topic} holding {count} ({held[0]})"
    )


async def test_routes_advertise_the_topic_type_and_sends_must_match(backend, lean):
    app = await backend.start()
    topic = backend.new_names()[0]
    await backend.create_topic(topic, message_type="PRIORITY")
    client = lean(app)
    route = await client.query_route(topic)
    assert route.status.code == OK and route.message_queues
    assert {tuple(q.accept_message_types) for q in route.message_queues} == {(pb.PRIORITY,)}
    untyped = await client.query_route(backend.topic)
    assert {tuple(q.accept_message_types) for q in untyped.message_queues} == {
        (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
    }
    # The Apache proxy's answer to a type its topic does not take, both ways.
    normal = await client.send(topic, b"normal")
    assert normal.status.code == CONFLICT, normal.status.message
    priority = await client.send(backend.topic, b"priority", priority=1)
    assert priority.status.code == CONFLICT, priority.status.message


@pytest.mark.parametrize("mode", ["notify", "coupled", "slicing", "adaptive"])
async def test_high_priorities_come_first_in_every_mode(backend, lean, mode):
    app = await backend.start(mode=mode, slice_ms=100)
    topic = backend.new_names()[0]
    await backend.create_topic(topic, message_type="PRIORITY")
    client = lean(app)
    # Sends alternate between the brokers: each gets two low ones, then a high one.
    plan = [(0, b"low")] * 4 + [(3, b"high")] * 2
    for priority, body in plan:
        sent = await client.send(topic, body, priority=priority)
        assert sent.status.code == OK, sent.status.message
    await _wait_stored(backend, topic, len(plan))
    batches: list[list[int]] = []
    deadline = time.monotonic() + 15
    while sum(map(len, batches)) < len(plan):
        assert time.monotonic() < deadline, f"received only {batches}"
        got = await client.receive(backend.group, topic, await_ms=1000, batch=32)
        if got.messages:
            batches.append([m.system_properties.priority for m in got.messages])
            assert {m.system_properties.message_type for m in got.messages} == {pb.PRIORITY}
            acked = await client.ack(backend.group, topic, got.messages)
            assert acked.status.code == OK
    assert sorted(p for batch in batches for p in batch) == [0, 0, 0, 0, 3, 3]
    for batch in batches:  # one broker's pop each: its high one before its low ones
        assert batch == sorted(batch, reverse=True), batches
    assert batches[0][0] == 3, batches
