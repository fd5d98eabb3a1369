"""What the official-client soak's report must show, checked by its short run in the suite
(bench/tests) and by ``make soak`` through make (tests/smoke): none lost, and a rolling
restart costs a client at most a call that crossed its connection's end per drain."""

from __future__ import annotations

# What the Java and Python clients say of a call started on a connection just as its GOAWAY
# arrived: both turn gRPC's retries off, so gRPC fails the call instead of sending it again
# on the next connection. bench/soak_official.py names such an event ``<status>_GOAWAY``.
CROSSED_A_GOAWAY = ("GOAWAY shut down transport", "GOAWAY received")

# Logged at ERROR by a client whatever the server does (docs/reliability.md): the Python
# PushConsumer 5.1.2 reads a settings answer with metrics off through a meter provider it
# never made, once at start.
KNOWN_CLIENT_ERRORS = ("'NoneType' object has no attribute 'get_meter'",)

# What a client reports of a call that crossed the end of its connection inside gRPC, before
# the proxy could see it: gRPC's core cancels a call it had queued when the server stops
# (CANCELLED); the Java and Python clients build their channels with gRPC's retries off
# (``disableRetry`` in rocketmq-client-java 5.2.0, ``grpc.enable_retries`` 0 in
# rocketmq-python-client 5.1.2), so a call started on a connection just as that connection's
# GOAWAY arrives fails where gRPC would otherwise send it again on the next connection
# (``CROSSED_A_GOAWAY``; an event of it is named ``<status>_GOAWAY``).
CROSSED_A_CONNECTION_END = ("CANCELLED", *CROSSED_A_GOAWAY)

# The Python PushConsumer logs one failed receive twice: as the stream's error, then as this.
PYTHON_PUSH_SECOND_LINE = "process received message error"


def assert_every_message_accounted(report: dict, at_least: int) -> None:
    """Each group got at least ``at_least`` messages, every one its topic had: none lost,
    none twice at attempt 1, FIFO order kept, each transaction resolved as meant, and each
    with a receipt handle (#10784)."""
    for name, group in report["groups"].items():
        assert group["expected"] > at_least, (name, group)
        assert group["lost"] == 0, (name, group)
        assert group["attempt1_duplicates"] == [], (name, group)
        assert group.get("fifo_violations", []) == [], (name, group)
        assert group.get("resolved_wrongly", 0) == 0, (name, group)
    assert report["receipts_without_handle"] == 0, report["receipts_without_handle"]


def assert_drains_cost_at_most_crossed_calls(report: dict) -> None:
    """After a rolling restart, no client error but a call that crossed its connection's end
    (``CROSSED_A_CONNECTION_END``), at most one per drain; no ERROR line but those, the known ones
    (``KNOWN_CLIENT_ERRORS``), those after the SIGKILL (``proxy:``), those of a client's
    start, before it said it was ready (``start:``: its first calls, retried until they
    succeeded), and those of a client's own shutdown at the end (``stop:``: the Python
    PushConsumer logs "process received message error" for each receive it cancels as it
    closes its channel). A crossed call is counted once per client whether it was reported
    as an event, logged, or both (a Python PushConsumer's receive and ack are only logged)."""
    rolling = [f for f in report["faults"] if f["fault"] == "rolling"]
    drains = sum(len(f["exit_s"]) for f in rolling)
    crossed_calls = 0
    for client in set(report["errors_during"]) | set(report["logged_errors"]):
        errors = report["errors_during"].get(client, {})
        during_rolling = {k: v for k, v in errors.items() if k.startswith("rolling")}
        crossed = {k: v for k, v in during_rolling.items() if k.endswith(("CANCELLED", "GOAWAY"))}
        others = {k: v for k, v in during_rolling.items() if k not in crossed}
        assert not others, (client, errors, rolling)
        reported = sum(crossed.values())
        unexplained = [  # "<fault before it>: <line>"
            line for line in report["logged_errors"].get(client, [])
            if not line.startswith(("proxy:", "stop:", "start:"))
            and not any(k in line for k in KNOWN_CLIENT_ERRORS)
        ]  # fmt: skip
        logged = [
            line for line in unexplained
            if line.startswith("rolling:") and any(k in line for k in CROSSED_A_CONNECTION_END)
        ]  # fmt: skip
        unexplained = [line for line in unexplained if line not in logged]
        assert not unexplained, "\n".join([client, *unexplained[:5]])  # a str: shown whole
        second = sum(PYTHON_PUSH_SECOND_LINE in line for line in logged)
        crossed_calls += max(reported, len(logged) - second, second)
    assert crossed_calls <= drains, (crossed_calls, drains, report["errors_during"])
