"""``rmq-proxy --workers 2`` as real processes on loopback: one gRPC port served by both
workers, the group's /metrics, a killed worker restarted, statelessness across workers, and
a graceful SIGTERM. Every process is stopped by pid, every wait is bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.api.v2 import definition_pb2 as pb
from testkit.lean_client import LeanClient, Received, SettingsClient
from testkit.metrics_text import samples, total
from testkit.processes import terminate
from testkit.waits import wait_until
from tests.support.proxy_process import ready_line

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


@dataclass
class Group:
    proc: asyncio.subprocess.Process
    grpc: str
    http: str

    async def get(self, path: str, address: str | None = None) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
            http.get(f"http://{address or self.http}{path}") as response,
        ):
            return response.status, await response.text()

    async def status(self) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http,
            http.get(f"http://{self.http}/v1/status") as response,
        ):
            result: dict[str, Any] = await response.json()
            return result


async def start_group(*args: str, env: dict[str, str] | None = None) -> Group:
    """``rmq-proxy --workers 2`` of this worktree, with 2 embedded brokers, on free ports;
    ``env``: settings added to the environment."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.cli", "--workers", "2", "--embedded-brokers", "2",
        "--grpc-port", "0", "--http-port", "0", "--topic", "T", "--log-level", "warning",
        *args,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )  # fmt: skip
    fields = await ready_line(proc, READY_TIMEOUT_S)
    return Group(proc, fields["grpc"], fields["http"])


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[Group]:
    g = await start_group("--event-log-dir", str(tmp_path / "events"))
    try:
        yield g
    finally:
        await stop(g)


async def stop(g: Group) -> None:
    await terminate(g.proc, 30)


ROUTES = {"protocol_type": "grpc", "request_code": "query_route"}


async def routes_served(g: Group, worker_http: str | None = None) -> float:
    """QueryRoute calls counted (histogram count) by the group, or by one worker."""
    _, text = await g.get("/metrics", worker_http)
    return total(text, "rocketmq_proxy_rpc_latency_seconds_count", **ROUTES)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_workers_serve_one_port_and_metrics_sum(group: Group) -> None:
    status = await group.status()
    workers = status["workers"]
    assert [w["index"] for w in workers] == [0, 1]
    assert all(w["ready"] and w["status"]["grpc"] == group.grpc for w in workers)
    assert len({w["pid"] for w in workers}) == 2
    assert (await group.get("/readyz"))[0] == 200

    # 16 clients, each on a connection of its own: the kernel spreads them over both.
    clients = [LeanClient(group.grpc, f"c{i}", own_connection=True) for i in range(16)]
    try:
        for c in clients:
            route = await c.query_route("T")
            assert route.status.code == pb.Code.OK
            sent = await c.send("T", b"x")
            assert sent.status.code == pb.Code.OK
    finally:
        await asyncio.gather(*(c.close() for c in clients))
    per_worker = [await routes_served(group, w["http"]) for w in workers]
    assert all(n > 0 for n in per_worker), per_worker  # connections landed on both
    assert sum(per_worker) == 16
    # One scrape of the group: the counter and the histogram summed over the workers.
    _, text = await group.get("/metrics")
    assert total(text, "rocketmq_proxy_rpc_latency_seconds_count", **ROUTES) == 16
    assert total(text, "rocketmq_proxy_send_messages_total", topic="T") == 16
    assert total(text, "rocketmq_proxy_ready") == 1
    assert total(text, "rocketmq_proxy_long_polls_limit") == 2 * 20_000  # livesum


async def test_a_message_sent_through_one_worker_is_acked_through_another(
    group: Group,
) -> None:
    # Find a client on each worker: a QueryRoute shows up in one worker's own counter.
    workers = (await group.status())["workers"]
    on: dict[int, LeanClient] = {}
    spare: list[LeanClient] = []
    try:
        for i in range(40):
            if len(on) == 2:
                break
            client = LeanClient(group.grpc, f"s{i}", own_connection=True)
            before = [await routes_served(group, w["http"]) for w in workers]
            await client.query_route("T")
            after = [await routes_served(group, w["http"]) for w in workers]
            k = next(k for k in (0, 1) if after[k] > before[k])
            if k in on:
                spare.append(client)
            else:
                on[k] = client
        assert len(on) == 2, "40 connections, all on one worker"
        sender, receiver = on[0], on[1]
        assert (await sender.send("T", b"across")).status.code == pb.Code.OK
        got = await receiver.receive("G", "T", await_ms=5000)
        assert got.status == pb.Code.OK and [m.body for m in got.messages] == [b"across"]
        # The receipt handle worker 1 made is acked through worker 0.
        acked = await sender.ack("G", "T", got.messages)
        assert acked.status.code == pb.Code.OK
        assert [e.status.code for e in acked.entries] == [pb.Code.OK]
    finally:
        await asyncio.gather(*(c.close() for c in [*on.values(), *spare]))


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(group: Group) -> None:
    client = LeanClient(group.grpc, "before", own_connection=True)
    try:
        assert (await client.query_route("T")).status.code == pb.Code.OK
    finally:
        await client.close()
    counted = await routes_served(group)
    victim = (await group.status())["workers"][0]
    os.kill(victim["pid"], signal.SIGKILL)

    # Once the supervisor has reaped it (connections still in a dying listener's accept
    # queue are reset, as with any SO_REUSEPORT group), new ones go to the worker left.
    async def reaped() -> bool:
        return (await group.status())["workers"][0]["pid"] != victim["pid"]

    await wait_until(reaped, timeout=10, step=0.02, what="the killed worker reaped")
    for i in range(4):
        c = LeanClient(group.grpc, f"during-{i}", own_connection=True)
        try:
            route = await c.query_route("T")
            assert route.status.code == pb.Code.OK
        finally:
            await c.close()

    w: dict[str, Any] = {}

    async def restarted() -> bool:
        w.update((await group.status())["workers"][0])
        return bool(w["ready"]) and w["pid"] not in (None, victim["pid"])

    await wait_until(restarted, timeout=30, step=0.2, what=lambda: f"a new worker ready ({w})")
    assert w["restarts"] == 1 and w["last_exit"] == -signal.SIGKILL
    assert (await group.get("/readyz"))[0] == 200
    # The dead worker's samples stay: the group's counter never goes backwards.
    assert await routes_served(group) >= counted + 4
    c = LeanClient(group.grpc, "after", own_connection=True)
    try:
        assert (await c.query_route("T")).status.code == pb.Code.OK
    finally:
        await c.close()


async def test_a_groups_lag_leaves_the_groups_metrics_when_its_consumers_leave() -> None:
    # Multiprocess files keep every label set a worker ever set, until it dies: the lag of a
    # group whose consumers left stayed on the supervisor's /metrics (and its alert fired).
    g = await start_group(env={"RMQ_PROXY_LAG_REFRESH_S": "0.2"})
    producer = LeanClient(g.grpc, "lag-producer", own_connection=True)
    consumer = SettingsClient(g.grpc, "lag-consumer", own_connection=True)
    seen: dict[str, list[tuple[dict[str, str], float]]] = {}

    async def lag(name: str = "messages") -> list[float]:
        _, text = await g.get("/metrics")
        found = seen[name] = samples(text, f"rocketmq_proxy_consumer_lag_{name}")
        return [v for labels, v in found if labels == {"group": "G", "topic": "T"}]

    try:
        await consumer.prepare("G", "T", 200)  # registered on the worker it reached
        for i in range(3):
            assert (await producer.send("T", f"m{i}".encode())).status.code == pb.Code.OK

        async def behind() -> bool:
            return await lag() == [3] and len(await lag("oldest_seconds")) == 1

        await wait_until(behind, timeout=15, step=0.1, what=lambda: f"the lag of G ({seen})")
        await consumer.close()  # its stream ends: the worker forgets the pair

        async def gone() -> bool:
            return await lag() == [] and await lag("oldest_seconds") == []

        await wait_until(gone, timeout=15, step=0.1, what=lambda: f"no lag of G ({seen})")
    finally:
        await asyncio.gather(producer.close(), consumer.close())
        await stop(g)


async def test_sigterm_drains_every_worker_and_exits_0(tmp_path: Path) -> None:
    events = tmp_path / "events"
    g = await start_group("--event-log-dir", str(events), "--mode", "notify", "--proxy-id", "p")
    clients: list[LeanClient] = []
    polls: list[asyncio.Future[Received]] = []
    try:
        worker_pids = [w["pid"] for w in (await g.status())["workers"]]
        # Polls parked on both workers: connections are added one at a time until each
        # worker holds one (the kernel spreads connections at random; 64 on one worker
        # would have odds of 2^-63).
        deadline = time.monotonic() + 20
        parked: list[int] = []

        async def counted() -> bool:
            nonlocal parked
            workers = (await g.status())["workers"]
            parked = [sum(w["status"]["receive"]["in_flight"].values()) for w in workers]
            return sum(parked) == len(polls)

        while not (parked and all(n > 0 for n in parked)):
            assert len(clients) < 64 and time.monotonic() < deadline, parked
            client = LeanClient(g.grpc, f"c{len(clients)}", own_connection=True)
            clients.append(client)
            polls.append(asyncio.ensure_future(client.receive("G", "T", await_ms=20_000)))
            # Until this poll is counted by the worker that took it.
            left = max(0.0, deadline - time.monotonic())
            await wait_until(
                counted, timeout=left, step=0.05, what=lambda: f"every poll counted ({parked})"
            )
        started = time.perf_counter()
        g.proc.send_signal(signal.SIGTERM)
        results = await asyncio.wait_for(asyncio.gather(*polls), 15)
        assert [r.status for r in results] == [pb.Code.MESSAGE_NOT_FOUND] * len(polls)
        # Answered on SIGTERM, not at the end of their 20 s polls (the margin is for a
        # loaded machine: the drain itself takes well under a second).
        assert time.perf_counter() - started < 12
        assert await asyncio.wait_for(g.proc.wait(), 30) == 0
        assert not any(alive(pid) for pid in worker_pids)
        assert g.proc.stdout is not None
        rest = (await g.proc.stdout.read()).decode()
        assert "rmq-proxy ready" not in rest  # the ready line came once
        # One event-log stream per worker, the Spark job's layout.
        streams = sorted(p.name for p in events.iterdir())
        assert streams == ["proxy=p-w0", "proxy=p-w1"]
        for stream in streams:
            assert list((events / stream).glob("date=*/part-*.parquet")), stream
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await stop(g)


async def test_a_port_taken_by_another_process_fails_the_start_with_exit_1() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy.cli", "--workers", "2", "--namesrv", "127.0.0.1:1",
            "--grpc-port", str(taken.getsockname()[1]), "--http-port", "0",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 1
    assert out == b""  # no ready line
    assert b"Address already in use" in err
