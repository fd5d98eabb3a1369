"""Broker-side long polling both backends share: parked pops and notifications, wake-ups
by a send, expiry, POLLING_INFO, and what NOTIFICATION does not look at (tags)."""

from __future__ import annotations

import asyncio
import time

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import Prop
from rocketmq_local.admin import wait_visible
from testkit.waits import wait_until
from tests.conformance._util import SHORT_INVISIBLE_MS, pop_eventually
from tests.conformance.test_pop import fresh
from tests.support.remoting import pop_fields

#: A parked request shows in POLLING_INFO only once the broker has parked it.
PARK_DEADLINE_S = 10.0


async def parked(client, group: str, topic: str, queue_id: int = -1, want: int = 1) -> None:
    """Wait until POLLING_INFO counts ``want`` pops parked on (topic, group, queue_id)."""

    async def counted() -> bool:
        return await client.polling_info(group, topic, queue_id) == want

    await wait_until(counted, timeout=PARK_DEADLINE_S, step=0.02, what=f"{want} pop(s) parked")


async def test_parked_pop_is_woken_by_a_send(backend):
    topic, group = await fresh(backend)
    client, consumer = backend.client(), backend.client()
    assert await client.polling_info(group, topic) == 0
    task = asyncio.create_task(consumer.pop(group, topic, poll_ms=15_000))
    await parked(client, group, topic)
    assert not task.done()

    sent_at = time.monotonic()
    sent = await client.send(topic, b"wake up")
    result = await asyncio.wait_for(task, 10.0)
    assert result.code == ResponseCode.SUCCESS
    assert [m.msg_id for m in result.messages] == [sent.msg_id]
    assert time.monotonic() - sent_at < 2.0  # woken, far before its 15 s
    assert await client.polling_info(group, topic) == 0


async def test_parked_notification_is_woken_by_a_send(backend):
    topic, group = await fresh(backend)
    client, consumer = backend.client(), backend.client()
    started = time.monotonic()
    task = asyncio.create_task(consumer.notification(group, topic, poll_ms=15_000))
    await asyncio.sleep(0.5)  # POLLING_INFO counts pops only: give it time to park
    assert not task.done()

    sent_at = time.monotonic()
    await client.send(topic, b"ding")
    result = await asyncio.wait_for(task, 10.0)
    assert result.has_msg is True
    assert result.polling_full is False
    assert time.monotonic() - sent_at < 2.0
    assert time.monotonic() - started < 10.0


async def test_notification_answers_at_once_when_a_message_waits(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    await wait_visible(client, topic, [await client.send(topic, b"here")])
    started = time.monotonic()
    result = await client.notification(group, topic, poll_ms=10_000)
    assert result.has_msg is True
    assert time.monotonic() - started < 2.0


async def test_notification_ignores_tag_filters(backend):
    """NOTIFICATION carries no filter: it says a message waits where a tagged pop then
    finds nothing (and consumes the mismatch for the group)."""
    topic, group = await fresh(backend)
    client = backend.client()
    await wait_visible(client, topic, [await client.send(topic, b"x", tag="other")])
    assert (await client.notification(group, topic)).has_msg is True
    result = await client.pop(group, topic, expression="wanted")
    assert not result.found
    assert (await client.notification(group, topic)).has_msg is False


async def test_empty_pop_answers_polling_timeout_after_its_poll_time(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    started = time.monotonic()
    result = await client.pop(group, topic, poll_ms=1000)
    elapsed = time.monotonic() - started
    assert result.code == ResponseCode.POLLING_TIMEOUT
    assert not result.found
    assert 0.9 <= elapsed < 5.0
    assert await client.polling_info(group, topic) == 0


async def test_empty_notification_answers_false_after_its_poll_time(backend):
    topic, group = await fresh(backend)
    client = backend.client()
    started = time.monotonic()
    result = await client.notification(group, topic, poll_ms=1000)
    elapsed = time.monotonic() - started
    assert (result.has_msg, result.polling_full) == (False, False)
    assert 0.9 <= elapsed < 5.0


async def test_pop_born_too_long_ago_is_refused_at_once(backend):
    """bornTime + pollTime more than 500 ms in the past: POLLING_TIMEOUT (210) at once,
    the header's numbers zeroed, even with a message waiting."""
    topic, group = await fresh(backend)
    client = backend.client()
    await wait_visible(client, topic, [await client.send(topic, b"waiting")])
    fields = pop_fields(group, topic, pollTime=1000, bornTime=int(time.time() * 1000) - 3000)
    started = time.monotonic()
    response = await client.remoting.invoke(RemotingCommand(RequestCode.POP_MESSAGE, fields), 10.0)
    assert time.monotonic() - started < 0.9
    assert response.code == ResponseCode.POLLING_TIMEOUT
    assert "timeout too much" in response.remark
    assert response.fields == {"popTime": "0", "invisibleTime": "0", "reviveQid": "0",
                               "restNum": "0"}  # fmt: skip
    assert not response.body
    # The message is still there for a timely pop.
    assert (await client.pop(group, topic)).found


async def test_pop_parked_on_one_queue_wakes_only_for_that_queue(backend):
    topic, group = await fresh(backend)
    client, consumer = backend.client(), backend.client()
    task = asyncio.create_task(consumer.pop(group, topic, queue_id=1, poll_ms=15_000))
    await parked(client, group, topic, queue_id=1)

    await client.send(topic, b"elsewhere", queue_id=2)
    await asyncio.sleep(0.5)  # room for a wrong wake-up: none may come in it
    assert not task.done()
    assert await client.polling_info(group, topic, 1) == 1

    sent = await client.send(topic, b"here", queue_id=1)
    result = await asyncio.wait_for(task, 5.0)
    assert [m.msg_id for m in result.messages] == [sent.msg_id]


async def test_revived_message_wakes_a_parked_notification(backend):
    topic, group = await fresh(backend)
    client, consumer = backend.client(), backend.client()
    sent = await client.send(topic, b"comes back")
    await wait_visible(client, topic, [sent])
    first = await client.pop(group, topic, invisible_ms=SHORT_INVISIBLE_MS)
    assert [m.msg_id for m in first.messages] == [sent.msg_id]
    popped_at = time.monotonic()
    assert (await client.notification(group, topic)).has_msg is False

    result = await asyncio.wait_for(consumer.notification(group, topic, poll_ms=30_000), 40)
    assert result.has_msg is True
    # Woken by the revival, not answered at the end of its 30 s.
    assert SHORT_INVISIBLE_MS / 1000 - 0.05 <= time.monotonic() - popped_at < 20
    # Real 5.5.0: a pop right after this answer can still come back empty (the same
    # window in which a revival does not wake a parked POP); it gets it a moment later.
    back = await pop_eventually(client, group, topic, deadline_s=10)
    assert [m.msg_id for m in back.messages] == [sent.msg_id]
    assert back.messages[0].reconsume_times == 1
    await client.ack(group, topic, back.messages[0].properties[Prop.POP_CK])
