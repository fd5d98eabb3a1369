"""``rmq-proxy --workers N`` (N > 1): one supervisor process, N worker processes.

The proxy keeps no state beyond the polls in flight, so N copies of it can serve one gRPC
port: every worker (``proxy.worker``) binds it with SO_REUSEPORT and the kernel spreads
incoming connections over them. The supervisor

- picks the gRPC port first (port 0 works) and holds it, bound but not listening, for its
  lifetime, so a worker restarted after all others died still finds it free;
- runs the embedded broker stubs of ``--embedded-brokers`` itself, once, so that every
  worker fronts the same brokers;
- serves the group's ops port: ``/metrics`` merges what every worker wrote to the
  multiprocess directory (``GroupMetrics``), ``/readyz`` is ready while the group serves,
  ``/v1/status`` lists the workers with each one's own status;
- restarts a worker that dies, after a back-off, with a log line;
- prints the ``rmq-proxy ready ...`` line once, when every worker serves;
- on SIGTERM or SIGINT forwards SIGTERM to every worker, waits for them to drain, kills
  those still there after ``shutdown_grace_s``, and exits 0 if every worker stopped cleanly.

It never polls: each worker has one task that awaits its process's output and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from proxy.config import ProxyConfig
from proxy.embedded import EmbeddedBrokers, fronting, start_embedded_brokers
from proxy.observability.client_totals import STORE_FILE, ClientHistograms
from proxy.observability.live_gauges import FILES_GLOB as LIVE_GAUGE_FILES
from proxy.observability.metrics import GroupMetrics
from proxy.observability.ops import OpsServer
from proxy.security.self_signed import SelfSigned, make_self_signed, proxy_hosts
from proxy.worker import config_to_json

log = logging.getLogger("proxy.supervisor")

READY_TIMEOUT_S = 60.0  # a worker's start, to its ready line
RESTART_BACKOFF_S = (0.5, 30.0)  # first, maximum (doubling between)
STABLE_AFTER_S = 60.0  # a worker that served this long restarts with the first back-off
STATUS_TIMEOUT_S = 2.0  # asking a worker for its /v1/status
KILL_WAIT_S = 5.0


@dataclass
class WorkerSlot:
    """One of the N workers, across its restarts."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    ready: bool = False
    http: str | None = None  # the worker's private ops server
    restarts: int = 0
    started: float = 0.0  # monotonic, of the current process
    last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` (0: a free port) with SO_REUSEPORT without listening: the port is
    ours, and the workers' SO_REUSEPORT sockets can bind it too."""
    infos = socket.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _clear_metrics_dir(directory: str) -> None:
    """Remove the files of an earlier run: prometheus-client's sample files, the workers'
    live gauges, and the clients' totals (``STORE_FILE`` and SQLite's files beside it)."""
    patterns = [f"{kind}_*.db" for kind in ("counter", "gauge_*", "histogram", "summary")]
    patterns += [f"{STORE_FILE}*", LIVE_GAUGE_FILES]
    for pattern in patterns:
        for path in glob.glob(os.path.join(directory, pattern)):
            os.remove(path)


class Supervisor:
    def __init__(self, config: ProxyConfig, workers: int, log_level: str = "info") -> None:
        if workers < 2:
            raise ValueError("a supervisor runs 2 or more workers")
        self.config = config
        self.http_port = config.http_port  # the ops port once bound
        self.log_level = log_level
        self.slots = [WorkerSlot(k) for k in range(workers)]
        self.started_at = time.time()
        self.serving = False  # every worker was ready once; the ready line is out
        self.stopping = False
        self._stop = asyncio.Event()
        self._all_ready = asyncio.Event()
        self._failed: asyncio.Future[str] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None
        self._metrics_dir = ""
        self._group: GroupMetrics | None = None

    # -- the run -----------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the process's exit code."""
        config = self.config
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        self._failed = loop.create_future()
        own_dir = config.metrics_dir is None
        if config.metrics_dir is None:
            self._metrics_dir = tempfile.mkdtemp(prefix="rmq-proxy-metrics-")
        else:
            self._metrics_dir = config.metrics_dir
            os.makedirs(self._metrics_dir, exist_ok=True)
            await asyncio.to_thread(_clear_metrics_dir, self._metrics_dir)
        cluster: EmbeddedBrokers | None = None
        reservations: list[socket.socket] = []
        self_signed: SelfSigned | None = None
        ops: OpsServer | None = None
        try:
            cluster = await start_embedded_brokers(config)
            # The client ports, reserved for the group's lifetime (the remoting ones if on).
            ports: dict[str, int | None] = {
                "grpc": config.grpc_port,
                "remoting": config.remoting_port,
                **{f"remoting {b}": p for b, p in config.remoting_broker_ports.items()},
            }
            bound: dict[str, int] = {}
            for name, port in ports.items():
                if port is None:
                    continue
                try:
                    reservations.append(reserve_port(config.grpc_host, port))
                except OSError as exc:
                    log.error("rmq-proxy did not start: %s port %s:%s: %s",
                              name, config.grpc_host, port, exc)  # fmt: skip
                    return 1
                bound[name] = reservations[-1].getsockname()[1]
            # The workers' configuration: the embedded name server, the reserved ports (a
            # new object: the caller's configuration stays as it was).
            config = self.config = replace(
                fronting(config, cluster),
                grpc_port=bound["grpc"],
                remoting_port=bound.get("remoting"),
                remoting_broker_ports={
                    b: bound[f"remoting {b}"] for b in config.remoting_broker_ports
                },
            )
            # One self-signed certificate for every worker, so that a client told to trust
            # it is served by whichever worker the kernel hands its connection to.
            security = config.security
            if security.serves_tls and not security.tls:
                self_signed = await asyncio.to_thread(make_self_signed, proxy_hosts(config))
                config = self.config = replace(
                    config,
                    security=replace(
                        security,
                        tls_cert_file=self_signed.cert_file,
                        tls_key_file=self_signed.key_file,
                    ),
                )
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=STATUS_TIMEOUT_S)
            )
            clients = ClientHistograms.of_group(self._metrics_dir)
            self._group = GroupMetrics(self._metrics_dir, clients)
            ops = OpsServer(self._group, status=self.status, ready=self.ready)
            self.http_port = await ops.start(config.http_host, config.http_port)
            self._tasks = [
                asyncio.create_task(self._keep(slot), name=f"worker-{slot.index}")
                for slot in self.slots
            ]
            if not await self._wait_first_ready():
                return 1
            self.serving = True
            remoting_field = (
                "" if config.remoting_port is None
                else f"remoting={config.grpc_host}:{config.remoting_port} "
            )  # fmt: skip
            print(
                f"rmq-proxy ready grpc={config.grpc_host}:{config.grpc_port} {remoting_field}"
                f"http={config.http_host}:{self.http_port} "
                f"namesrv={','.join(config.namesrv_addrs)}",
                flush=True,
            )
            log.info("%d workers serving grpc port %d", len(self.slots), config.grpc_port)
            await self._stop.wait()
            return 0 if await self._drain() else 1
        finally:
            self.stopping = True
            await self._drain()  # no-op after a drain; stops workers on a failed start
            if ops is not None:
                await ops.stop()
            if self._http is not None:
                await self._http.close()
            for reservation in reservations:
                reservation.close()
            if cluster is not None:
                await cluster.stop()
            if own_dir:
                await asyncio.to_thread(shutil.rmtree, self._metrics_dir, True)
            if self_signed is not None:
                await asyncio.to_thread(self_signed.remove)

    async def _wait_first_ready(self) -> bool:
        """Every worker ready (True), or a failed start or a signal first (False)."""
        assert self._failed is not None
        ready = asyncio.ensure_future(self._all_ready.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        waits: set[asyncio.Future[Any]] = {ready, stop, self._failed}
        try:
            done, _ = await asyncio.wait(
                waits,
                timeout=READY_TIMEOUT_S + 5.0,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            ready.cancel()
            stop.cancel()
        if self._failed in done:
            log.error("rmq-proxy did not start: %s", self._failed.result())
            return False
        if ready not in done:
            log.error("rmq-proxy did not start: %s", "stopped" if stop in done else "timeout")
            return False
        return True

    async def _drain(self) -> bool:
        """SIGTERM every worker, wait up to the shutdown grace, kill the rest. True when
        every worker exited by itself with code 0 (or was ended by the SIGTERM before it
        could install its handler, with nothing in flight)."""
        self.stopping = True
        tasks, self._tasks = self._tasks, []
        if not tasks:
            return True
        for slot in self.slots:
            slot.ready = False
            if slot.alive():
                assert slot.proc is not None
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.send_signal(signal.SIGTERM)
        clean = True
        procs = [s.proc for s in self.slots if s.alive() and s.proc is not None]
        if procs:
            waits = [asyncio.ensure_future(p.wait()) for p in procs]
            _, pending = await asyncio.wait(waits, timeout=self.config.shutdown_grace_s)
            for proc in procs:
                if proc.returncode is None:
                    log.warning("worker pid %d still draining after %.0f s: killed",
                                proc.pid, self.config.shutdown_grace_s)  # fmt: skip
                    clean = False
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if pending:
                await asyncio.wait(pending, timeout=KILL_WAIT_S)
            clean = clean and all(p.returncode in (0, -signal.SIGTERM) for p in procs)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return clean

    # -- one worker, across restarts ---------------------------------------------------------

    async def _keep(self, slot: WorkerSlot) -> None:
        """Run the worker of ``slot``; restart it when it dies, until the supervisor stops."""
        backoff = RESTART_BACKOFF_S[0]
        while not self.stopping:
            reason = await self._run_once(slot)
            if self.stopping:
                return
            if not self._all_ready.is_set():  # the group never served: give up
                assert self._failed is not None
                if not self._failed.done():
                    self._failed.set_result(f"worker {slot.index}: {reason}")
                return
            served = time.monotonic() - slot.started
            if served >= STABLE_AFTER_S:
                backoff = RESTART_BACKOFF_S[0]
            log.warning(
                "worker %d (pid %s) %s after %.1f s; restarting in %.1f s",
                slot.index, slot.pid, reason, served, backoff,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])
            slot.restarts += 1

    async def _run_once(self, slot: WorkerSlot) -> str:
        """Start the worker, wait for its ready line, then for its exit; why it ended."""
        config = self.config
        worker_config = replace(
            config,
            proxy_id=f"{config.proxy_id}-w{slot.index}",
            http_host="127.0.0.1",
            http_port=0,
            embedded_brokers=0,
            workers=1,
            metrics_dir=None,
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy.worker",
            "--index",
            str(slot.index),
            "--parent",
            str(os.getpid()),
            "--log-level",
            self.log_level,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": self._metrics_dir},
        )
        slot.proc, slot.started, slot.ready, slot.http = proc, time.monotonic(), False, None
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(config_to_json(worker_config))
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died at once; its exit code says more
        try:
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                return f"printed no ready line within {READY_TIMEOUT_S:.0f} s"
            words = line.decode(errors="replace").split()
            if words[:3] == ["rmq-proxy", "worker", "ready"]:
                fields = dict(w.split("=", 1) for w in words[3:] if "=" in w)
                slot.http, slot.ready = fields.get("http"), True
                if all(s.ready for s in self.slots):
                    self._all_ready.set()
            # Keep reading until it closes stdout (it prints nothing more), so it can
            # never block on a full pipe; then collect its exit code.
            while await proc.stdout.readline():
                pass
            code = await proc.wait()
        except asyncio.CancelledError:
            # The supervisor is stopping: a worker it has not signalled yet must not outlive it.
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            raise
        finally:
            slot.ready = False
            if proc.returncode is not None and self._group is not None:
                self._group.mark_dead(proc.pid)
        slot.last_exit = code
        return f"exited with code {code}"

    # -- the ops server's view ---------------------------------------------------------------

    def ready(self) -> bool:
        """Ready while the group serves: started, not draining, a worker ready."""
        return self.serving and not self.stopping and any(s.ready for s in self.slots)

    async def status(self) -> dict[str, Any]:
        workers = await asyncio.gather(*(self._worker_status(s) for s in self.slots))
        return {
            "proxy_id": self.config.proxy_id,
            "pid": os.getpid(),
            "ready": self.ready(),
            "uptime_s": round(time.time() - self.started_at, 1),
            "grpc": f"{self.config.grpc_host}:{self.config.grpc_port}",
            "namesrv": self.config.namesrv_addrs,
            "metrics_dir": self._metrics_dir,
            "workers": workers,
        }

    async def _worker_status(self, slot: WorkerSlot) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "index": slot.index,
            "pid": slot.pid if slot.alive() else None,
            "ready": slot.ready,
            "restarts": slot.restarts,
            "last_exit": slot.last_exit,
            "http": slot.http,
            "status": None,
        }
        if slot.ready and slot.http and self._http is not None:
            try:
                async with self._http.get(f"http://{slot.http}/v1/status") as response:
                    entry["status"] = await response.json()
            except (aiohttp.ClientError, TimeoutError) as exc:
                entry["status"] = {"error": repr(exc)}
        return entry
