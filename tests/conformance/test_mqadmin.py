"""Third-party proof of the stub: Apache's own admin tool (``mqadmin``, one JVM per
command) against ``rmq-namesrv-stub`` + ``rmq-broker-stub`` processes on loopback.

Stub-only by nature. ``topicRoute`` also runs once against the real cluster, and both
outputs are read by the same assertions.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocketmq_local.launcher import mqadmin as run_mqadmin

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 15.0


def mqadmin(namesrv: str, *args: str) -> str:
    """Run one mqadmin command (bounded); its standard output. Fails on a non-zero exit."""
    done = run_mqadmin(namesrv, *args)
    # mqadmin exits 0 even when its command failed: a failure shows as an exception.
    assert done.returncode == 0, f"mqadmin {args[0]} exited {done.returncode}:\n{done.stderr}"
    assert "Exception" not in done.stderr, f"mqadmin {args[0]} failed:\n{done.stderr}"
    return done.stdout


class StubProcess:
    """A console script of ours as a process; its address from its ready line."""

    def __init__(self, script: str, *args: str) -> None:
        code = f"import sys; from broker_stub.cli import {script}; {script}(sys.argv[1:])"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
        self.address = self._wait_ready()

    def _wait_ready(self) -> str:
        import selectors

        deadline = time.monotonic() + READY_TIMEOUT_S
        stdout = self.proc.stdout
        assert stdout is not None  # PIPE
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=0.2):
                    line = stdout.readline()
                    match = re.search(r"listening on (\S+:\d+)", line)
                    if match:
                        return match.group(1)
                    if not line:
                        break
        self.stop()
        raise AssertionError("stub process did not report ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def stub_processes():
    started: list[StubProcess] = []
    try:
        namesrv = StubProcess("namesrv_main")
        started.append(namesrv)
        for name in ("broker-a", "broker-b"):
            started.append(
                StubProcess(
                    "broker_main",
                    "--name",
                    name,
                    "--namesrv",
                    namesrv.address,
                    "--register-interval",
                    "1",
                )
            )
        yield namesrv.address, {p.address for p in started[1:]}
    finally:
        for proc in reversed(started):
            proc.stop()


def route_json(output: str) -> dict:
    """topicRoute prints the TopicRouteData JSON (pretty-printed, maybe unquoted id keys)."""
    text = output[output.index("{") : output.rindex("}") + 1]
    return json.loads(re.sub(r"([{,]\s*)(\d+)(\s*:)", r'\1"\2"\3', text))


def check_route(route: dict, topic_brokers: dict[str, str], queues: int) -> None:
    datas = route["brokerDatas"]
    assert {d["brokerName"]: d["brokerAddrs"] for d in datas} == {
        name: {"0": addr} for name, addr in topic_brokers.items()
    }
    assert {q["brokerName"]: (q["readQueueNums"], q["writeQueueNums"], q["perm"])
            for q in route["queueDatas"]} == {
        name: (queues, queues, 6) for name in topic_brokers}  # fmt: skip


@pytest.mark.slow
def test_mqadmin_against_the_stub(stub_processes):
    namesrv, broker_addrs = stub_processes
    topic = "AdminTopic"

    out = mqadmin(namesrv, "updateTopic", "-c", "DefaultCluster", "-t", topic, "-r", "3", "-w", "3")
    assert sorted(re.findall(r"create topic to (\S+) success", out)) == sorted(broker_addrs)

    # The brokers re-register at once when a topic is created; the route lists both.
    deadline = time.monotonic() + 10
    while True:
        out = mqadmin(namesrv, "topicRoute", "-t", topic)
        route = route_json(out)
        if len(route["brokerDatas"]) == 2 or time.monotonic() > deadline:
            break
    brokers = {d["brokerName"]: d["brokerAddrs"]["0"] for d in route["brokerDatas"]}
    assert set(brokers.values()) == broker_addrs
    check_route(route, brokers, 3)

    out = mqadmin(namesrv, "clusterList")
    rows = [line.split() for line in out.splitlines() if line.startswith("DefaultCluster")]
    assert sorted((r[1], r[2], r[3]) for r in rows) == sorted(
        (name, "0", addr) for name, addr in brokers.items()
    )
    assert all(r[4] == "V5_3_3" for r in rows)

    out = mqadmin(namesrv, "topicStatus", "-t", topic)
    rows = [line.split() for line in out.splitlines() if line.startswith("broker-")]
    assert sorted((r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows) == sorted(
        (name, q, 0, 0) for name in brokers for q in range(3)
    )


@pytest.mark.real
@pytest.mark.slow
def test_mqadmin_topic_route_against_the_real_cluster(real_cluster):
    """The same reading of ``topicRoute`` holds for a real name server."""
    topic = f"AdminTopic-{os.getpid()}-{int(time.time())}"
    real_cluster.create_topic(topic, 3)
    route = route_json(mqadmin(real_cluster.namesrv_address, "topicRoute", "-t", topic))
    check_route(route, {b.name: b.address for b in real_cluster.brokers}, 3)
