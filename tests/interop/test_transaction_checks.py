"""Orphaned transactions of several official producers of one topic, on the session's real
RocketMQ 5.5.0 brokers at their default ``transactionCheckMax`` (15), through ours (one
worker, and two) and through the Apache proxy: every half message is ended at its
broker's first check.

A broker takes a producer group's channels in turn for its checks, and counts each check
against ``transactionCheckMax`` whether a producer answered it or not. Ours names each
registered producer under its group on a connection of its own, beside the connection its
transaction processor heartbeats on; a check that lands on a connection that drops it is
answered only at a later check, or never. The committed message says which check ended it
(``TRANSACTION_CHECK_TIMES``, kept from the half message by the broker's end of the
transaction), so the test reads every committed copy straight from the brokers: the
lowest number of each message must be 1. A second copy (a later check answered too, as
at-least-once allows) may carry 2.

The Apache proxy names a new producer group to the brokers only at its next transaction
heartbeat (``transactionHeartbeatPeriodSecond``, 20 s), and a check before that finds no
channel. The test brokers check every second, so 15 checks run out in 15 s and a half
message sent at once would be discarded: its producers start ``APACHE_WARM_UP_S`` before
they send. (At the brokers' default interval, 30 s, the first check comes after the
heartbeat.) Ours names a group at once, so its producers send as soon as they start.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid

import pytest

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.headers import INIT_MODE_MIN
from proxy.remoting.message import Prop
from rocketmq_local import admin
from testkit.metrics_text import samples
from tests.interop.conftest import production_env

pytestmark = [pytest.mark.interop, pytest.mark.real, pytest.mark.timeout(300)]

PRODUCERS = 6
PER_PRODUCER = 5
DRIVER_TIMEOUT = 120.0
# The committed copies are read within this long of the driver's end: each was committed
# before its check was answered, so they are all stored by then.
READ_TIMEOUT_S = 30.0
APACHE_WARM_UP_S = 21.0


@pytest.fixture(params=["ours", "ours-production", "apache"])
def peer(request, proxy_pool, real_cluster):
    """(name, gRPC endpoint, metrics address or None, the driver's environment) of the
    proxy under test: ours as the interop tests run it, ours as production runs it (two
    workers, over which the producers' connections spread, the remoting port, a users
    file, connection ages), the Apache proxy."""
    if request.param == "apache":
        apache = request.getfixturevalue("apache_proxy")
        return request.param, apache.grpc_address, None, None
    if request.param == "ours":
        proxy = proxy_pool.get("real", "notify", real_cluster.namesrv_address)
        return request.param, proxy.grpc, proxy.http, None
    proxy = request.getfixturevalue("production_proxy")
    return request.param, proxy.grpc, proxy.http, production_env


def check_outcomes(http: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as response:
        body = response.read()
    return {
        labels["result"]: value
        for labels, value in samples(body, "rocketmq_proxy_transaction_checks_total")
    }


async def committed_check_numbers(namesrv: str, topic: str, ids: set[str]) -> dict[str, list[int]]:
    """For each message id, the TRANSACTION_CHECK_TIMES of every committed copy, popped
    from every broker by a fresh group from the start of the topic."""
    group = f"tx-reader-{uuid.uuid4().hex[:10]}"
    await asyncio.to_thread(admin.create_group, namesrv, group)
    brokers = await asyncio.to_thread(admin.masters, namesrv)
    clients = [BrokerClient(name, address) for name, address in brokers.items()]
    found: dict[str, list[int]] = {}
    deadline = time.monotonic() + READ_TIMEOUT_S
    try:
        while not ids <= set(found) and time.monotonic() < deadline:
            for client in clients:
                result = await client.pop(
                    group, topic, max_nums=32, invisible_ms=300_000, poll_ms=1000,
                    init_mode=INIT_MODE_MIN, timeout=5.0,
                )  # fmt: skip
                for msg in result.messages:
                    times = int(msg.properties.get(Prop.TRANSACTION_CHECK_TIMES, "0"))
                    found.setdefault(msg.properties[Prop.UNIQ_KEY], []).append(times)
    finally:
        for client in clients:
            await client.close()
    return found


def test_every_orphan_is_ended_at_its_first_check(peer, real_cluster, run_client):
    name, endpoint, http, env = peer
    namesrv = real_cluster.namesrv_address
    topic = f"tx-orphans-{uuid.uuid4().hex[:10]}"
    admin.create_topic(namesrv, topic, message_type="TRANSACTION")
    before = check_outcomes(http) if http else {}
    out = run_client(
        "python", "orphans", "--endpoint", endpoint, "--topic", topic,
        "--producers", PRODUCERS, "--count", PER_PRODUCER,
        "--warm-up-seconds", APACHE_WARM_UP_S if name == "apache" else 0,
        "--deadline-seconds", DRIVER_TIMEOUT - 10, timeout=DRIVER_TIMEOUT, env=env,
    )  # fmt: skip
    sent = {m["id"] for m in out["sent"]}
    assert len(sent) == PRODUCERS * PER_PRODUCER, out
    assert sent <= {c["id"] for c in out["checks"]}, f"{name}: not every orphan was checked"
    numbers = asyncio.run(committed_check_numbers(namesrv, topic, sent))
    assert set(numbers) == sent, f"{name}: committed {len(numbers)} of {len(sent)}"
    late = {i: n for i, n in numbers.items() if min(n) != 1}
    assert not late, f"{name}: ended only at a later check (a check was lost): {late}"
    if http:
        after = check_outcomes(http)
        relayed = after.get("relayed", 0) - before.get("relayed", 0)
        assert relayed >= len(sent), (before, after)
        assert after.get("no_producer", 0) == before.get("no_producer", 0), (before, after)
