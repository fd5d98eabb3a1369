"""A pop after hasMsg that the broker answers late, while the client still waits, is
delivered.

Issue 26 (a cold first message 5.1 s late). A pop without broker-side wait was given up
after ``broker_timeout_s`` (3 s) even with most of the client's poll left; the broker had
popped the message all the same, so its late answer was handed back, and a RocketMQ 5.5.0
broker makes a handed-back message poppable again 3-6 s later (its revive service; measured
with a 1 s hand-back): 6-9 s for a message the proxy had in hand at 3 s. A pop sent after
the broker answered hasMsg now waits as long as the poll can (that broker is up); the
poll's first pop keeps the short timeout, so a broker that hangs costs a poll 3 s. Here the
stub broker answers every pop 0.6 s late with ``broker_timeout_s`` at 0.3 s: the first pop
is given up (the queue is empty then), the message sent meanwhile wakes the probe, and the
pop that follows must be waited for. Given up, the message would be handed back and every
later pop given up too: the poll would answer empty.
"""

from __future__ import annotations

import asyncio

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.brokers import BrokerPool
from proxy.config import ReceiveConfig
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.consumer import ConsumerProcessor
from proxy.receive.engine import ReceiveEngine
from proxy.receive.types import ReceiveRequest
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode

T, G = "T", "G"
LATE_S = 0.6  # how late the broker answers every pop
TIMEOUT_S = 0.3  # broker_timeout_s: less than LATE_S
POLL_S = 3.0  # the client's poll: time enough for a late answer


def answer_pops_late(cluster: StubCluster) -> asyncio.Event:
    """The broker pops at once (the message is then invisible), and answers LATE_S later.
    The event is set once it has popped for the first time."""
    processor = cluster.broker("broker-a").processor
    pop = processor.handlers[RequestCode.POP_MESSAGE]
    popped = asyncio.Event()

    def late_pop(cmd, conn):
        reply = pop(cmd, conn)
        popped.set()

        async def later():
            await asyncio.sleep(LATE_S)  # the slow broker: its answer comes LATE_S late
            return await reply if asyncio.isfuture(reply) or asyncio.iscoroutine(reply) else reply

        return later()

    processor.handlers[RequestCode.POP_MESSAGE] = late_pop
    return popped


@pytest.mark.parametrize("mode", ["notify", "adaptive"])
async def test_a_pop_after_has_msg_answered_late_is_delivered(mode):
    async with StubCluster(1, template=BrokerConfig(topics=[T])) as cluster:
        sender = BrokerClient("broker-a", cluster.broker("broker-a").address)
        pool = BrokerPool([cluster.namesrv_address])
        consumer = ConsumerProcessor(pool, broker_timeout_s=TIMEOUT_S, hand_back_invisible_ms=1000)
        config = ReceiveConfig(mode=mode, broker_timeout_s=TIMEOUT_S)
        engine = ReceiveEngine(config, pool, consumer, ProxyMetrics())
        try:
            first_pop = answer_pops_late(cluster)
            loop = asyncio.get_running_loop()
            now = loop.time()
            poll = asyncio.ensure_future(
                engine.receive(
                    ReceiveRequest(G, T, "*", 16, 30_000, int(POLL_S * 1000), now + POLL_S, now)
                )
            )
            await asyncio.wait_for(first_pop.wait(), 5)  # it found the queue empty
            await sender.send(T, b"cold")
            sent = loop.time()
            result = await poll
            took = loop.time() - sent
        finally:
            await engine.close()
            await consumer.close()
            await pool.close()
            await sender.close()
    assert [m.message.body for m in result.messages] == [b"cold"]
    assert consumer.handed_back == 0  # delivered, not handed back
    # The first pop's late answer (at most LATE_S), then the probe and the late pop.
    assert LATE_S <= took < 2 * LATE_S + 1.0
