"""Failures users report of the Apache proxy, done as the reporter did them, through this
proxy with the official Python PushConsumer on real RocketMQ 5.5.0 brokers, asserting the
right behaviour. (#9583, an ack after ChangeInvisibleDuration, is
``scenarios.change_invisible_then_ack``; apache/rocketmq-clients#1344, un-acked messages
that never come back, is ``scenarios.redelivery_without_ack``; #10784, messages without a
receipt handle, is counted by every soak: ``receipts_without_handle``.)

Each test runs its own proxies (the suite's pool is shared) on the session's real brokers,
with 10 s renewal slices (``harness.RENEW_SLICE_MS``), and a PushConsumer of the Python
driver's ``soak`` command, whose events say when each message reached the listener.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from rocketmq_local import admin
from testkit.official.harness import (
    RENEW_SLICE_MS,
    driver_command,
    run_client,
    start_proxy,
)
from testkit.waits import wait_for

pytestmark = [pytest.mark.interop, pytest.mark.real, pytest.mark.slow, pytest.mark.timeout(240)]

CONSUME_S = 25  # the listener's time: longer than a slice, so the proxy renews
# A message the brokers make visible again comes back within this of its invisible time
# ending: the real broker's revive scan and the consumer's next poll.
REDELIVERY_MARGIN_S = 12


class PushConsumer:
    """The Python driver's soak push role, events read from its file."""

    def __init__(
        self, home: Path, endpoints: str, topic: str, group: str, consume_s: int = CONSUME_S
    ) -> None:
        home.mkdir(parents=True)
        self.control = home / "control"
        self.control.mkdir()
        self.events_path = home / "events.jsonl"
        env = dict(os.environ, HOME=str(home))
        env.pop("PYTHONPATH", None)
        argv = ["soak", "--endpoints", endpoints, "--role", "push", "--topic", topic,
                "--group", group, "--control-dir", str(self.control),
                "--consume-ms", str(consume_s * 1000)]  # fmt: skip
        self.home = home
        with self.events_path.open("wb") as out, (home / "stderr.log").open("wb") as err:
            self.proc = subprocess.Popen(
                [*driver_command("python", home), *argv],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=home,
            )  # fmt: skip

    def events(self, kind: str) -> list[dict]:
        lines = self.events_path.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["ev"] == kind]

    def client_log(self) -> list[str]:
        path = self.home / "logs" / "rocketmq_python" / "rocketmq_client.log"
        return path.read_text(errors="replace").splitlines() if path.exists() else []

    def wait(self, until, timeout: float, what: str) -> None:
        def done() -> bool:
            if until():
                return True
            assert self.proc.poll() is None, f"the push consumer exited: {self.proc.returncode}"
            return False

        wait_for(
            done, timeout, step=0.5, what=lambda: f"{what}: {self.events_path.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        (self.control / "stop").touch()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _fresh(namesrv: str, broker: tuple[str, str]) -> tuple[str, str]:
    """A topic on one broker and a group."""
    topic, group = f"upstream-{uuid.uuid4().hex[:8]}", f"upstream-{uuid.uuid4().hex[:8]}"
    admin.create_topic(namesrv, topic, brokers=dict([broker]))
    admin.create_group(namesrv, group)
    return topic, group


def _produce(tmp_path: Path, proxy: str, topic: str, count: int) -> list[str]:
    out = run_client("python", "produce", "--endpoint", proxy, "--topic", topic,
                     "--count", count, "--body-prefix", "m", timeout=40,
                     home=tmp_path / "producer")  # fmt: skip
    assert len(out["ids"]) == count, out
    return [f"m-{i}" for i in range(count)]


def test_a_proxy_crash_brings_renewed_messages_back_within_a_slice(real_cluster, tmp_path):
    """apache/rocketmq#10278 (and issue 23): the proxy renewing a push consumer's messages
    dies (SIGKILL) while the listener still consumes them. Nothing is lost: each comes back
    within one renewal slice of the crash (the Apache proxy's renewals of 1, 3, 5, 10 min
    keep a long-consumed message invisible for minutes), and is consumed again to success
    through the proxy left. The first consumptions' acks, made with handles the renewals
    replaced, settle nothing: each message is consumed twice, as at-least-once allows."""
    namesrv = real_cluster.namesrv_address
    broker = real_cluster.brokers[0]
    topic, group = _fresh(namesrv, (broker.name, broker.address))
    a = start_proxy(tmp_path / "proxy-a", (), namesrv=namesrv)
    b = start_proxy(tmp_path / "proxy-b", (), namesrv=namesrv)
    consumer = None
    try:
        # The Python client sorts its endpoints and keeps to the first: that proxy renews.
        renewing, other = sorted([a, b], key=lambda p: p.grpc)
        consumer = PushConsumer(tmp_path / "push", f"{a.grpc};{b.grpc}", topic, group)
        consumer.wait(lambda: consumer.events("ready"), 60, "no ready")
        ids = _produce(tmp_path, other.grpc, topic, 3)
        consumer.wait(lambda: len(consumer.events("recv")) >= 3, 30, "not delivered")
        time.sleep(RENEW_SLICE_MS / 1000 + 3)  # past a slice: renewed at least once
        assert not consumer.events("consumed")  # still in the listener
        os.kill(renewing.pid, signal.SIGKILL)
        renewing.proc.wait(10)
        killed = time.time()
        consumer.wait(
            lambda: (
                {e["id"] for e in consumer.events("recv") if e["t"] / 1000 > killed} >= set(ids)
            ),
            RENEW_SLICE_MS / 1000 + REDELIVERY_MARGIN_S + 30,
            "not all redelivered after the crash",
        )
        back: dict[str, float] = {}
        for e in consumer.events("recv"):
            if e["t"] / 1000 > killed:
                back.setdefault(e["id"], e["t"] / 1000 - killed)
        assert max(back.values()) <= RENEW_SLICE_MS / 1000 + REDELIVERY_MARGIN_S, back
        assert all(e["attempt"] >= 2 for e in consumer.events("recv") if e["t"] / 1000 > killed)
        # Consumed to success, every one, after the crash.
        consumer.wait(
            lambda: (
                [e["id"] for e in consumer.events("consumed")].count(ids[0]) >= 2
                and {e["id"] for e in consumer.events("consumed")} >= set(ids)
            ),
            2 * CONSUME_S + 20,
            "not consumed",
        )
    finally:
        if consumer is not None:
            consumer.stop()
        for proxy in (a, b):
            if proxy.proc.poll() is None:
                proxy.stop()


def test_an_ack_retried_while_the_first_is_in_flight_settles_the_renewed_message(
    real_cluster, tmp_path, monkeypatch
):
    """apache/rocketmq#11174: a push consumer's ack of a message the proxy renewed does not
    go through (its broker does not answer in time: SIGSTOP), and the client retries it
    with the handle it holds, which the renewals replaced. The Apache proxy has dropped the
    renewed handle by then; this one used to as well, while the first ack was in flight, and
    answered the retry that the handle had expired, so the Python client gave up ("failed
    to ack message due to the invalid receipt handle, give up retrying"). Here every retry
    gets the current checkpoint: no ack is refused, and once the broker runs again the
    message is settled, delivered once.

    Renewal slices of 30 s and a listener of 33 s: renewed once, 20-25 s in, so that no
    renewal is in flight when the broker stops (a renewal the broker applies after the
    proxy gave up on it leaves a checkpoint nobody knows: a second delivery)."""
    monkeypatch.setenv("RMQ_PROXY_RECEIVE_RENEW_SLICE_MS", "30000")
    consume_s = 33
    namesrv = real_cluster.namesrv_address
    broker = real_cluster.brokers[0]
    topic, group = _fresh(namesrv, (broker.name, broker.address))
    proxy = start_proxy(tmp_path / "proxy", (), namesrv=namesrv)
    consumer = None
    try:
        consumer = PushConsumer(tmp_path / "push", proxy.grpc, topic, group, consume_s)
        consumer.wait(lambda: consumer.events("ready"), 60, "no ready")
        (message,) = _produce(tmp_path, proxy.grpc, topic, 1)
        consumer.wait(lambda: consumer.events("recv"), 30, "not delivered")
        started = consumer.events("recv")[0]["t"] / 1000
        # Stopped from just before the listener returns until the ack's retries went by.
        time.sleep(max(0.0, started + consume_s - 1.5 - time.time()))
        os.kill(broker.process.pid, signal.SIGSTOP)
        try:
            consumer.wait(lambda: consumer.events("consumed"), 10, "listener did not end")
            time.sleep(4)  # the ack times out at the client (3 s), which retries
        finally:
            os.kill(broker.process.pid, signal.SIGCONT)
        # Long enough for the renewed checkpoint to run out had no ack counted.
        time.sleep(30 + REDELIVERY_MARGIN_S)
        recvs = [e for e in consumer.events("recv") if e["id"] == message]
        assert len(recvs) == 1, recvs
        refused = [line for line in consumer.client_log() if "invalid receipt handle" in line]
        assert not refused, refused
    finally:
        if consumer is not None:
            consumer.stop()
        proxy.stop()
