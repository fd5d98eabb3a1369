"""Priority messages (RocketMQ 5.4+, RIP-80) as a 5.5.0 broker stores and pops them.

A message with the ``_SYS_MSG_PRIORITY_`` property goes to queue min(priority,
writeQueueNums - 1), whatever queue the producer named; a pop of any queue (-1) on a topic
of message.type PRIORITY takes the queues from the highest down, so the highest priorities
come first, however long the backlog of lower ones.
"""

from __future__ import annotations

import orjson

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import Prop
from rocketmq_local.admin import wait_visible
from tests.conformance._util import pop_eventually

QUEUES = 4


async def _topic_config(backend, topic: str) -> dict:
    response = await backend.client().remoting.invoke(
        RemotingCommand(RequestCode.GET_TOPIC_CONFIG, {"topic": topic}), 10.0
    )
    assert response.code == ResponseCode.SUCCESS, response.remark
    return orjson.loads(response.body)


async def test_a_priority_topic_reports_its_type_in_its_config(backend):
    typed, untyped = backend.unique("T"), backend.unique("T")
    await backend.create_topic(typed, QUEUES, message_type="PRIORITY")
    await backend.create_topic(untyped, QUEUES)
    config = await _topic_config(backend, typed)
    assert config["attributes"] == {"message.type": "PRIORITY"}
    assert config["readQueueNums"] == config["writeQueueNums"] == QUEUES
    assert "message.type" not in (await _topic_config(backend, untyped)).get("attributes", {})


async def test_the_priority_picks_the_queue(backend):
    """Queue = min(priority, writeQueueNums - 1), over the queue the producer named; on an
    untyped topic too (the broker does not look at the topic's type). A FIFO message loses
    its priority and keeps its queue."""
    typed, untyped = backend.unique("T"), backend.unique("T")
    await backend.create_topic(typed, QUEUES, message_type="PRIORITY")
    await backend.create_topic(untyped, QUEUES)
    client = backend.client()
    for topic in (typed, untyped):
        for priority, queue in ((0, 0), (2, 2), (3, 3), (9, 3)):
            sent = await client.send(
                topic, b"m", properties={Prop.PRIORITY: str(priority)}, queue_id=1
            )
            assert sent.queue_id == queue, (topic, priority)
    fifo = await client.send(
        typed, b"f", properties={Prop.PRIORITY: "3", Prop.SHARDING_KEY: "g"}, queue_id=1
    )
    assert fifo.queue_id == 1
    group = backend.unique("G")
    await backend.create_group(group)
    await wait_visible(client, typed, [fifo])
    popped = await pop_eventually(client, group, typed, queue_id=1, init_mode=0)
    assert [m.body for m in popped.messages] == [b"f"]
    assert Prop.PRIORITY not in popped.messages[0].properties


async def test_high_priorities_pop_first_behind_a_backlog(backend):
    """A backlog of priority 0, then priority 1, then priority 3 and above: one pop of any
    queue hands out the highest first (each queue in its order), then the lower ones."""
    topic, group = backend.unique("T"), backend.unique("G")
    await backend.create_topic(topic, QUEUES, message_type="PRIORITY")
    await backend.create_group(group)
    client = backend.client()
    plan = [(0, f"low{i}") for i in range(6)] + [(1, "mid0"), (1, "mid1")]
    plan += [(3, "high0"), (7, "high1"), (3, "high2")]
    sent = [
        await client.send(topic, body.encode(), properties={Prop.PRIORITY: str(priority)})
        for priority, body in plan
    ]
    await wait_visible(client, topic, sent)
    popped = await pop_eventually(client, group, topic, init_mode=0)
    assert [m.body.decode() for m in popped.messages] == [
        "high0", "high1", "high2", "mid0", "mid1", "low0", "low1", "low2", "low3", "low4", "low5",
    ]  # fmt: skip
    assert [m.properties[Prop.PRIORITY] for m in popped.messages[:3]] == ["3", "7", "3"]
