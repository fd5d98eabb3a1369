"""The benchmark's system under test, as separate processes on loopback: a name server,
brokers and one proxy per receive mode, each on a free port, each stopped by pid.

Two backends behind the same ``System``: ``stub`` (our broker_stub processes) and ``real``
(Apache RocketMQ 5 name server and brokers from rocketmq_local/launcher.py, Profile.BENCH).
The scenarios talk to either the same way: proxies, ``broker_clients``, ``create_topic``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from proxy.collector import NEVER
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from rocketmq_local import admin
from testkit.metrics_text import every_sample

if TYPE_CHECKING:
    from rocketmq_local.launcher import RealCluster

MODES = ("notify", "coupled", "slicing", "adaptive")
BACKENDS = ("stub", "real")
# How long a spawned part gets to say it is ready: a proxy restarted in a soak starts under
# a load of 40 on 2 cores, where 60 s once ran out.
START_S = 120


async def terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM (a graceful stop), then SIGKILL past ``grace_s``; returns once it exited."""
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()


async def kill(process: Process) -> None:
    """SIGKILL, and wait for the exit (in a thread for a launcher's ``Popen``)."""
    if process.proc.returncode is not None:
        return
    process.proc.kill()
    if isinstance(process.proc, subprocess.Popen):
        await asyncio.to_thread(process.proc.wait)
    else:
        await process.proc.wait()


@dataclass
class Process:
    """A process of the system; ``proc`` is an asyncio process that we started, or for a
    real broker's JVM the launcher's ``subprocess.Popen`` (the launcher stops those)."""

    name: str
    proc: asyncio.subprocess.Process | subprocess.Popen[bytes]
    address: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tree(self) -> list[int]:
        """The process and its live descendants (a proxy's workers)."""
        found, pids = [], [self.pid]
        while pids:
            pid = pids.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    pids += [int(child) for child in f.read().split()]
            except FileNotFoundError:
                continue
            found.append(pid)
        return found

    def cpu_seconds(self) -> float:
        """CPU seconds of the process and its live descendants (a proxy's workers)."""
        total = 0.0
        for pid in self.tree():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    def rss_bytes(self) -> int:
        """Resident memory of the process and its live descendants. Pages the workers
        share (the interpreter's libraries) count once per process: compare growth, not
        levels, between proxies of different worker counts."""
        total = 0
        for pid in self.tree():
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next(
                        (int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")),
                        0,
                    )
            except FileNotFoundError:
                continue
        return total


async def _spawn(
    name: str, module: str, func: str, *args: str, stderr=None, group: int | None = None,
    env: dict[str, str] | None = None,
) -> Process:  # fmt: skip
    """Start ``module.func()`` with ``args``; ``stderr``: a file for its log (default
    inherited); ``group``: the group id it runs under (``bench/netfault.py`` tells its
    packets by it); ``env``: added to this process's environment.

    The group is set by ``preexec_fn`` in the child, not by ``group=``: the entry points
    run on uvloop (``proxy.loop.run_main``), whose ``subprocess_exec`` refuses the keywords
    only ``subprocess.Popen`` knows (``group``, ``user``, ``process_group``, ...) with
    "unexpected kwargs", even when they are None."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"from {module} import {func}; {func}()",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        preexec_fn=None if group is None else functools.partial(os.setregid, group, group),
        env=dict(os.environ, **env) if env else None,
    )
    try:
        assert proc.stdout is not None  # PIPE
        line = (await asyncio.wait_for(proc.stdout.readline(), START_S)).decode().strip()
    except TimeoutError:
        proc.kill()
        raise RuntimeError(f"{name} did not start") from None
    if not line:
        raise RuntimeError(f"{name} exited at start")
    process = Process(name, proc)
    words = line.split()
    if words[:2] == ["rmq-proxy", "ready"]:
        process.address = dict(w.split("=", 1) for w in words[2:])
    else:  # "... listening on host:port"
        process.address = {"remoting": words[-1]}
    return process


def quiet_collector() -> None:
    """For a load generator: it holds as many calls as the proxy it drives, and CPython's
    full collections would stall it as they stall the proxy (proxy/collector.py), showing
    up as the proxy's latency. Off for the run; the young generations are still collected.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)


def proxy_label(mode: str, workers: int) -> str:
    """A proxy's name in ``System.proxies`` and the results: the mode, with ``-w<N>`` for
    a proxy of N > 1 workers (``rmq-proxy --workers N``)."""
    return mode if workers == 1 else f"{mode}-w{workers}"


class System:
    """Name server + ``brokers`` brokers (stubs, or real ones with ``backend="real"``) +
    a proxy per mode, and per worker count in ``workers`` (default one single-process
    proxy per mode); ``modes`` lists the proxies' labels (``proxy_label``)."""

    def __init__(
        self,
        brokers: int = 4,
        modes=MODES,
        proxy_args: dict | None = None,
        backend: str = "stub",
        workers: tuple[int, ...] = (1,),
        log_dir: Path | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}")
        self.broker_count = brokers
        self.proxy_specs = {proxy_label(m, n): (m, n) for m in modes for n in workers}
        self.modes = tuple(self.proxy_specs)
        self.proxy_args = proxy_args or {}
        self.backend = backend
        # Where each proxy's log goes (``proxy-<label>.log``); None: inherited stderr.
        self.log_dir = log_dir
        self.cluster: RealCluster | None = None  # on the real backend
        self.namesrv: Process | None = None
        self.brokers: list[Process] = []
        self.proxies: dict[str, Process] = {}
        self.broker_clients: list[BrokerClient] = []

    async def start(self) -> System:
        try:
            if self.backend == "real":
                namesrv = await self._start_real()
            else:
                namesrv = await self._start_stubs()
            for label, (mode, workers) in self.proxy_specs.items():
                extra = [str(a) for a in self.proxy_args.get(mode, [])]
                self.proxies[label] = await self._spawn_proxy(label, namesrv, mode, workers, extra)
        except BaseException:
            await self.stop()
            raise
        return self

    async def _spawn_proxy(
        self, label: str, namesrv: str, mode: str, workers: int, extra: list[str]
    ) -> Process:
        args = [
            "--namesrv", namesrv, "--grpc-port", "0", "--http-port", "0", "--mode", mode,
            "--proxy-id", f"bench-{label}", "--workers", str(workers), "--log-level", "warning",
            *extra,
        ]  # fmt: skip
        if self.log_dir is None:
            return await _spawn(f"proxy-{label}", "proxy.cli", "main", *args)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Appended to: a restarted proxy keeps the lines of the one before (its drain).
        with (self.log_dir / f"proxy-{label}.log").open("ab") as log:  # the child keeps a copy
            return await _spawn(f"proxy-{label}", "proxy.cli", "main", *args, stderr=log)

    async def _start_stubs(self) -> str:
        self.namesrv = await _spawn(
            "namesrv", "broker_stub.cli", "namesrv_main", "--port", "0", "--log-level", "warning"
        )
        namesrv = self.namesrv.address["remoting"]
        for i in range(self.broker_count):
            name = f"broker-{chr(ord('a') + i)}"
            self.brokers.append(
                await _spawn(
                    name,
                    "broker_stub.cli",
                    "broker_main",
                    "--name",
                    name,
                    "--port",
                    "0",
                    "--namesrv",
                    namesrv,
                    "--log-level",
                    "warning",
                )
            )
            self.broker_clients.append(BrokerClient(name, self.brokers[-1].address["remoting"]))
        return namesrv

    async def _start_real(self) -> str:
        """The launcher's name server and brokers (JVMs, Profile.BENCH) on free ports; the
        blocking start runs in a thread."""
        from rocketmq_local.launcher import Profile, RealCluster

        self.cluster = await asyncio.to_thread(
            RealCluster.start, self.broker_count, profile=Profile.BENCH
        )
        c = self.cluster
        self.namesrv = Process("namesrv", c.namesrv.popen, {"remoting": c.namesrv_address})
        for b in c.brokers:
            self.brokers.append(Process(b.name, b.process.popen, {"remoting": b.address}))
            self.broker_clients.append(BrokerClient(b.name, b.address))
        return c.namesrv_address

    @property
    def namesrv_address(self) -> str:
        """The name server's remoting address (host:port), once started."""
        if self.namesrv is None:
            raise RuntimeError("the system is not started")
        return self.namesrv.address["remoting"]

    async def stop(self) -> None:
        for client in self.broker_clients:
            await client.close()
        ours: list[Process | None] = list(self.proxies.values())
        if self.cluster is None:
            ours += [*reversed(self.brokers), self.namesrv]
        for process in ours:
            if process is not None and isinstance(process.proc, asyncio.subprocess.Process):
                await terminate(process.proc, 15)
        if self.cluster is not None:
            # The launcher stops brokers, then the name server, by pid (SIGKILL past 10 s).
            await asyncio.to_thread(self.cluster.stop, 10.0)
            self.cluster = None

    async def create_topic(self, topic: str, queues: int = 4) -> None:
        """Create ``topic`` on every broker and wait until the name server routes it."""
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.create_topic, topic, queues)
        else:
            await asyncio.to_thread(admin.create_topic, self.namesrv_address, topic, queues)

    async def metrics(self, label: str) -> dict[str, float]:
        """A proxy's counters for the scenarios (``scrape``); bench/peer.py answers
        for the Apache proxy, which has no such endpoint, from the brokers' side."""
        return await scrape(self.proxies[label])

    async def slot_edge(self, label: str, starting: bool) -> None:
        """Called at the start and end of each measured slot of ``label`` (a hook for
        counting per slot; nothing here)."""

    async def parked(self, group: str, topic: str) -> dict[str, int]:
        """Requests parked on all brokers (the stub's POLLING_INFO totals)."""
        if self.cluster is not None:
            raise NotImplementedError("parked requests are counted by the broker stub only")
        pops = notifications = 0
        for client in self.broker_clients:
            response = await client.remoting.invoke(
                RemotingCommand(
                    RequestCode.POLLING_INFO,
                    {"consumerGroup": group, "topic": topic, "queueId": "-1"},
                ),
                3.0,
            )
            pops += int(response.fields.get("parkedPops", 0))
            notifications += int(response.fields.get("parkedNotifications", 0))
        return {"pops": pops, "notifications": notifications}


async def status(proxy: Process) -> dict[str, Any]:
    """The proxy's ``/v1/status``."""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http,
        http.get(f"http://{proxy.address['http']}/v1/status") as response,
    ):
        return dict(await response.json())


async def scrape(proxy: Process) -> dict[str, float]:
    """The proxy's metrics, summed by sample name and the labels that matter here."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{proxy.address['http']}/metrics") as response,
    ):
        text = await response.text()
    totals: dict[str, float] = {}
    for name, labels, value in every_sample(text):
        if name == "rocketmq_proxy_rpc_latency_seconds_count":
            key = f"rpc:{labels['protocol_type']}:{labels['request_code']}"
        elif name == "rocketmq_proxy_receive_total":
            key = f"receive:{labels['mode']}:{labels['result']}"
        elif name.startswith("rocketmq_proxy_gc_pause_seconds"):
            # gc:<generation>:count|sum|le=<bucket>
            part = name.rsplit("_", 1)[1]
            le = labels.get("le")
            key = f"gc:{labels['generation']}:{part if le is None else 'le=' + le}"
        else:
            key = name
        totals[key] = totals.get(key, 0.0) + value
    return totals


def gc_pauses(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """The full collections (generation 2) between two scrapes: how many, their mean pause,
    and the bucket bound below which all of them ended (the worst, to a bucket), in ms."""

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    count = delta("gc:2:count")
    bounds = sorted((float(k.rsplit("=", 1)[1]), k) for k in after if k.startswith("gc:2:le="))
    worst = next((b for b, k in bounds if delta(k) >= count), None) if count else None
    return {
        "full_gcs": count,
        "full_gc_ms_mean": round(delta("gc:2:sum") / count * 1000, 1) if count else None,
        "full_gc_ms_worst_below": None if worst is None else worst * 1000,
    }


def broker_requests_by_code(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Remoting requests the proxy sent to brokers between two scrapes, by request code."""
    prefix = "rpc:remoting:"
    return {
        k.removeprefix(prefix): v - before.get(k, 0.0)
        for k, v in after.items()
        if k.startswith(prefix) and v - before.get(k, 0.0) > 0
    }


def broker_requests(before: dict[str, float], after: dict[str, float]) -> float:
    """Remoting requests the proxy sent to brokers between two scrapes."""
    return sum(broker_requests_by_code(before, after).values())


def established_to(port: int) -> int:
    """TCP connections on this host established to ``port`` (the kernel's tables): the
    load generator's connections to a proxy, when it is the proxy's only client."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f)  # the header
            for line in f:
                remote, state = line.split()[2:4]
                count += state == "01" and int(remote.rsplit(":", 1)[1], 16) == port
    return count
