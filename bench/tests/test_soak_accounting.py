"""The soaks' schedule and accounting: the faults both soaks strike, in a seeded cycle,
which part of a rolling restart an error falls in, and what a client's error was."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from bench.soak import fault_cycle
from bench.soak_official import Client, Role, reported_kind, restart_phase

ROLLING = {
    "t": 10_000,
    "fault": "rolling",
    "took_s": 30.0,
    "steps": [
        {"proxy": "proxy-1", "term": 10_000, "exit": 14_000, "ready": 20_000},
        {"proxy": "proxy-2", "term": 22_000, "exit": 25_000, "ready": 31_000},
    ],
}


def test_an_error_is_placed_in_the_step_of_the_restart_it_came_in():
    faults = [{"t": 1_000, "fault": "proxy", "took_s": 2.0}, ROLLING]
    assert restart_phase(500, faults) is None  # before any fault
    assert restart_phase(2_000, faults) is None  # a SIGKILL is no rolling restart
    assert restart_phase(10_000, faults) == "drain"
    assert restart_phase(13_999, faults) == "drain"
    assert restart_phase(14_000, faults) == "start"
    assert restart_phase(21_000, faults) == "serving"  # between the two proxies' turns
    assert restart_phase(23_000, faults) == "drain"
    assert restart_phase(30_000, faults) == "start"
    assert restart_phase(31_000, faults) == "serving"
    assert restart_phase(40_001, faults) is None  # after the restart ended


async def test_every_kind_strikes_in_a_seeded_cycle_and_played_says_when_all_have():
    struck: list[str] = []
    stop, played = asyncio.Event(), asyncio.Event()

    async def strike(fault: str) -> None:
        struck.append(fault)
        if len(struck) == 7:
            stop.set()

    kinds = ["proxy", "broker", "stop"]
    await asyncio.wait_for(
        fault_cycle(kinds, strike, random.Random(7), stop, 0.002, played), timeout=5
    )
    assert sorted(struck[:3]) == sorted(kinds)  # each kind once per cycle...
    assert struck[3:6] == struck[:3]  # ...in the same order each time
    assert played.is_set()
    again: list[str] = []

    async def record(fault: str) -> None:
        again.append(fault)
        if len(again) == 7:
            stop.set()

    stop.clear()
    await asyncio.wait_for(
        fault_cycle(kinds, record, random.Random(7), stop, 0.002, asyncio.Event()), timeout=5
    )
    assert again == struck  # the seed decides the schedule


async def test_played_waits_for_the_last_kind_and_a_baseline_strikes_nothing():
    stop, played = asyncio.Event(), asyncio.Event()
    seen: list[bool] = []

    async def strike(fault: str) -> None:
        seen.append(played.is_set())
        if len(seen) == 2:
            stop.set()

    await asyncio.wait_for(
        fault_cycle(["a", "b"], strike, random.Random(1), stop, 0.002, played), timeout=5
    )
    assert seen == [False, False]  # not before the second kind has struck
    assert played.is_set()
    baseline = asyncio.Event()
    stop.clear()
    task = asyncio.ensure_future(fault_cycle([], strike, random.Random(1), stop, 0.002, baseline))
    await asyncio.wait_for(baseline.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    assert len(seen) == 2  # nothing struck


# A receive of the official Python client 5.1.2 that crossed its connection's age GOAWAY, as
# its PushConsumer logs it (gRPC's error over several lines), then a Java one.
PYTHON_LOG = """\
2026-11-28 04:45:01,267 [ERROR] consumer:soak-push receive message exception: <AioRpcError of RPC that terminated with:
\tstatus = StatusCode.UNAVAILABLE
\tdetails = "Stream removed (GOAWAY received; Error code: 0; Debug Text: max_age)"
\tdebug_error_string = "UNAVAILABLE:Stream removed (GOAWAY received; Error code: 0; Debug Text: max_age)"
>
2026-11-28 04:45:02,001 [INFO] consumer:soak-push receive 1 message
2026-11-28 04:45:03,500 [ERROR] consumer:soak-push receive message exception: <AioRpcError of RPC that terminated with:
\tstatus = StatusCode.CANCELLED
>
"""  # noqa: E501 (the client's own lines)
JAVA_LOG = """\
2026-11-28 12:45:01.267 ERROR [pool-1-thread-3] Exception raised during message reception
java.util.concurrent.ExecutionException: io.grpc.StatusRuntimeException: UNAVAILABLE: GOAWAY shut down transport
\tat com.google.common.util.concurrent.AbstractFuture.getDoneValue(AbstractFuture.java:592)
"""  # noqa: E501


def test_a_logged_error_keeps_its_status_and_details(tmp_path: Path):
    python = Client(Role("python", "push", "soak-push"), tmp_path, tmp_path, "", None)
    (python.dir / "logs" / "rocketmq_python").mkdir(parents=True)
    (python.dir / "logs" / "rocketmq_python" / "rocketmq_client.log").write_text(PYTHON_LOG)
    (t1, first), (t2, second) = python.logged_errors()
    assert first.endswith(
        "[UNAVAILABLE: Stream removed (GOAWAY received; Error code: 0; Debug Text: max_age)]"
    ), first
    assert second.endswith("[CANCELLED]"), second
    assert t1 is not None and t2 == t1 + 2_233
    java = Client(Role("java", "push", "soak-fifo-push"), tmp_path, tmp_path, "", None)
    (java.dir / "logs" / "rocketmq").mkdir(parents=True)
    (java.dir / "logs" / "rocketmq" / "rocketmq-client.log").write_text(JAVA_LOG)
    [(_, line)] = java.logged_errors()
    assert line.endswith(
        "[ExecutionException: io.grpc.StatusRuntimeException: UNAVAILABLE: GOAWAY shut down "
        "transport]"
    ), line


def test_an_error_event_of_a_call_that_crossed_a_goaway_is_named_for_it():
    python = "<AioRpcError ... details = Stream removed (GOAWAY received; ... max_age)>"
    assert reported_kind({"kind": "UNAVAILABLE", "detail": python}) == "UNAVAILABLE_GOAWAY"
    java = "StatusRuntimeException: UNAVAILABLE: GOAWAY shut down transport"
    assert reported_kind({"kind": "UNAVAILABLE", "detail": java}) == "UNAVAILABLE_GOAWAY"
    refused = "failed to connect to all addresses; last error: ECONNREFUSED"
    assert reported_kind({"kind": "UNAVAILABLE", "detail": refused}) == "UNAVAILABLE"
    assert reported_kind({"kind": "CANCELLED"}) == "CANCELLED"
