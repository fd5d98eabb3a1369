"""Broker stub benchmark: send and pop+ack throughput of one broker process, and the
wake-up latency of a parked notification.

    .venv/bin/python bench/bench_broker.py [--messages 60000] [--wakeups 500]

The broker runs as its own process (``rmq-broker-stub`` on a free loopback port); this
process drives it over the remoting protocol with several connections and many requests in
flight. Not part of the test run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import orjson

from proxy.loop import run_main
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.message import BatchEntry, Prop

TOPIC = "BenchTopic"
GROUP = "BenchGroup"


def start_broker() -> tuple[subprocess.Popen, str]:
    """Start ``rmq-broker-stub`` on a free port; return the process and its address."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from broker_stub.cli import broker_main; broker_main()",
            "--port",
            "0",
            "--topic",
            TOPIC,
            "--queues",
            "8",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None  # PIPE
    line = proc.stdout.readline().strip()  # "broker broker-a listening on host:port"
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_workers(count: int, work) -> None:
    await asyncio.gather(*(work(i) for i in range(count)))


async def bench_send(clients: list[BrokerClient], total: int, in_flight: int) -> float:
    per_worker = total // in_flight
    body = b"x" * 128

    async def worker(i: int) -> None:
        client = clients[i % len(clients)]
        for _ in range(per_worker):
            await client.send(TOPIC, body, tag="t")

    start = time.perf_counter()
    await run_workers(in_flight, worker)
    return per_worker * in_flight / (time.perf_counter() - start)


async def bench_send_batch(clients: list[BrokerClient], total: int, in_flight: int) -> float:
    batch = [BatchEntry(b"x" * 128, {Prop.TAGS: "t"}) for _ in range(32)]
    per_worker = total // (in_flight * len(batch))

    async def worker(i: int) -> None:
        client = clients[i % len(clients)]
        for _ in range(per_worker):
            await client.send_batch(TOPIC, batch)

    start = time.perf_counter()
    await run_workers(in_flight, worker)
    return per_worker * in_flight * len(batch) / (time.perf_counter() - start)


async def bench_pop_ack(
    clients: list[BrokerClient], total: int, in_flight: int, group: str, batch_ack: bool
) -> float:
    """Pop batches of 32 and ack every message, until ``total`` are consumed."""
    consumed = 0

    async def worker(i: int) -> None:
        nonlocal consumed
        client = clients[i % len(clients)]
        while consumed < total:
            result = await client.pop(group, TOPIC, max_nums=32, invisible_ms=60_000)
            if not result.messages:
                return
            consumed += len(result.messages)
            if batch_ack:
                await batch_ack_all(client, group, result.messages)
            else:
                await asyncio.gather(
                    *(client.ack(group, TOPIC, m.properties[Prop.POP_CK]) for m in result.messages)
                )

    start = time.perf_counter()
    await run_workers(in_flight, worker)
    return consumed / (time.perf_counter() - start)


async def batch_ack_all(client: BrokerClient, group: str, messages) -> None:
    """One BATCH_ACK_MESSAGE per checkpoint (queue) of a pop."""
    by_ck: dict[tuple[int, int, int], list[int]] = {}
    for m in messages:
        start, pop_time, _, _, _, _, qid, off = m.properties[Prop.POP_CK].split(" ")
        by_ck.setdefault((int(qid), int(start), int(pop_time)), []).append(int(off))
    acks = []
    for (qid, start, pop_time), offsets in by_ck.items():
        bits = bytearray((max(offsets) - start) // 8 + 1)
        for off in offsets:
            bits[(off - start) // 8] |= 1 << ((off - start) % 8)
        acks.append(
            {
                "c": group,
                "t": TOPIC,
                "r": "0",
                "so": start,
                "q": qid,
                "rq": 0,
                "pt": pop_time,
                "it": 60_000,
                "b": base64.b64encode(bits).decode(),
            }
        )
    body = orjson.dumps({"brokerName": client.name, "acks": acks})
    await client.remoting.invoke(RemotingCommand(RequestCode.BATCH_ACK_MESSAGE, {}, body), 3.0)


async def bench_wakeup(prober: BrokerClient, sender: BrokerClient, rounds: int) -> list[float]:
    """Park a notification, send one message, time send-start to notification answer."""
    latencies = []
    group = "WakeGroup"
    # Drain whatever the throughput phases left for this group.
    while (await prober.pop(group, TOPIC, max_nums=32)).messages:
        pass
    for _ in range(rounds):
        probe = asyncio.ensure_future(prober.notification(group, TOPIC, poll_ms=5000))
        await asyncio.sleep(0.002)  # let the probe reach the broker and park
        start = time.perf_counter()
        await sender.send(TOPIC, b"wake")
        result = await probe
        latencies.append(time.perf_counter() - start)
        assert result.has_msg
        popped = await prober.pop(group, TOPIC, max_nums=32, invisible_ms=60_000)
        for m in popped.messages:
            await prober.ack(group, TOPIC, m.properties[Prop.POP_CK])
    return latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> dict:
    proc, address = start_broker()
    try:
        clients = [BrokerClient("broker-a", address) for _ in range(args.connections)]
        cpu0 = cpu_seconds(proc.pid)
        send_rate = await bench_send(clients, args.messages, args.in_flight)
        cpu_send = cpu_seconds(proc.pid) - cpu0
        pop_rate = await bench_pop_ack(clients, args.messages, args.in_flight, GROUP, False)
        batch_send_rate = await bench_send_batch(clients, args.messages, 8)
        batch_pop_rate = await bench_pop_ack(clients, args.messages, 8, "BatchGroup", True)
        prober, sender = BrokerClient("broker-a", address), BrokerClient("broker-a", address)
        latencies = await bench_wakeup(prober, sender, args.wakeups)
        for c in [*clients, prober, sender]:
            await c.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}",
        "send_msgs_per_s": round(send_rate),
        "send_broker_cpu_s_per_1000": round(cpu_send / (args.messages / 1000), 4),
        "pop_ack_msgs_per_s": round(pop_rate),
        "batch_send_msgs_per_s": round(batch_send_rate),
        "pop_batch_ack_msgs_per_s": round(batch_pop_rate),
        "wakeup_ms_p50": round(statistics.median(latencies) * 1000, 3),
        "wakeup_ms_p99": round(pct(latencies, 0.99) * 1000, 3),
        "wakeup_ms_max": round(max(latencies) * 1000, 3),
        "wakeups": len(latencies),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--in-flight", type=int, default=64, help="concurrent requests")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--wakeups", type=int, default=500)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = run_main(main(args))
    for key, value in results.items():
        print(f"{key:32} {value}")
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
