"""The soak, short (about a minute and a half), in the test suite: broker stubs, two proxy
processes, faults that lose nothing on stubs (proxy SIGKILL and restart, broker
SIGSTOP/SIGCONT, name server killed and restarted, clients killed mid-poll and mid-ack).
A killed stub broker loses its messages by design, so that fault runs in ``make soak``
only (docs/reliability.md)."""

from __future__ import annotations

import json

import pytest

from bench.soak import run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
async def test_a_short_soak_on_stubs_loses_nothing():
    report = await run(
        "stub", 40, seed=7, faults=["proxy", "stop", "namesrv", "client"], rate=10,
        drain_s=90, interval=8,
    )  # fmt: skip
    print(json.dumps(report, indent=1))  # shown whole when an assertion below fails
    assert report["confirmed"] > 100, report
    assert len(report["faults"]) >= 4, report["faults"]
    assert report["lost"] == 0, report
    assert report["late_calls"] == 0, report  # every call answered within its deadline
    # Every message was acked, but for those whose ack got no answer during a fault, or an
    # answer PROXY_TIMEOUT (the broker may have applied it); those are at most a few batches.
    assert report["acked"] + report["ack_unknown"] == report["confirmed"], report
    assert report["ack_unknown"] <= 32, report
    for name, after in report["health_after"].items():
        before = report["health_before"][name]
        assert after["in_flight"] == 0, (name, after)
        # A restarted proxy starts again from scratch; a leak shows as growth either way.
        assert after["tasks"] <= before["tasks"] + 5, (name, before, after)
        assert after["fds"] <= before["fds"] + 20, (name, before, after)
        assert after["rss_mb"] <= before["rss_mb"] * 2, (name, before, after)
