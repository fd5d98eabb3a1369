"""A broker sends each transaction check to one of the channels that named the message's
producer group, in turn. With registrations on, every gRPC producer is named under its
group on a slot connection of its own (``processor/registrations.py``) beside the
transaction processor's connection, so most checks arrive on a slot's connection. Each must
reach a producer: on broker stubs that discard after RocketMQ's 15 checks, every half
message of six producers of one topic is ended at its broker's first check."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from broker_stub import BrokerConfig, StubCluster
from proxy.brokers import BrokerPool
from proxy.processor.registrations import Registered, Registrations
from proxy.processor.transaction import CheckOutcome, TransactionCheck, TransactionProcessor
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE, LanguageCode
from proxy.remoting.message import Prop
from testkit.waits import wait_until

TOPIC = "TxChecks"
PRODUCERS = 6
HALF_MESSAGES = 12


@dataclass
class Producers:
    """The checks each producer stream took: (message id, the broker's check number)."""

    processor: TransactionProcessor
    seen: list[tuple[str, str]] = field(default_factory=list)
    ends: set[asyncio.Task[None]] = field(default_factory=set)

    def sink(self, check: TransactionCheck) -> bool:
        self.seen.append(
            (check.ref.msg_id, check.message.properties.get(Prop.TRANSACTION_CHECK_TIMES, ""))
        )
        end = self.processor.end(
            check.ref, check.group, TOPIC, TRANSACTION_COMMIT_TYPE, check.ref.msg_id, True
        )
        self.ends.add(asyncio.ensure_future(end))
        return True

    async def close(self) -> None:
        for task in self.ends:
            task.cancel()
        await asyncio.gather(*self.ends, return_exceptions=True)


async def test_every_check_reaches_a_producer_whichever_connection_the_broker_picks():
    config = BrokerConfig(topics=[TOPIC])
    assert config.transaction_check_max == 15  # RocketMQ's default: a lost check counts
    async with StubCluster(2, template=config) as cluster:
        pool = BrokerPool([cluster.namesrv_address])
        processor = TransactionProcessor(pool, "proxy-under-test", heartbeat_s=3600.0)
        registrations = Registrations(pool, max_clients=100)
        producers = Producers(processor)
        processor.start()
        registrations.start()
        senders = [BrokerClient(b.name, b.address) for b in cluster.brokers]
        try:
            for i in range(PRODUCERS):
                processor.register([TOPIC], producers.sink)
                await registrations.add(
                    Registered(f"producer-{i}", LanguageCode.PYTHON, 413, producer_topics=(TOPIC,))
                )
            # Every producer named on both brokers: one slot each, beside the processor's.
            await wait_until(lambda: registrations.status()["connections"] == 2 * PRODUCERS, 10)
            await wait_until(
                lambda: all(len(b.transactions.producers.get(TOPIC, {})) == PRODUCERS + 1
                            for b in cluster.brokers),
                10,
            )  # fmt: skip
            sent = []
            for i in range(HALF_MESSAGES):
                result = await senders[i % 2].send(
                    TOPIC,
                    f"orphan-{i}".encode(),
                    properties={Prop.TRANSACTION_PREPARED: "true", Prop.PRODUCER_GROUP: TOPIC},
                    producer_group=TOPIC,
                    sys_flag=TRANSACTION_PREPARED_TYPE,
                )
                sent.append(result.msg_id)
            await wait_until(lambda: {m for m, _ in producers.seen} >= set(sent), 30)
            await wait_until(lambda: not any(b.transactions.half for b in cluster.brokers), 10)
            first: dict[str, str] = {}
            for msg_id, times in producers.seen:
                first.setdefault(msg_id, times)
            assert first == dict.fromkeys(sent, "1"), producers.seen
            assert processor.checks[CheckOutcome.RELAYED] == len(producers.seen)
            assert processor.checks[CheckOutcome.NO_PRODUCER] == 0
        finally:
            await producers.close()
            for sender in senders:
                await sender.close()
            await registrations.close()
            await processor.close()
            await pool.close()
