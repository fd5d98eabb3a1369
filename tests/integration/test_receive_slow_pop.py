"""A pop that a broker answers late, while the client still waits, is delivered.

Issue 26: the first message of a cold start (a group new to the brokers, just after they
started) was delivered 5.1 s late. A pop without broker-side wait was given up after
``broker_timeout_s`` (3 s) even with most of the client's poll left; the broker had popped
the message all the same, so its late answer was handed back, and a RocketMQ 5.5.0 broker
redelivers a handed-back message only when its revive service next scans, about 2 s after
the hand-back's 1 s invisible time (docs/real-rocketmq.md): about 3 + 3 s for a message
the proxy had in hand at 3 s. A broker's first pops of a new group are its slowest (the
timelines of tests/bench/cold.py). Here the stub broker answers every pop 0.6 s late with
``broker_timeout_s`` at 0.3 s: given up at 0.3 s, the message would be handed back, and
every later pop given up too, so the poll would answer empty.
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


def answer_pops_late(cluster: StubCluster) -> None:
    """The broker pops at once (the message is then invisible), and answers LATE_S later."""
    processor = cluster.broker("broker-a").processor
    pop = processor.handlers[RequestCode.POP_MESSAGE]

    def late_pop(cmd, conn):
        reply = pop(cmd, conn)

        async def later():
            await asyncio.sleep(LATE_S)
            return await reply if asyncio.isfuture(reply) or asyncio.iscoroutine(reply) else reply

        return later()

    processor.handlers[RequestCode.POP_MESSAGE] = late_pop


@pytest.mark.parametrize("mode", ["notify", "adaptive", "slicing"])
async def test_a_pop_answered_late_within_the_poll_is_delivered(mode):
    async with StubCluster(1, template=BrokerConfig(topics=[T])) as cluster:
        sender = BrokerClient("broker-a", cluster.broker("broker-a").address)
        pool = BrokerPool([cluster.namesrv_address])
        consumer = ConsumerProcessor(pool, broker_timeout_s=TIMEOUT_S, nack_invisible_ms=1000)
        config = ReceiveConfig(mode=mode, broker_timeout_s=TIMEOUT_S)
        engine = ReceiveEngine(config, pool, consumer, ProxyMetrics())
        try:
            await sender.send(T, b"cold")
            answer_pops_late(cluster)
            loop = asyncio.get_running_loop()
            now = loop.time()
            result = await engine.receive(
                ReceiveRequest(G, T, "*", 16, 30_000, int(POLL_S * 1000), now + POLL_S, now)
            )
            took = loop.time() - now
        finally:
            await engine.close()
            await consumer.close()
            await pool.close()
            await sender.close()
    assert [m.message.body for m in result.messages] == [b"cold"]
    assert consumer.nacked == 0  # delivered, not handed back
    assert LATE_S <= took < LATE_S + 1.0
