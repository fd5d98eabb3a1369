"""A rolling restart with what production turns on together (issue 58): two proxies, each
with two workers, the remoting port, a users file, registrations (the default) and gRPC
connections that age, behind readiness-following balancers, in front of the session's real
brokers. While they are restarted in turn (out of the balancers, SIGTERM: the drain, started
again on the same ports), official clients of both ports send and consume, every request
signed: the Python client (5.1.2, gRPC) and the Java client's 4.x API (remoting). Nothing
sent is lost, and no client sees an error but the one gRPC itself can make of a call that
crosses its connection's end (docs/reliability.md, "Drain"), at most one per drain.

The plain rolling restart of the remoting clients, without these settings and with the C++
client, is ``test_remoting_clients.py``; the stub-backed fleet soak with Java and Node too
(they cannot sign) is ``bench/tests/test_soak_official_short.py``."""

from __future__ import annotations

import concurrent.futures
import uuid
from pathlib import Path

import pytest

from rocketmq_local import admin
from testkit.balancer import BalancerThread
from testkit.official.harness import ProxyProcess, run_client, start_proxy
from testkit.official.remoting_driver import JAVA
from testkit.soak_checks import (
    CROSSED_A_CONNECTION_END,
    KNOWN_CLIENT_ERRORS,
    PYTHON_PUSH_SECOND_LINE,
)
from tests.interop.conftest import PRODUCTION_USER, PRODUCTION_USERS, production_env
from tests.support.ports import free_port

pytestmark = pytest.mark.real

# What production turns on (tests/interop/conftest.py PRODUCTION_CONFIG), with the
# connection age a fleet runs (docs/configuration.md: 10 s): each drain waits for its
# clients' connections to age, so the restarts take about that long each.
CONFIG = """
workers = 2
remoting_advertise_address = "{remoting}"
grpc_max_connection_age_s = 10.0
[security]
users_file = "{users}"
"""
# A drain lasts until every connection has aged (10 s, plus gRPC's 10 %) and its calls
# ended; the stop after it is the server's grace at most.
DRAIN_TIMEOUT_S = 40.0
COUNT = 60
INTERVAL_MS = 500  # 30 s of sending: both restarts fall inside it
SIGNED = ("--access-key", PRODUCTION_USER[0], "--secret-key", PRODUCTION_USER[1])


@pytest.mark.timeout(420)
def test_a_rolling_restart_in_the_production_profile_loses_nothing(real_cluster, tmp_path):
    namesrv = real_cluster.namesrv_address
    public = ("grpc", "remoting")
    ports = [{name: free_port() for name in ("http", *public)} for _ in range(2)]
    front = BalancerThread(
        [[(f"127.0.0.1:{p[name]}", f"127.0.0.1:{p['http']}") for p in ports] for name in public]
    )
    balanced = dict(zip(public, front.start(), strict=True))
    users = tmp_path / "users.toml"
    users.write_text(PRODUCTION_USERS)
    config = tmp_path / "proxy.toml"
    config.write_text(CONFIG.format(remoting=balanced["remoting"], users=users))

    def start(n: int) -> ProxyProcess:
        mine = ports[n]
        args = ("--config", str(config), "--grpc-port", str(mine["grpc"]), "--remoting-port",
                str(mine["remoting"]), "--http-port", str(mine["http"]))  # fmt: skip
        return start_proxy(tmp_path / f"proxy-{n}", (), namesrv=namesrv, extra_args=args)

    tag = uuid.uuid4().hex[:8]
    grpc_topic, remoting_topic = f"prod-g-{tag}", f"prod-r-{tag}"
    for topic in (grpc_topic, remoting_topic):
        admin.create_topic(namesrv, topic)
    admin.create_group(namesrv, f"prod-gc-{tag}")

    def python(home: str, *args: str | int) -> dict:
        return run_client("python", *args, timeout=150, home=tmp_path / home, env=production_env)

    def java(home: str, command: str, group: str, topic: str, *more: str | int):
        return JAVA.start(tmp_path / home, command, "--namesrv", balanced["remoting"],
                          "--group", group, "--topic", topic, *SIGNED, *more)  # fmt: skip

    proxies = [start(0), start(1)]
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        grpc_push = pool.submit(
            python, "py-push", "push", "--endpoint", balanced["grpc"],
            "--group", f"prod-gc-{tag}", "--topic", grpc_topic, "--expect", COUNT,
            "--deadline-seconds", 140,
        )  # fmt: skip
        java_push = java("java-push", "push", f"prod-rc-{tag}", remoting_topic, "--expect",
                         COUNT, "--seconds", 150)  # fmt: skip
        grpc_sending = pool.submit(
            python, "py-produce", "produce", "--endpoint", balanced["grpc"], "--topic",
            grpc_topic, "--count", COUNT, "--interval-ms", INTERVAL_MS, "--body-prefix", "m",
        )  # fmt: skip
        java_sending = java("java-produce", "produce", f"prod-rp-{tag}", remoting_topic,
                            "--count", COUNT, "--interval-ms", INTERVAL_MS)  # fmt: skip
        front.roll(proxies, start, DRAIN_TIMEOUT_S)
        assert not grpc_sending.done(), "the Python producer ended before the restarts did"
        assert java_sending.proc.poll() is None, "the Java producer ended before the restarts"
        java_sent = java_sending.result(90)
        grpc_sent = grpc_sending.result(90)
        java_got = java_push.result(150)
        grpc_got = grpc_push.result(150)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        complaints = [proxy.stop(DRAIN_TIMEOUT_S) for proxy in proxies]
        front.stop()
    assert complaints == [None, None], [proxy.logs() for proxy in proxies]
    expected = {f"m-{i}" for i in range(COUNT)}
    # The 4.x client sends a cut send again itself (answered GO_AWAY, or its connection
    # closed), through the balancer to the other proxy: no error at all.
    assert java_sent["errors"] == [] and len(java_sent["sent"]) == COUNT, java_sent["errors"]
    assert {m["body"] for m in java_got["messages"]} == expected
    assert java_got["errors"] == []
    # The Python client, with gRPC's retries off, can fail a send that crosses a GOAWAY;
    # its application sends it again (the driver's --interval-ms).
    assert len(grpc_sent["ids"]) >= COUNT
    crossed = [e for e in grpc_sent["errors"] if any(k in e for k in CROSSED_A_CONNECTION_END)]
    assert crossed == grpc_sent["errors"] and len(crossed) <= 2, grpc_sent["errors"]
    # At least once: a push consumer's message renewed by one worker and settled through a
    # connection that aged onto the other can come twice (docs/configuration.md).
    assert {m["body"] for m in grpc_got["messages"]} >= expected
    assert grpc_got["errors"] == []
    # What tells a drain from a crash: a SIGKILL of the proxies loses nothing either (the
    # clients retry, popped messages come back), but the clients log it, the Python
    # PushConsumer its failed receives at ERROR, the Java one its failed pulls at WARN.
    # Through drains, their logs hold nothing but the known line and crossed calls.
    for home in ("py-push", "py-produce"):
        log = tmp_path / home / "logs" / "rocketmq_python" / "rocketmq_client.log"
        errors = [e for e in _python_errors(log) if not any(k in e for k in KNOWN_CLIENT_ERRORS)]
        crossed = [e for e in errors if any(k in e for k in CROSSED_A_CONNECTION_END)]
        assert errors == crossed, "\n\n".join(errors[:5])
        # The PushConsumer logs one failed receive twice: as the stream's error, then as
        # "process received message error". At most one crossed call per drain.
        second = sum(PYTHON_PUSH_SECOND_LINE in e for e in crossed)
        assert max(len(crossed) - second, second) <= 2, "\n\n".join(crossed)
    for home in ("java-push", "java-produce"):
        log = tmp_path / home / "logs" / "rocketmqlogs" / "rocketmq_client.log"
        # A drain costs the Java push consumer pulls that fail on its new connection until
        # its heartbeat has registered it there ("CODE: 24 the consumer's group info not
        # exist", each pulled again 3 s later: a delay, issue 58's closing note), and sends
        # to the connection that closed; a proxy that is not ready for it, after a crash,
        # answers "not known to the proxy".
        noisy = [line for line in _lines(log) if " ERROR " in line or "known to the pro" in line]
        assert noisy == [], "\n".join(noisy[:5])


def _python_errors(path: Path) -> list[str]:
    """The Python client's ERROR entries, each with the lines after it: it logs a gRPC
    error's status and details there, which tell a crossed call from another."""
    lines = _lines(path)
    return ["\n".join(lines[i : i + 4]) for i, line in enumerate(lines) if "[ERROR]" in line]


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []
