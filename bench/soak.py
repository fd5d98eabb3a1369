"""The chaos soak: messages flow through two proxies while faults strike on a seeded
schedule; every message is counted.

    python -m bench.soak --backend real --minutes 10 --seed 1   (make soak)
    python -m bench.soak --backend stub --minutes 1 --faults proxy,stop,namesrv,client

Topology: a name server, three brokers (real RocketMQ 5 from rocketmq_local/launcher.py,
whose store survives a kill; or broker_stub processes, in memory), two proxies
(``python -m proxy.cli`` of this tree, each a process on free loopback ports), and in this
process producers and SimpleConsumers (the lean client) on both proxies: each client takes
both endpoints and moves to the other one when a call fails.

Faults (``--faults``, on a schedule drawn from ``--seed``): ``proxy`` SIGKILL of a proxy and
a restart on the same ports; ``broker`` SIGKILL and restart of a broker; ``stop`` SIGSTOP
of a broker, SIGCONT some seconds later; ``namesrv`` the name server killed and
restarted; ``client`` a consumer killed mid-poll (its channel closed under a pending
ReceiveMessage) and one killed mid-ack (it received, and dies before acking). The faults go
on past ``--minutes`` until each kind given has struck once.

Accounting: each message body is a unique id. ``confirmed``: the send answered OK.
``delivered``: received at least once. ``duplicates``: deliveries past the first.
``lost``: confirmed, never delivered by the end of the drain. Redelivery delay: from a
message's first delivery to its next one. Proxy health: tasks (``/v1/status``), open
file descriptors and RSS of each proxy process, before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from bench import netfault
from proxy.api.v2 import definition_pb2 as pb
from rocketmq_local import admin
from rocketmq_local.launcher import free_port_block
from testkit.lean_client import LeanClient
from testkit.processes import Process, _spawn, kill, terminate

if TYPE_CHECKING:
    from rocketmq_local.launcher import RealCluster

TOPIC, GROUP = "SoakTopic", "SoakGroup"
# Checks of an open half message before its broker discards it (transactionCheckMax). At
# the default, 15, and the soak's check every second, a producer out of reach for 15 s
# loses its orphans, and the soak's network cuts last up to 18.5 s (one did so in CI). 60
# keep a half message about a minute, still short of a default cluster's 15 checks 30 s
# apart (7.5 minutes). Every other test runs the brokers at the default.
TRANSACTION_CHECK_MAX = 60
FAULTS = ("proxy", "broker", "stop", "namesrv", "client")
INVISIBLE_MS = 10_000
# The longest one fault may take: the official soak's rolling restart of three proxies,
# each slow to start on a loaded machine (``every_fault_played`` serves both soaks).
FAULT_MAX_S = 120.0
Code = pb.Code


@dataclass
class Ledger:
    sent: int = 0
    confirmed: dict[str, float] = field(default_factory=dict)  # id -> confirmed at
    deliveries: dict[str, list[float]] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)
    ack_unknown: set[str] = field(default_factory=set)  # acks whose outcome is unknown
    ack_failures: dict[str, list[str]] = field(default_factory=dict)  # id -> refusals
    errors: dict[str, int] = field(default_factory=dict)
    faults: list[tuple[float, str]] = field(default_factory=list)
    calls: int = 0
    late_calls: int = 0  # calls that ran past their own deadline (a hang)

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def report(self) -> dict:
        delivered = {m for m in self.deliveries if m in self.confirmed}
        redelivery = sorted(
            (times[1] - times[0]) for times in self.deliveries.values() if len(times) > 1
        )

        def pct(p: float) -> float | None:
            if not redelivery:
                return None
            return round(redelivery[min(len(redelivery) - 1, int(p * len(redelivery)))], 2)

        return {
            "sent": self.sent,
            "confirmed": len(self.confirmed),
            "delivered": len(delivered),
            "acked": len(self.acked & set(self.confirmed)),
            # Confirmed, delivered, never acked with an answer, but an ack was sent that got
            # none: the broker may have applied it (so nothing comes back to be acked).
            "ack_unknown": len((self.ack_unknown - self.acked) & set(self.confirmed)),
            # What became of each confirmed message never acked with an answer: its
            # deliveries (seconds apart from the first) and the refusals of its acks.
            "unacked": {
                m: {
                    "deliveries": [round(t - times[0], 1) for t in times],
                    "ack_failures": self.ack_failures.get(m, []),
                }
                for m in sorted(set(self.confirmed) - self.acked - self.ack_unknown)
                for times in [self.deliveries.get(m) or [0.0]]
            },
            "duplicates": sum(len(t) - 1 for t in self.deliveries.values()),
            "lost": len(set(self.confirmed) - set(self.deliveries)),
            "unconfirmed_delivered": len(set(self.deliveries) - set(self.confirmed)),
            "redelivery_s_p50": pct(0.5),
            "redelivery_s_p99": pct(0.99),
            "calls": self.calls,
            "late_calls": self.late_calls,
            "errors": self.errors,
            "faults": [f"{t:.0f}s {what}" for t, what in self.faults],
        }


@dataclass(frozen=True)
class Resources:
    """The topics (name -> ``message.type``, None for a plain topic) and consumer groups
    (name -> FIFO) a soak needs, made on every broker at the start and again on a stub
    broker restarted (it keeps nothing)."""

    topics: dict[str, str | None]
    groups: dict[str, bool]


class Cluster:
    """Name server, three brokers and ``proxies`` proxies, each restartable on its own
    ports. ``log_dir``: each proxy's stderr (its log) goes to ``<name>.log`` there;
    ``proxy_args``: added to every proxy's command line; ``fleet``: the proxies are the
    members of one fleet (``[fleet]``, each on a fleet port of its own)."""

    def __init__(
        self,
        backend: str,
        resources: Resources | None = None,
        *,
        proxies: int = 2,
        log_dir: str | None = None,
        proxy_args: tuple[str, ...] = (),
        fleet: bool = False,
    ) -> None:
        self.backend = backend
        self.fleet = fleet
        self.fleet_ports: dict[str, int] = {}
        self.resources = resources or Resources({TOPIC: None}, {GROUP: False})
        self.proxy_count = proxies
        self.log_dir = log_dir
        self.proxy_args = proxy_args
        self.real: RealCluster | None = None
        self.stub_namesrv: Process | None = None
        self.stub_brokers: dict[str, tuple[int, Process | None]] = {}
        self.proxies: dict[str, tuple[tuple[int, int], Process | None]] = {}
        self.namesrv_port = 0

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"

    async def start(self) -> None:
        if self.backend == "real":
            from rocketmq_local.launcher import RealCluster

            real = self.real = await asyncio.to_thread(
                RealCluster.start,
                3,
                broker_conf={"transactionCheckMax": str(TRANSACTION_CHECK_MAX)},
            )
            self.namesrv_port = real.namesrv_port
        else:
            self.namesrv_port = free_port_block()
            await self._start_stub_namesrv()
            for name in ("broker-a", "broker-b", "broker-c"):
                self.stub_brokers[name] = (free_port_block(), None)
                await self._start_stub_broker(name)
        await self._create_resources()
        for i in range(1, self.proxy_count + 1):
            self.proxies[f"proxy-{i}"] = ((free_port_block(), free_port_block()), None)
            if self.fleet:
                self.fleet_ports[f"proxy-{i}"] = free_port_block()
        for name in self.proxies:
            await self.start_proxy(name)

    async def _create_resources(self, brokers: dict[str, str] | None = None) -> None:
        """The topics and groups on every broker (or those of ``brokers``, name -> address)."""

        def create() -> None:
            for topic, message_type in self.resources.topics.items():
                admin.create_topic(self.namesrv, topic, message_type=message_type, brokers=brokers)
            for group, fifo in self.resources.groups.items():
                admin.create_group(self.namesrv, group, fifo=fifo, brokers=brokers)

        await asyncio.to_thread(create)

    async def _start_stub_namesrv(self) -> None:
        self.stub_namesrv = await _spawn(
            "namesrv",
            "broker_stub.cli",
            "namesrv_main",
            "--port",
            str(self.namesrv_port),
            "--log-level",
            "error",
        )

    async def _start_stub_broker(self, name: str) -> None:
        port, _ = self.stub_brokers[name]
        proc = await _spawn(
            name,
            "broker_stub.cli",
            "broker_main",
            "--name",
            name,
            "--port",
            str(port),
            "--namesrv",
            self.namesrv,
            "--transaction-check-max",
            str(TRANSACTION_CHECK_MAX),
            "--log-level",
            "error",
        )
        self.stub_brokers[name] = (port, proc)

    async def start_proxy(self, name: str) -> None:
        (grpc_port, http_port), _ = self.proxies[name]
        args = [
            "--namesrv", self.namesrv, "--grpc-port", str(grpc_port), "--http-port",
            str(http_port), "--proxy-id", name, "--workers", "1", "--log-level", "warning",
            *self.proxy_args,
        ]  # fmt: skip
        # In the run's own network, each proxy under a group of its own (``disturb``).
        group = self.proxy_gid(name) if netfault.in_own_network() else None
        env = {}
        if self.fleet:
            peers = ",".join(f"127.0.0.1:{port}" for port in self.fleet_ports.values())
            env = {
                "RMQ_PROXY_FLEET_PEERS": peers,
                "RMQ_PROXY_FLEET_HOST": "127.0.0.1",
                "RMQ_PROXY_FLEET_PORT": str(self.fleet_ports[name]),
            }
        if self.log_dir is None:
            proc = await _spawn(name, "proxy.cli", "main", *args, group=group, env=env)
        else:
            os.makedirs(self.log_dir, exist_ok=True)
            with (Path(self.log_dir) / f"{name}.log").open("ab") as log:
                proc = await _spawn(
                    name, "proxy.cli", "main", *args, stderr=log, group=group, env=env
                )
        self.proxies[name] = ((grpc_port, http_port), proc)

    def proxy_gid(self, name: str) -> int:
        return netfault.proxy_gid(list(self.proxies).index(name))

    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{ports[0]}" for ports, _ in self.proxies.values()]

    def proxy_address(self, name: str) -> str:
        """The gRPC address of the proxy ``name``."""
        (grpc, _), _ = self.proxies[name]
        return f"127.0.0.1:{grpc}"

    def proxy_addresses(self) -> list[tuple[str, str]]:
        """(gRPC address, ops HTTP address) of every proxy."""
        return [(f"127.0.0.1:{g}", f"127.0.0.1:{h}") for (g, h), _ in self.proxies.values()]

    def broker_names(self) -> list[str]:
        if self.real is not None:
            return [b.name for b in self.real.brokers]
        return list(self.stub_brokers)

    # -- faults ---------------------------------------------------------------------------

    async def kill_proxy(self, name: str) -> None:
        _, proc = self.proxies[name]
        if proc is not None:
            await kill(proc)
        await asyncio.sleep(1)
        await self.start_proxy(name)

    async def restart_proxy(self, name: str, grace_s: float) -> float:
        """A graceful restart: SIGTERM, wait for the exit (SIGKILL past ``grace_s``), start
        again on the same ports. The seconds the old process took to exit."""
        _, proc = self.proxies[name]
        started = time.monotonic()
        if proc is not None:
            assert isinstance(proc.proc, asyncio.subprocess.Process)
            await terminate(proc.proc, grace_s)
        took = time.monotonic() - started
        await self.start_proxy(name)
        return took

    async def kill_broker(self, name: str) -> None:
        if self.real is not None:
            broker = self.real.broker(name)
            broker.process.signal(signal.SIGKILL)
            await asyncio.to_thread(broker.process.popen.wait)
            await asyncio.sleep(1)
            await asyncio.to_thread(self.real.restart_broker, name)
            return
        port, proc = self.stub_brokers[name]
        if proc is not None:
            await kill(proc)
        await asyncio.sleep(1)
        await self._start_stub_broker(name)
        await self._create_resources({name: f"127.0.0.1:{port}"})  # a stub keeps nothing

    async def pause_broker(self, name: str, seconds: float) -> None:
        if self.real is not None:
            pid = self.real.broker(name).process.pid
        else:
            stub = self.stub_brokers[name][1]
            assert stub is not None, f"{name} is not running"
            pid = stub.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    async def disturb(self, proxy: str, broker: str, percent: int, seconds: float) -> None:
        """Drop ``percent`` % of what ``proxy`` sends to ``broker`` for ``seconds`` (100: the
        broker is unreachable from that proxy alone); needs the run's own network."""
        if self.real is not None:
            port = self.real.broker(broker).port
        else:
            port = self.stub_brokers[broker][0]
        await netfault.drop(self.proxy_gid(proxy), port, percent)
        try:
            await asyncio.sleep(seconds)
        finally:
            await netfault.heal()

    async def kill_namesrv(self) -> None:
        if self.real is not None:
            from rocketmq_local.launcher import RealCluster  # noqa: F401

            ns = self.real.namesrv
            ns.signal(signal.SIGKILL)
            await asyncio.to_thread(ns.popen.wait)
            await asyncio.sleep(2)
            ns.spawn(
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                ["-c", str(ns.home / "namesrv.conf")],
                self.real.profile,
            )
            await asyncio.to_thread(ns.wait_ready, 90)
            return
        if self.stub_namesrv is not None:
            await kill(self.stub_namesrv)
        await asyncio.sleep(2)
        await self._start_stub_namesrv()

    # -- health ---------------------------------------------------------------------------

    async def health(self) -> dict:
        out: dict[str, dict[str, object]] = {}
        async with aiohttp.ClientSession() as http:
            for name, ((_, http_port), proc) in self.proxies.items():
                try:
                    async with http.get(
                        f"http://127.0.0.1:{http_port}/v1/status",
                        timeout=aiohttp.ClientTimeout(total=5),
                    ) as r:
                        status = await r.json()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    out[name] = {"error": str(exc)}
                    continue
                if proc is None:
                    continue
                out[name] = {
                    "tasks": status.get("tasks"),
                    "in_flight": sum(status["receive"]["in_flight"].values()),
                    "fds": len(os.listdir(f"/proc/{proc.pid}/fd")),
                    "rss_mb": round(proc.rss_bytes() / 2**20, 1),
                }
        return out

    async def stop(self) -> None:
        for _, proc in self.proxies.values():
            if proc is not None:
                await kill(proc)
        if self.real is not None:
            await asyncio.to_thread(self.real.stop, 10.0)
        for _, proc in self.stub_brokers.values():
            if proc is not None and proc.proc.returncode is None:
                os.kill(proc.pid, signal.SIGCONT)  # a paused broker
                await kill(proc)
        if self.stub_namesrv is not None:
            await kill(self.stub_namesrv)


class Client:
    """A lean client over both proxies: a failed call moves it to the other one."""

    _ids = itertools.count()

    def __init__(self, endpoints: list[str], start: int) -> None:
        self.endpoints = endpoints
        self.index = start
        self.lean = self._connect()

    def _connect(self) -> LeanClient:
        return LeanClient(
            self.endpoints[self.index % len(self.endpoints)],
            f"soak-{next(self._ids)}",
            own_connection=True,
        )

    async def switch(self) -> None:
        await self.lean.close()
        self.index += 1
        self.lean = self._connect()

    async def close(self) -> None:
        await self.lean.close()


async def _timed(ledger: Ledger, coro, deadline_s: float):
    """A client call; it has its own gRPC deadline, this checks the proxy kept it."""
    ledger.calls += 1
    started = time.monotonic()
    try:
        return await coro
    finally:
        if time.monotonic() - started > deadline_s + 2:
            ledger.late_calls += 1


async def produce(ledger: Ledger, client: Client, stop: asyncio.Event, rate: float) -> None:
    while not stop.is_set():
        mid = uuid.uuid4().hex
        ledger.sent += 1
        try:
            sent = await _timed(
                ledger, asyncio.wait_for(client.lean.send(TOPIC, mid.encode()), 10), 10
            )
            if sent.status.code == Code.OK:
                ledger.confirmed[mid] = time.monotonic()
            else:
                ledger.error(f"send:{pb.Code.Name(sent.status.code)}")
                await client.switch()
        except Exception as exc:  # a proxy gone: the other one
            ledger.error(f"send:{type(exc).__name__}")
            await client.switch()
        await asyncio.sleep(1 / rate)


async def consume(
    ledger: Ledger, client: Client, stop: asyncio.Event, t0: float, ack: bool = True
) -> None:
    while not stop.is_set():
        try:
            got = await _timed(
                ledger,
                client.lean.receive(
                    GROUP, TOPIC, await_ms=5_000, batch=16, invisible_ms=INVISIBLE_MS
                ),
                8,
            )
        except Exception as exc:
            ledger.error(f"receive:{type(exc).__name__}")
            await client.switch()
            await asyncio.sleep(0.2)
            continue
        if got.status not in (Code.OK, Code.MESSAGE_NOT_FOUND):
            ledger.error(f"receive:{pb.Code.Name(got.status)}")
            await client.switch()
            continue
        now = time.monotonic()
        for m in got.messages:
            ledger.deliveries.setdefault(m.body.decode(), []).append(now)
        if got.messages and ack:
            try:
                answer = await _timed(
                    ledger, asyncio.wait_for(client.lean.ack(GROUP, TOPIC, got.messages), 10), 10
                )
                # Per entry: a batch that partly failed (MULTIPLE_RESULTS) still acked the
                # entries answered OK, and those never come back to be acked again.
                body_of = {m.system_properties.message_id: m.body.decode() for m in got.messages}
                for entry in answer.entries:
                    body, code = body_of[entry.message_id], entry.status.code
                    if code == Code.OK:
                        ledger.acked.add(body)
                    elif code == Code.PROXY_TIMEOUT:
                        # The broker did not answer the proxy in time (it was stopped, say):
                        # it may apply the ack when it runs again, as for no answer at all.
                        ledger.ack_unknown.add(body)
                    else:  # refused: the message comes back and is acked again
                        ledger.ack_failures.setdefault(body, []).append(pb.Code.Name(code))
                    if code != Code.OK:
                        ledger.error(f"ack:{pb.Code.Name(code)}")
            except Exception as exc:
                # No answer: the broker may or may not have applied the ack. Either the
                # message comes back and is acked again, or it never does.
                ledger.ack_unknown.update(m.body.decode() for m in got.messages)
                ledger.error(f"ack:{type(exc).__name__}")
                await client.switch()


async def client_faults(ledger: Ledger, cluster: Cluster, t0: float) -> None:
    """A consumer killed mid-poll, and one killed between receive and ack."""
    doomed = Client(cluster.endpoints(), random.randrange(2))
    poll = asyncio.ensure_future(
        doomed.lean.receive(GROUP, TOPIC, await_ms=5_000, batch=16, invisible_ms=INVISIBLE_MS)
    )
    await asyncio.sleep(0.3)
    await doomed.close()  # the connection goes under the pending poll
    try:
        got = await poll
        for m in got.messages:  # it may have answered first: those count as delivered
            ledger.deliveries.setdefault(m.body.decode(), []).append(time.monotonic())
    except (Exception, asyncio.CancelledError):  # closing the channel cancels the call
        this = asyncio.current_task()
        if this is not None and this.cancelling():
            raise
    ledger.faults.append((time.monotonic() - t0, "client killed mid-poll"))
    doomed = Client(cluster.endpoints(), random.randrange(2))
    try:
        got = await doomed.lean.receive(
            GROUP, TOPIC, await_ms=5_000, batch=16, invisible_ms=INVISIBLE_MS
        )
        now = time.monotonic()
        for m in got.messages:
            ledger.deliveries.setdefault(m.body.decode(), []).append(now)
    except Exception as exc:
        ledger.error(f"receive:{type(exc).__name__}")
    await doomed.close()  # never acks: those come back after their invisible time
    ledger.faults.append((time.monotonic() - t0, "client killed mid-ack"))


async def every_fault_played(
    played: asyncio.Event, chaos: asyncio.Future, faults: list[str], interval: float
) -> None:
    """Wait, past the run's time, until every kind of fault has run once (``played``) or the
    ``chaos`` task has ended: a short run on a slow machine, where restarts take longer,
    would otherwise end before its last fault.
    Bounded: a fault and the pause before it take at most 1.5 intervals plus
    ``FAULT_MAX_S``."""
    bound = len(faults) * (1.5 * interval + FAULT_MAX_S)
    waiter = asyncio.ensure_future(played.wait())
    try:
        await asyncio.wait({waiter, chaos}, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


#: Strikes one fault of the kind it is given and returns once the part it struck serves
#: again. Each soak has its own: what it strikes, and how it records the fault.
Strike = Callable[[str], Awaitable[None]]


async def fault_cycle(
    faults: list[str],
    strike: Strike,
    rng: random.Random,
    stop: asyncio.Event,
    interval: float,
    played: asyncio.Event,
    *,
    ordered: bool = False,
) -> None:
    """One fault every ``interval`` s (0.5x-1.5x), kinds cycling in a seeded order (in the
    order given, ``ordered``), until ``stop``; ``played`` is set once every kind has struck.
    With no faults (a baseline run: the same load, nothing struck) it waits for ``stop``."""
    if not faults:
        played.set()
        await stop.wait()
        return
    plan = itertools.cycle(faults if ordered else rng.sample(faults, len(faults)))
    struck: set[str] = set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), interval / 2)
    while not stop.is_set():
        fault = next(plan)
        await strike(fault)
        struck.add(fault)
        if struck >= set(faults):
            played.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval * rng.uniform(0.5, 1.5))


async def strike(
    ledger: Ledger, cluster: Cluster, rng: random.Random, t0: float, fault: str
) -> None:
    """This soak's faults; each is recorded in the ledger at the time it began."""
    started = time.monotonic() - t0
    if fault == "proxy":
        name = rng.choice(list(cluster.proxies))
        await cluster.kill_proxy(name)
        ledger.faults.append((started, f"SIGKILL+restart {name}"))
    elif fault == "broker":
        name = rng.choice(cluster.broker_names())
        await cluster.kill_broker(name)
        ledger.faults.append((started, f"SIGKILL+restart {name}"))
    elif fault == "stop":
        name = rng.choice(cluster.broker_names())
        await cluster.pause_broker(name, rng.uniform(3, 8))
        ledger.faults.append((started, f"SIGSTOP/SIGCONT {name}"))
    elif fault == "namesrv":
        await cluster.kill_namesrv()
        ledger.faults.append((started, "SIGKILL+restart namesrv"))
    elif fault == "client":
        await client_faults(ledger, cluster, t0)


async def run(
    backend: str,
    seconds: float,
    seed: int,
    faults: list[str],
    rate: float,
    drain_s: float = 90,
    interval: float = 20,
) -> dict:
    rng = random.Random(seed)
    random.seed(seed)
    ledger = Ledger()
    cluster = Cluster(backend)
    load_before = os.getloadavg()
    await cluster.start()
    try:
        await asyncio.sleep(3)
        health_before = await cluster.health()
        endpoints = cluster.endpoints()
        stop_producing, stop_consuming = asyncio.Event(), asyncio.Event()
        producers = [Client(endpoints, i) for i in range(2)]
        consumers = [Client(endpoints, i) for i in range(4)]
        t0 = time.monotonic()
        tasks = [asyncio.ensure_future(produce(ledger, c, stop_producing, rate)) for c in producers]
        tasks += [asyncio.ensure_future(consume(ledger, c, stop_consuming, t0)) for c in consumers]
        played = asyncio.Event()
        chaos_task = asyncio.ensure_future(
            fault_cycle(
                faults,
                functools.partial(strike, ledger, cluster, rng, t0),
                rng,
                stop_producing,
                interval,
                played,
            )
        )
        await asyncio.sleep(seconds)
        await every_fault_played(played, chaos_task, faults, interval)
        stop_producing.set()
        await chaos_task
        # Drain: until every confirmed message was delivered and acked, or the drain ends.
        drain_end = time.monotonic() + drain_s
        while time.monotonic() < drain_end:
            if set(ledger.confirmed) <= ledger.acked:
                break
            await asyncio.sleep(1)
        stop_consuming.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in producers + consumers:
            await c.close()
        await asyncio.sleep(3)
        health_after = await cluster.health()
    finally:
        await cluster.stop()
    report = ledger.report()
    report.update(
        backend=backend,
        seconds=seconds,
        seed=seed,
        drain_s=drain_s,
        health_before=health_before,
        health_after=health_after,
        load_before=[round(x, 2) for x in load_before],
        load_after=[round(x, 2) for x in os.getloadavg()],
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("real", "stub"), default="real")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--rate", type=float, default=20, help="messages/s per producer (2)")
    p.add_argument("--interval", type=float, default=20, help="mean seconds between faults")
    p.add_argument("--drain", type=float, default=90)
    p.add_argument("--out", help="write the report here (JSON)")
    args = p.parse_args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        p.error(f"unknown faults: {sorted(unknown)}")
    report = asyncio.run(
        run(
            args.backend, args.minutes * 60, args.seed, faults, args.rate, args.drain, args.interval
        )
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    lost_ok = report["lost"] == 0 or (args.backend == "stub" and "broker" in faults)
    return 0 if lost_ok and report["late_calls"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
