"""End to end: two real proxies (in-process ProxyApps, gRPC on loopback) in front of stub
brokers serve a scripted workload; their event logs go through ``rmq-polling-report``; the
counts match what the workload did, and a real Pushgateway holds the latest window."""

from __future__ import annotations

import asyncio
import time

import pytest
from pyspark.sql import functions as F

from polling_report.cli import main
from proxy.api.v2 import definition_pb2 as pb
from testkit.waits import wait_until
from tests.analytics.conftest import pushed
from tests.support.brokers import send_to

pytestmark = pytest.mark.slow

G, T = "G", "T"
P = "rocketmq_polling_report_"


async def test_proxy_event_logs_aggregate_to_what_the_workload_did(
    start_proxy, lean, spark, tmp_path, pushgateway, capsys
):
    log_dir = tmp_path / "events"
    a = await start_proxy(mode="notify", brokers=3, event_log_dir=str(log_dir))
    b = await start_proxy(
        mode="notify", namesrv=a.cluster.namesrv_address, event_log_dir=str(log_dir)
    )
    ca, cb = lean(a), lean(b)

    # Proxy a: four long polls.
    await send_to(a, "broker-a", b"one")
    await send_to(a, "broker-a", b"two")
    hit = await ca.receive(G, T, await_ms=1000, broker="broker-a")  # first pop finds 2
    assert len(hit.messages) == 2
    empty = await ca.receive(G, T, await_ms=400, broker="broker-a")  # nothing anywhere
    assert empty.status == pb.Code.MESSAGE_NOT_FOUND
    poll = asyncio.ensure_future(ca.receive(G, T, await_ms=3000, broker="broker-a"))
    await wait_until(lambda: a.engine.hub.watchers == 3)  # past its first pop, watching
    await send_to(a, "broker-c", b"three")  # lands elsewhere while the poll waits
    assert len((await poll).messages) == 1
    bad = await ca.receive(G, T, await_ms=1000, invisible_ms=1000)  # refused
    assert bad.status == pb.Code.ILLEGAL_INVISIBLE_TIME
    # Proxy b: two short polls (100 ms asked, under the 200 ms minimum of a long poll).
    await send_to(a, "broker-b", b"four")
    short_hit = await cb.receive(G, T, await_ms=100, broker="broker-b")
    assert len(short_hit.messages) == 1
    assert (await cb.receive(G, T, await_ms=100)).status == pb.Code.MESSAGE_NOT_FOUND
    # Alone in the latest window: one more short poll on b, more than a second later.
    await asyncio.sleep(1.1)
    before = time.time()
    assert (await cb.receive(G, T, await_ms=100)).status == pb.Code.MESSAGE_NOT_FOUND
    after = time.time()

    await a.stop()  # completes the event-log files
    await b.stop()

    out = str(tmp_path / "out")
    # Windows of 1 s; with the default lateness of 2 minutes none is complete yet, so the
    # newest window is the one shown and pushed.
    args = [str(log_dir), "--out", out, "--window", "1s"]
    assert main([*args, "--pushgateway", pushgateway]) == 0
    report = capsys.readouterr().out
    assert "7 records, 0 malformed lines" in report
    assert "(none complete yet: it may still grow)" in report

    # Over all windows, per proxy and for the fleet.
    stored = spark.read.parquet(out)
    counts = ("requests", "long_polls", "short_poll_hits", "found", "messages")
    totals = {
        r["proxy"]: tuple(r[c] for c in counts)
        for r in stored.groupBy("proxy").agg(*(F.sum(c).alias(c) for c in counts)).collect()
    }
    #        requests long polls hits found messages
    assert totals == {
        a.config.proxy_id: (4, 4, 1, 2, 3),
        b.config.proxy_id: (3, 0, 1, 1, 1),
        "_fleet": (7, 4, 2, 3, 4),
    }
    assert {r["group"] for r in stored.select("group").distinct().collect()} == {G}
    assert {r["mode"] for r in stored.select("mode").distinct().collect()} == {"notify"}

    # The Pushgateway holds the newest window: b's last poll alone, per proxy and fleet.
    got = pushed(pushgateway)
    rows = {dict(lbl)["proxy"] for name, lbl in got if name == P + "requests"}
    assert rows == {b.config.proxy_id, "_fleet"}
    for proxy in rows:
        labels = dict(proxy=proxy, group=G, topic=T, mode="notify")
        assert got[(P + "requests", frozenset(labels.items()))] == 1
        assert got[(P + "request_rate", frozenset(labels.items()))] == 1
        assert got[(P + "long_poll_share", frozenset(labels.items()))] == 0
        assert got[(P + "short_poll_hit_ratio", frozenset(labels.items()))] == 0
        assert got[(P + "found_ratio", frozenset(labels.items()))] == 0
        assert (P + "broker_requests_per_message", frozenset(labels.items())) not in got
    # Seven requests are too few to judge: the proxy's default threshold is recommended.
    assert got[(P + "recommended_threshold_rps", frozenset({"group": G, "topic": T}.items()))] == 50
    assert got[(P + "records", frozenset())] == 7
    assert got[(P + "malformed_lines", frozenset())] == 0
    window_end = got[(P + "window_end_timestamp_seconds", frozenset())]
    # The end of the whole second in which that poll arrived.
    assert int(before) + 1 <= window_end <= int(after) + 1
