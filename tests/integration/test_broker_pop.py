"""POP semantics of the broker stub, end to end over the remoting protocol."""

# Behaviour a real broker shares (send, pop, filters, acks, invisible time, retry, DLQ, batch
# send and ack) is in tests/conformance, run against the stub and real RocketMQ alike;
# what stays here is the stub's own.

from __future__ import annotations

import time

from broker_stub import BrokerConfig, StubCluster
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.headers import now_ms
from proxy.remoting.message import Prop

T = "TopicPop"
G = "GroupPop"


async def test_timed_delivery(client):
    sent_at = time.monotonic()
    deliver_at = now_ms() + 500
    sent = await client.send(T, b"later", properties={Prop.TIMER_DELIVER_MS: str(deliver_at)})

    assert not (await client.pop(G, T)).found
    result = await client.pop(G, T, poll_ms=2000)
    elapsed = time.monotonic() - sent_at
    assert [m.msg_id for m in result.messages] == [sent.msg_id]
    assert result.messages[0].body == b"later"
    assert now_ms() >= deliver_at
    assert 0.4 <= elapsed < 1.5


async def test_new_group_with_init_mode_max_starts_at_the_last_message():
    """Once the queue no longer holds its first message, initMode MAX starts a new group at
    the newest message ("pop last one", RocketMQ's getInitOffset); MIN at the oldest kept.
    Not reachable on a real broker in test time (its commit log is kept for days)."""
    async with StubCluster(1, template=BrokerConfig(retain_per_queue=3)) as cluster:
        broker = cluster.brokers[0]
        client = BrokerClient(broker.name, broker.address)
        try:
            sent = [await client.send(T, b"%d" % i, queue_id=0) for i in range(5)]
            newest = await client.pop("MaxGroup", T, queue_id=0, init_mode=1)
            assert [m.msg_id for m in newest.messages] == [sent[-1].msg_id]
            oldest = await client.pop("MinGroup", T, queue_id=0, init_mode=0)
            assert [m.msg_id for m in oldest.messages] == [s.msg_id for s in sent[2:]]
        finally:
            await client.close()
