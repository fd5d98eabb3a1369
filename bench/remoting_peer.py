"""bench-peer's ``remoting`` scenario: the official Java client's remoting API (rocketmq-client
5.5.0) through our remoting port and through the Apache proxy's, on the same real brokers.

For each proxy, a fresh topic and group: a DefaultMQPushConsumer starts, then a
DefaultMQProducer sends ``messages`` messages one at a time, each as soon as the last was
acknowledged. The row: the producer's sends per second, the messages delivered per second
(first send to last delivery), and each message's latency from its send (born time) to its
listener call, at the 50th and 99th percentiles, for the messages sent after the first
``WARMUP_S`` seconds: until a new consumer pulls every queue (its rebalance, its offsets),
the first messages wait for it, a few hundred milliseconds through any proxy and without one
(``warmup_ms_max`` shows it). Our proxy runs as a user runs it
(``rmq-proxy --remoting-port``, default workers) in front of the scenario's cluster.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from bench.scenarios import percentile
from rocketmq_local import admin
from testkit.official.harness import ProxyProcess, start_proxy
from testkit.official.remoting_driver import JAVA

COLUMNS = ["sent", "delivered", "send_per_s", "delivered_per_s", "latency_ms_p50",
           "latency_ms_p99", "latency_ms_max", "warmup_ms_max"]  # fmt: skip
# Messages sent this long after the first one are left out of the latency figures.
WARMUP_S = 2.0


def measure(address: str, namesrv: str, messages: int, home: Path) -> dict:
    """One proxy's row (blocking: run it in a thread)."""
    tag = uuid.uuid4().hex[:8]
    topic, producer, consumer = f"bench-rm-{tag}", f"bench-rm-p-{tag}", f"bench-rm-c-{tag}"
    admin.create_topic(namesrv, topic)
    push = JAVA.start(
        home / f"{tag}-push", "push", "--namesrv", address, "--group", consumer,
        "--topic", topic, "--expect", messages, "--seconds", 60 + messages // 100,
    )  # fmt: skip
    sent = JAVA.run(
        home / f"{tag}-produce", "produce", "--namesrv", address, "--group", producer,
        "--topic", topic, "--count", messages, timeout_s=120 + messages / 50,
    )  # fmt: skip
    got = push.result(120 + messages / 50)
    first: dict[str, dict] = {}
    for message in got["messages"]:
        first.setdefault(message["body"], message)  # a redelivery does not count again
    born = [m["born_ms"] for m in first.values()]
    steady_from = min(born, default=0) + WARMUP_S * 1000
    latencies = [m["at_ms"] - m["born_ms"] for m in first.values() if m["born_ms"] >= steady_from]
    warmup = [m["at_ms"] - m["born_ms"] for m in first.values() if m["born_ms"] < steady_from]
    at = [m["at_ms"] for m in first.values()]
    ok = [s for s in sent["sent"] if s["status"] == "SEND_OK"]
    span_s = (max(at) - min(born)) / 1000 if first else 0.0
    send_span_s = (max(born) - min(born)) / 1000 if len(born) > 1 else 0.0
    return {
        "sent": len(ok),
        "send_errors": len(sent["errors"]),
        "delivered": len(first),
        "send_per_s": round(len(ok) / send_span_s, 1) if send_span_s else None,
        "delivered_per_s": round(len(first) / span_s, 1) if span_s else None,
        "latency_ms_p50": percentile(latencies, 0.50),
        "latency_ms_p99": percentile(latencies, 0.99),
        "latency_ms_max": max(latencies, default=None),
        "warmup_ms_max": max(warmup, default=None),
    }


async def remoting(
    namesrv: str, apache_remoting: str | None, *, messages: int, home: Path
) -> dict[str, dict]:
    """The rows of the scenario: ``apache`` (when its remoting address is given) and
    ``ours``."""
    ours: ProxyProcess = await asyncio.to_thread(
        start_proxy, home / "proxy", (), namesrv=namesrv, extra_args=("--remoting-port", "0")
    )
    try:
        assert ours.remoting, ours.logs()
        addresses = {"ours": ours.remoting}
        if apache_remoting is not None:
            addresses = {"apache": apache_remoting, **addresses}
        rows = {}
        for label, address in addresses.items():
            rows[label] = await asyncio.to_thread(measure, address, namesrv, messages, home)
        return rows
    finally:
        await asyncio.to_thread(ours.stop)
