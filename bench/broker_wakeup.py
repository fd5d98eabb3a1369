"""How fast a real broker answers a parked request when a message arrives: a NOTIFICATION
(what notify mode parks) against a POP (what coupled mode and the Apache proxy park).

    .venv/bin/python -m bench.broker_wakeup [--samples 40]

One real broker (RocketMQ 5.5.0 from ``make rocketmq``, Profile.BENCH JVM) on free ports;
for each sample a request is parked for 5 s, a message is sent 0.3 s later, and the time
from the send's answer to the parked request's answer is taken. The message is then popped
(after a notification) and acked, so every sample starts from an empty queue.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from proxy.remoting.answers import NotificationResult, PopResult
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.message import Prop
from rocketmq_local.launcher import Profile, RealCluster

TOPIC, GROUP = "WakeupTopic", "WakeupGroup"


async def measure(cluster: RealCluster, samples: int) -> dict[str, list[float]]:
    broker = cluster.brokers[0]
    consumer = BrokerClient(broker.name, broker.address)
    producer = BrokerClient(broker.name, broker.address)
    try:
        results: dict[str, list[float]] = {}
        for kind in ("notification", "pop"):
            waits = []
            for _ in range(samples):

                async def park(kind: str = kind) -> NotificationResult | PopResult:
                    if kind == "notification":
                        return await consumer.notification(GROUP, TOPIC, poll_ms=5000)
                    return await consumer.pop(GROUP, TOPIC, poll_ms=5000, max_nums=1)

                parked = asyncio.ensure_future(park())
                await asyncio.sleep(0.3)
                await producer.send(TOPIC, b"x", properties={Prop.UNIQ_KEY: uuid.uuid4().hex})
                sent = time.perf_counter()
                answer = await parked
                waits.append((time.perf_counter() - sent) * 1000)
                popped = (
                    answer if isinstance(answer, PopResult) else await consumer.pop(GROUP, TOPIC)
                )
                for m in popped.messages:
                    await consumer.ack(GROUP, TOPIC, m.properties[Prop.POP_CK])
            results[kind] = sorted(waits)
        return results
    finally:
        await consumer.close()
        await producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    cluster = RealCluster.start(1, profile=Profile.BENCH)
    try:
        cluster.create_topic(TOPIC)
        cluster.create_group(GROUP)
        results = asyncio.run(measure(cluster, args.samples))
    finally:
        cluster.stop()
    for kind, waits in results.items():
        p90 = waits[int(0.9 * len(waits))]
        print(
            f"{kind:12} p50 {statistics.median(waits):.1f} ms, p90 {p90:.1f} ms, "
            f"max {waits[-1]:.1f} ms ({len(waits)} samples)"
        )


if __name__ == "__main__":
    main()
