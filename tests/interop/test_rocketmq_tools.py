"""Operators see the proxy's clients in RocketMQ's own tools: the official Python and Java
consumers, each through another of two proxies on the session's real RocketMQ 5.5.0
brokers, are listed by the real ``mqadmin consumerConnection`` (the 5.5.0 tools jar) with
their languages and versions while they run; ``mqadmin consumerStatus`` shows a client's
running info, answered by its proxy, and its thread stacks, asked of the client; a
producer is listed by ``producerConnection``; a client of a proxy that drains, and clients
that stop, leave the list at once. The consumer lag metric equals ``consumerProgress``."""

from __future__ import annotations

import asyncio
import itertools
import re
import time

import pytest

from proxy.api.v2 import definition_pb2 as pb
from rocketmq_local import admin
from rocketmq_local.launcher import mqadmin as run_mqadmin
from testkit.lean_client import LeanClient, SettingsClient, producer_settings
from testkit.official.harness import run_client

pytestmark = [pytest.mark.real, pytest.mark.interop]

_ids = itertools.count()


async def fresh_topic_and_group(cluster, name: str) -> tuple[str, str, str]:
    """A unique suffix, and a topic and a group made with it on every broker of ``cluster``."""
    brokers = {b.name: b.address for b in cluster.brokers}
    suffix = f"{next(_ids)}x{int(time.time() * 1000) % 10**8}"
    topic, group = f"T{name}{suffix}", f"G{name}{suffix}"
    await asyncio.to_thread(admin.create_topic, cluster.namesrv_address, topic, brokers=brokers)
    await asyncio.to_thread(admin.create_group, cluster.namesrv_address, group, brokers=brokers)
    return suffix, topic, group


def mqadmin(namesrv: str, *args: str) -> tuple[str, str]:
    """One run of the real mqadmin: its standard output and error. A command that failed
    exits 0 too and prints the exception on its error output."""
    done = run_mqadmin(namesrv, *args)
    return done.stdout, done.stderr


# A row of consumerConnection: "<client id> <address> <language> <version>".
_ROW = re.compile(r"^(\S+)\s+(\S+:\d+)\s+([A-Z_]+)\s+(V\d\S*)\s*$", re.M)


def connections(namesrv: str, group: str) -> list[tuple[str, str, str]]:
    """The clients ``mqadmin consumerConnection -g group`` lists: (id, language, version);
    none when the brokers say the group is not online."""
    out, err = mqadmin(namesrv, "consumerConnection", "-g", group)
    if "not online" in err or "not online" in out:
        return []
    assert "Exception" not in err, err
    return [(m[1], m[3], m[4]) for m in _ROW.finditer(out)]


def wait_for_rows(namesrv: str, *args: str, timeout_s: float = 60.0) -> str:
    """The output of an mqadmin command once it lists something (its error output empty of
    exceptions), polling while the brokers say there is nothing yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        out, err = mqadmin(namesrv, *args)
        if "Exception" not in err and out.strip():
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"mqadmin {' '.join(args)} listed nothing:\n{out}\n{err}")
        time.sleep(1.0)  # the next try starts a JVM: a pause between tries is the bound


async def wait_for_connections(namesrv, group, want, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    listed: list[tuple[str, str, str]] = []
    while time.monotonic() < deadline:
        listed = await asyncio.to_thread(connections, namesrv, group)
        if want(listed):
            return listed
        await asyncio.sleep(1.0)
    raise AssertionError(f"consumerConnection -g {group} never became right: {listed}")


@pytest.mark.timeout(400)
async def test_consumers_through_two_proxies_are_listed_by_mqadmin(
    real_cluster, start_proxy, tmp_path
):
    namesrv = real_cluster.namesrv_address
    suffix, topic, group = await fresh_topic_and_group(real_cluster, "tools")
    first = await start_proxy(mode="notify", namesrv=namesrv)
    second = await start_proxy(mode="notify", namesrv=namesrv)
    endpoints = {"python": f"127.0.0.1:{first.grpc_port}", "java": f"127.0.0.1:{second.grpc_port}"}

    def consume(lang: str) -> dict:
        return run_client(
            lang, "consume", "--endpoint", endpoints[lang], "--group", group, "--topic", topic,
            "--await-seconds", 5, "--expect", 1, "--ack", "--max-rounds", 1000,
            timeout=240, home=tmp_path / lang,
        )  # fmt: skip

    consumers = [asyncio.create_task(asyncio.to_thread(consume, lang)) for lang in endpoints]
    producer = LeanClient(endpoints["python"], "tools-producer")
    # A third proxy, drained while its client is connected.
    third = await start_proxy(mode="notify", namesrv=namesrv)
    lean_id = f"tools-lean-{suffix}"
    lean = SettingsClient(f"127.0.0.1:{third.grpc_port}", lean_id)
    lean_producer_id = f"tools-producer-{suffix}"
    lean_producer = SettingsClient(endpoints["java"], lean_producer_id)
    try:
        await lean.prepare(group, topic, 1000)
        listed = await wait_for_connections(namesrv, group, lambda rows: len(rows) == 3)
        assert sorted(lang for _, lang, _ in listed) == ["JAVA", "PYTHON", "PYTHON"], listed
        assert all(version.startswith("V5_") for _, _, version in listed), listed
        java_id, _, java_version = next(r for r in listed if r[1] == "JAVA")
        assert java_version == "V5_2_0", listed  # the Java client 5.2.0

        out, err = await asyncio.to_thread(
            mqadmin, namesrv, "consumerStatus", "-g", group, "-i", java_id
        )
        assert "Exception" not in err, err
        assert re.search(r"PROP_CONSUME_TYPE\s*:\s*CONSUME_ACTIVELY", out), out
        assert re.search(r"PROP_CLIENT_VERSION\s*:\s*5\.2\.0", out), out
        assert topic in out.split("#Consumer Subscription#")[1], out
        # With its thread stacks (-s): asked of the client over its Telemetry stream.
        out, err = await asyncio.to_thread(
            mqadmin, namesrv, "consumerStatus", "-g", group, "-i", java_id, "-s", "true"
        )
        assert "Exception" not in err, err
        stacks = out.split("#Consumer jstack#")[1]
        assert "did not answer" not in stacks and "Thread" in stacks, out

        # A producer of the topic, listed under the topic as its group (as through the
        # Apache proxy, a 5.x producer's group is its topic).
        await lean_producer.open(producer_settings([topic]))
        produced = await asyncio.to_thread(
            wait_for_rows, namesrv, "producerConnection", "-g", topic, "-t", topic
        )
        assert lean_producer_id in produced and "PYTHON" in produced, produced

        await third.stop()  # a drain: its client leaves the list at once
        listed = await wait_for_connections(
            namesrv, group, lambda rows: len(rows) == 2, timeout_s=30
        )
        assert lean_id not in {r[0] for r in listed}, listed
        # A message at a time until each consumer had its one and stopped.
        deadline = time.monotonic() + 120
        while not all(c.done() for c in consumers) and time.monotonic() < deadline:
            sent = await producer.send(topic, b"tools")
            assert sent.status.code == pb.Code.OK, sent.status
            await asyncio.sleep(0.5)
        for consumer in consumers:
            assert len((await consumer)["messages"]) >= 1
        # Stopped clients leave the list at once (their streams ended: unregistered).
        await wait_for_connections(namesrv, group, lambda rows: rows == [], timeout_s=30)
    finally:
        for consumer in consumers:
            if not consumer.done():
                consumer.cancel()
        await producer.close()
        await lean.close()
        await lean_producer.close()


def progress_diff(namesrv: str, group: str, topic: str) -> tuple[int, str]:
    """The sum of the #Diff column of ``mqadmin consumerProgress -g group -t topic``."""
    out, err = mqadmin(namesrv, "consumerProgress", "-g", group, "-t", topic)
    assert "Exception" not in err, err
    lines = [line.split() for line in out.splitlines() if line.strip()]
    total = 0
    for cols in lines:
        if cols and cols[0] == topic:
            total += int(cols[-3])  # ... #Diff #Inflight #LastTime
    return total, out


@pytest.mark.timeout(300)
async def test_the_lag_metric_matches_consumer_progress(real_cluster, start_proxy):
    namesrv = real_cluster.namesrv_address
    suffix, topic, group = await fresh_topic_and_group(real_cluster, "lag")
    app = await start_proxy(mode="notify", namesrv=namesrv)
    endpoint = f"127.0.0.1:{app.grpc_port}"
    consumer = SettingsClient(endpoint, f"lag-consumer-{suffix}")
    producer = LeanClient(endpoint, f"lag-producer-{suffix}")
    try:
        await consumer.prepare(group, topic, 1000)
        # The group consumes once, so that the brokers hold its offsets from here on.
        await consumer.receive(group, topic, await_ms=1000, batch=32)

        async def matches() -> tuple[float | None, int, str]:
            """Our figure and consumerProgress's, once they agree within one refresh (the
            brokers commit a POP group's offsets a moment after its pops), or after 30 s."""
            deadline = time.monotonic() + 30
            while True:
                await app.lag.refresh_once()
                lag = app.lag.lag.get((group, topic))
                ours = None if lag is None else lag.messages
                theirs, out = await asyncio.to_thread(progress_diff, namesrv, group, topic)
                if ours == theirs or time.monotonic() > deadline:
                    return ours, theirs, out
                await asyncio.sleep(2)

        first_sent = time.time()
        for i in range(12):
            sent = await producer.send(topic, f"lag-{i}".encode())
            assert sent.status.code == pb.Code.OK, sent.status
        ours, theirs, out = await matches()
        assert ours == theirs == 12, (ours, theirs, out)
        # The oldest of the 12 is as old as the time since the first was sent, at most.
        oldest = app.lag.lag[(group, topic)].oldest_s
        assert 0 < oldest <= time.time() - first_sent + 0.05, oldest

        got = 0
        deadline = time.monotonic() + 60
        while got < 12 and time.monotonic() < deadline:
            answer = await consumer.receive(group, topic, await_ms=1000, batch=32)
            if answer.messages:
                got += len(answer.messages)
                acked = await consumer.ack(group, topic, answer.messages)
                assert acked.status.code == pb.Code.OK, acked.status
        assert got == 12
        ours, theirs, out = await matches()
        assert ours == theirs, (ours, theirs, out)
        assert ours is not None and ours < 12
    finally:
        await consumer.close()
        await producer.close()
