"""Orderly POP (``order=true``), what FIFO consumer groups use, on both backends: a queue
with a message in flight gives nothing to another attempt, the same attempt id gets the same
messages again, acks and a change of invisible time free the queue, ``orderCountInfo``
counts the attempts, and an orderly NOTIFICATION skips a blocked queue."""

from __future__ import annotations

import asyncio
import time

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import ResponseCode
from proxy.remoting.message import Prop
from proxy.remoting.popinfo import PopCheckpointInfo
from rocketmq_local.admin import wait_visible
from testkit.waits import wait_until
from tests.conformance._util import pop_eventually
from tests.conformance.test_pop import raw_pop

INVISIBLE_MS = 60_000  # long: nothing here may come back by its invisible time
POP_ORDER_REVIVE_QUEUE = 999


def ck(msg) -> PopCheckpointInfo:
    return PopCheckpointInfo.parse(msg.properties[Prop.POP_CK])


async def orderly(client: BrokerClient, group: str, topic: str, attempt: str, **kw):
    return await client.pop(
        group, topic, order=True, attempt_id=attempt, invisible_ms=INVISIBLE_MS, **kw
    )


async def test_orderly_pop_blocks_the_queue_until_acked(backend):
    topic, group = backend.unique("T"), backend.unique("G")
    await backend.create_topic(topic, 2)
    await backend.create_group(group, fifo=True)
    client = backend.client()
    sent = [await client.send(topic, f"m{i}".encode(), queue_id=0) for i in range(3)]
    await wait_visible(client, topic, sent)

    # The raw answer: reviveQid 999 and an orderCountInfo with the queue's least count.
    raw = await raw_pop(
        client, group, topic, order="true", attemptId="a1", maxMsgNums=2,
        invisibleTime=INVISIBLE_MS,
    )  # fmt: skip
    assert raw.code == ResponseCode.SUCCESS, raw.remark
    assert raw.fields["reviveQid"] == str(POP_ORDER_REVIVE_QUEUE)
    assert raw.fields["orderCountInfo"] == "0 0 0"
    assert raw.fields["msgOffsetInfo"] == "0 0 0,1"

    # Another attempt finds the queue blocked, though offset 2 waits behind the two.
    assert not (await orderly(client, group, topic, "a2")).found
    assert not (await client.notification(group, topic, order=True)).has_msg

    # The same attempt again (a client retrying a lost answer): the same two messages,
    # not counted as another delivery.
    again = await orderly(client, group, topic, "a1", max_nums=2)
    assert [m.queue_offset for m in again.messages] == [0, 1]
    assert [m.reconsume_times for m in again.messages] == [0, 0]
    assert all(ck(m).revive_qid == POP_ORDER_REVIVE_QUEUE for m in again.messages)
    first, second = again.messages

    # One ack leaves the queue blocked by the other message.
    await client.ack(group, topic, first.properties[Prop.POP_CK])
    assert not (await orderly(client, group, topic, "a3")).found

    # A short invisible time for the second: the handle keeps its pop time; once it has
    # passed, the next attempt gets offsets 1 and 2, the first of them counted once more.
    changed = await client.change_invisible_time(group, topic, second.properties[Prop.POP_CK], 1000)
    assert PopCheckpointInfo.parse(changed).pop_time == ck(second).pop_time
    assert not (await orderly(client, group, topic, "a4")).found  # not yet
    await asyncio.sleep(1.2)  # past the 1 s invisible time: the second may come back
    redo = await pop_eventually(
        client, group, topic, order=True, attempt_id="a5", invisible_ms=INVISIBLE_MS,
        deadline_s=10.0,
    )  # fmt: skip
    assert [m.queue_offset for m in redo.messages] == [1, 2]
    assert [m.body for m in redo.messages] == [b"m1", b"m2"]
    assert [m.reconsume_times for m in redo.messages] == [1, 0]

    # Both acked (one batch): the queue is free and empty.
    errors = await client.ack_all(group, topic, [ck(m) for m in redo.messages])
    assert errors == [None, None]
    assert not (await orderly(client, group, topic, "a6")).found
    assert not (await client.notification(group, topic, order=True)).has_msg
    await client.send(topic, b"m3", queue_id=0)

    async def seen() -> bool:
        return (await client.notification(group, topic, order=True)).has_msg

    await wait_until(seen, timeout=10, step=0.05, what="an orderly probe seeing the free queue")
    last = await pop_eventually(
        client, group, topic, order=True, attempt_id="a7", invisible_ms=INVISIBLE_MS
    )
    assert [m.body for m in last.messages] == [b"m3"]


async def test_an_orderly_probe_parked_on_a_blocked_queue_wakes_on_the_ack(backend):
    topic, group = backend.unique("T"), backend.unique("G")
    await backend.create_topic(topic, 1)
    await backend.create_group(group, fifo=True)
    client = backend.client()
    sent = [await client.send(topic, f"m{i}".encode(), queue_id=0) for i in range(2)]
    await wait_visible(client, topic, sent)
    got = await orderly(client, group, topic, "b1", max_nums=1)
    [msg] = got.messages
    probe = asyncio.ensure_future(
        backend.client().notification(group, topic, order=True, poll_ms=8000, timeout=12)
    )
    # The probe parks (POLLING_INFO counts pops, not notifications: nothing to await), and
    # must not answer in this time while the queue is blocked.
    await asyncio.sleep(0.5)
    assert not probe.done(), "an orderly probe answered while the only queue was blocked"
    started = time.monotonic()
    await client.ack(group, topic, msg.properties[Prop.POP_CK])
    answer = await asyncio.wait_for(probe, 12)
    assert answer.has_msg
    assert time.monotonic() - started < 3.0, "the probe ran to its poll time"
