"""`make stack`: a name server, three brokers, two proxies, Prometheus and the Pushgateway
on loopback, each a process of its own; prints every URL and stops them all on Ctrl-C.

Run it with the project's virtualenv (``.venv/bin/python deploy/local/stack.py``). The
proxies and broker stubs run this checkout's code (the interpreter with the repository on
PYTHONPATH). ``--real`` puts a real Apache RocketMQ 5 name server and three real brokers
in place of the stubs, started by rocketmq_local/launcher.py (the jars of
``make rocketmq``) and then supervised and stopped here like every other part.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from supervisor import Child, StackError, stop_in_order

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # the launcher (rocketmq_local) and the proxy's own modules
    sys.path.insert(0, str(REPO))
from rocketmq_local.launcher import free_port_block  # noqa: E402  (REPO on the path first)

HOST = "127.0.0.1"
BROKERS = ("broker-a", "broker-b", "broker-c")
PROXIES = ("proxy-1", "proxy-2")
READY_TIMEOUT_S = 30.0
# A proxy answers its polls in flight at once on SIGTERM, then gives other calls up to
# 10 s (proxy/app.py); past this it is killed.
PROXY_STOP_TIMEOUT_S = 35.0
# A real broker runs its shutdown hook on SIGTERM: 15 s on the loaded 2-core machine (it
# joins its service threads one by one); past this it is killed.
REAL_BROKER_STOP_TIMEOUT_S = 30.0
# Starting three broker JVMs on a busy two-core machine can take a while.
REAL_READY_TIMEOUT_S = 120.0


@dataclass
class Ports:
    """Ports of every component; 0 lets our own servers pick one and print it."""

    namesrv: int
    brokers: tuple[int, ...]
    proxy_grpc: tuple[int, ...]
    proxy_http: tuple[int, ...]
    prometheus: int
    pushgateway: int
    proxy_fleet: tuple[int, ...] = (8083, 8183)  # with --fleet: where the proxies meet

    @classmethod
    def defaults(cls) -> Ports:
        # docs/design.md's ports; the second proxy adds 100, Prometheus and the Pushgateway
        # keep their usual ones. A real broker also binds port - 2 and port + 1, which
        # these leave free.
        return cls(9876, (10911, 10921, 10931), (8081, 8181), (8082, 8182), 9090, 9091)

    @classmethod
    def from_base(cls, base: int, real: bool = False) -> Ports:
        # A real broker binds its port P, P - 2 and P + 1: brokers go 4 apart after the
        # rest (base + 10..21 in all); stubs take one port each.
        brokers = (base + 12, base + 16, base + 20) if real else (base + 1, base + 2, base + 3)
        fleet = (base + 10, base + 11)
        return cls(
            base, brokers, (base + 4, base + 6), (base + 5, base + 7), base + 8, base + 9, fleet
        )

    @classmethod
    def free(cls) -> Ports:
        # Prometheus and the Pushgateway cannot report a port they chose, and each fleet
        # member is told its peers' ports before they start: these are chosen ahead.
        fleet = (free_port_block(), free_port_block())
        return cls(0, (0, 0, 0), (0, 0), (0, 0), free_port_block(), free_port_block(), fleet)


@dataclass
class Endpoint:
    """What the stack prints and writes to ``<run dir>/stack.json`` for each component."""

    name: str
    kind: str  # what the address speaks
    address: str
    pid: int
    log: str
    urls: list[str]


def our_program(module: str, func: str) -> list[str]:
    """The argv that runs ``module.func()`` of this checkout with this interpreter (the
    ``rmq-*`` console scripts may be an editable install of another checkout)."""
    return [sys.executable, "-c", f"from {module} import {func}; {func}()"]


def our_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}


def system_binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise StackError(f"{names[0]} not found: `make system-deps` installs it (Debian package)")


def prepare_prometheus(config_dir: Path, run: Path, proxies: list[str], pushgateway: str) -> Path:
    """Copy the one Prometheus config and write the targets this stack's ports make."""
    if not (config_dir / "prometheus.yml").exists():
        raise StackError(f"{config_dir}/prometheus.yml not found")
    target = run / "prometheus"
    shutil.copytree(config_dir, target, ignore=shutil.ignore_patterns("targets", "tests"))
    targets = target / "targets"
    targets.mkdir()
    (targets / "proxies.json").write_text(json.dumps([{"targets": proxies}], indent=2) + "\n")
    (targets / "pushgateway.json").write_text(json.dumps([{"targets": [pushgateway]}]) + "\n")
    return target / "prometheus.yml"


class Stack:
    def __init__(
        self,
        ports: Ports,
        run: Path,
        prometheus_dir: Path,
        topics: list[str],
        real: str | None = None,
        fleet: bool = False,
    ) -> None:
        self.ports = ports
        self.fleet = fleet  # the proxies probe each key once between them (docs/scale.md)
        self.run = run
        self.prometheus_dir = prometheus_dir
        self.topics = topics
        # None: broker stubs; else the launcher's profile ("test" or "bench") for real JVMs.
        self.real = real
        self.logs = run / "logs"
        self.namesrv: Child | None = None
        self.brokers: list[Child] = []
        self.proxies: list[Child] = []
        self.monitoring: list[Child] = []
        self.endpoints: list[Endpoint] = []

    def children(self) -> list[Child]:
        named = [self.namesrv, *self.brokers, *self.proxies, *self.monitoring]
        return [c for c in named if c is not None]

    def _child(self, name: str, argv: list[str], stop_timeout_s: float = 10.0) -> Child:
        child = Child(name, argv, self.logs / f"{name}.log", stop_timeout_s=stop_timeout_s)
        child.start(our_env())
        return child

    def _endpoint(self, child: Child, kind: str, address: str, urls: list[str]) -> None:
        self.endpoints.append(Endpoint(child.name, kind, address, child.pid, str(child.log), urls))

    def start(self) -> None:
        if self.real:
            namesrv = self._start_real()
        else:
            self.namesrv = self._child(
                "namesrv",
                [*our_program("broker_stub.cli", "namesrv_main"), "--host", HOST,
                 "--port", str(self.ports.namesrv)],
            )  # fmt: skip
            line = r"^name server listening on (\S+)"
            namesrv = self.namesrv.wait_for_log(line, READY_TIMEOUT_S)[1]
            self._endpoint(self.namesrv, "remoting", namesrv, [])
            self._start_brokers(namesrv)
        self._start_proxies(namesrv)
        self._start_monitoring()
        (self.run / "stack.json").write_text(
            json.dumps([asdict(e) for e in self.endpoints], indent=2) + "\n"
        )

    def _start_real(self) -> str:
        """A real name server and three real brokers from the launcher (its JVM options,
        configs and ready checks), adopted as children of this stack: watched, and stopped
        in the stack's order. Their homes (out.log, logs/rocketmqlogs, store) are under
        ``<run dir>/rocketmq``."""
        from rocketmq_local.launcher import LauncherError, Profile, RealCluster

        free = self.ports.namesrv == 0
        try:
            cluster = RealCluster.start(
                len(BROKERS),
                root=self.run / "rocketmq",
                profile=Profile(self.real),
                names=BROKERS,
                ports=None if free else self.ports.brokers,
                namesrv_port=None if free else self.ports.namesrv,
                ready_timeout_s=REAL_READY_TIMEOUT_S,
            )
        except LauncherError as exc:
            raise StackError(f"real RocketMQ did not start: {exc}") from None
        self.namesrv = Child.adopt("namesrv", cluster.namesrv.popen, cluster.namesrv.out_log)
        self.brokers = [
            Child.adopt(b.name, b.process.popen, b.process.out_log, REAL_BROKER_STOP_TIMEOUT_S)
            for b in cluster.brokers
        ]
        # Beside the ready block's out.log: the JVM's own log folder.
        self._endpoint(self.namesrv, "remoting", cluster.namesrv_address,
                       [str(cluster.namesrv.log_dir)])  # fmt: skip
        for child, broker in zip(self.brokers, cluster.brokers, strict=True):
            self._endpoint(child, "remoting", broker.address, [str(broker.process.log_dir)])
        try:
            for topic in self.topics:
                cluster.create_topic(topic)
        except LauncherError as exc:
            raise StackError(str(exc)) from None
        return cluster.namesrv_address

    def _start_brokers(self, namesrv: str) -> None:
        topics = [arg for t in self.topics for arg in ("--topic", t)]
        for name, port in zip(BROKERS, self.ports.brokers, strict=True):
            argv = [*our_program("broker_stub.cli", "broker_main"), "--name", name, "--host", HOST]
            argv += ["--port", str(port), "--namesrv", namesrv, *topics]
            self.brokers.append(self._child(name, argv))
        for broker in self.brokers:
            line = rf"^broker {broker.name} listening on (\S+)"
            address = broker.wait_for_log(line, READY_TIMEOUT_S)[1]
            self._endpoint(broker, "remoting", address, [])

    def _start_proxies(self, namesrv: str) -> None:
        ports = zip(PROXIES, self.ports.proxy_grpc, self.ports.proxy_http, strict=True)
        for name, grpc_port, http_port in ports:
            argv = [*our_program("proxy.cli", "main"), "--proxy-id", name, "--namesrv", namesrv]
            argv += ["--grpc-host", HOST, "--grpc-port", str(grpc_port)]
            argv += ["--http-host", HOST, "--http-port", str(http_port)]
            argv += ["--event-log-dir", str(self.run / "events")]
            # One process per proxy: two proxies side by side are the point here, and
            # their event logs keep the names proxy-1, proxy-2 (a worker group's are
            # <id>-w<k>).
            argv += ["--workers", "1"]
            if self.fleet:
                argv += ["--config", str(self._fleet_config(name))]
            self.proxies.append(self._child(name, argv, PROXY_STOP_TIMEOUT_S))
        for proxy in self.proxies:
            ready = proxy.wait_for_log(r"^rmq-proxy ready grpc=(\S+) http=(\S+)", READY_TIMEOUT_S)
            http = f"http://{ready[2]}"
            urls = [f"{http}/metrics", f"{http}/readyz", f"{http}/healthz", f"{http}/v1/status"]
            self._endpoint(proxy, "gRPC", ready[1], urls)

    def _fleet_config(self, name: str) -> Path:
        """The [fleet] table of proxy ``name``: every proxy's fleet address as peers."""
        peers = [f"{HOST}:{port}" for port in self.ports.proxy_fleet]
        port = self.ports.proxy_fleet[PROXIES.index(name)]
        path = self.run / f"{name}.toml"
        path.write_text(f'[fleet]\npeers = {json.dumps(peers)}\nhost = "{HOST}"\nport = {port}\n')
        return path

    def _start_monitoring(self) -> None:
        push = f"{HOST}:{self.ports.pushgateway}"
        prom = f"{HOST}:{self.ports.prometheus}"
        proxies_ops = [e.urls[0].split("/")[2] for e in self.endpoints if e.name in PROXIES]
        config = prepare_prometheus(self.prometheus_dir, self.run, proxies_ops, push)
        gateway = self._child(
            "pushgateway",
            [
                system_binary("prometheus-pushgateway", "pushgateway"),
                f"--web.listen-address={push}",
                # Debian's build defaults to a system-wide file; keep the stack's in its run dir.
                f"--persistence.file={self.run / 'pushgateway.data'}",
            ],
        )
        prometheus = self._child(
            "prometheus",
            [
                system_binary("prometheus"),
                f"--config.file={config}",
                f"--web.listen-address={prom}",
                f"--storage.tsdb.path={self.run / 'prometheus-data'}",
            ],
        )
        self.monitoring = [gateway, prometheus]
        gateway.wait_for_http(f"http://{push}/-/ready", READY_TIMEOUT_S)
        self._endpoint(gateway, "HTTP", push, [f"http://{push}/", f"http://{push}/metrics"])
        prometheus.wait_for_http(f"http://{prom}/-/ready", READY_TIMEOUT_S)
        self._endpoint(prometheus, "HTTP", prom, [f"http://{prom}/", f"http://{prom}/targets"])

    def describe(self) -> str:
        if self.real:
            from rocketmq_local.launcher import rocketmq_version

            brokers = f"real RocketMQ {rocketmq_version()} brokers, {self.real} profile"
        else:
            brokers = "broker stubs"
        lines = [f"stack ready ({brokers}); run dir {self.run}"]
        for e in self.endpoints:
            lines.append(f"  {e.name:<12} {e.kind:<8} {e.address:<22} pid {e.pid}")
            lines.extend(f"  {'':<21} {url}" for url in e.urls)
        lines.append(f"  {'logs':<21} {self.logs}")
        if self.real:
            lines.append(f"  {'rocketmq':<21} {self.run / 'rocketmq'} (<name>/out.log, store)")
        lines.append(f"  {'event logs':<21} {self.run / 'events'}")
        lines.append("gRPC clients: either proxy address above. Ctrl-C stops everything.")
        return "\n".join(lines)

    def first_exited(self) -> Child | None:
        return next((c for c in self.children() if c.exited() is not None), None)

    def stop(self) -> bool:
        # Proxies first, so they can hand undelivered messages back to running brokers.
        waves = [
            self.proxies,
            self.monitoring,
            self.brokers,
            [self.namesrv] if self.namesrv else [],
        ]
        return stop_in_order(waves, say)


def say(text: str) -> None:
    print(text, flush=True)


class Stop(Exception):
    """Raised from the SIGINT/SIGTERM handler to leave any wait at once."""


def _on_signal(signum: int, _frame: object) -> None:
    # Further signals while stopping are ignored: the stop has its own deadlines.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Stop(signal.Signals(signum).name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="stack",
        description="Name server, 3 brokers, 2 proxies, Prometheus and the Pushgateway on "
        "127.0.0.1. Default ports: name server 9876, brokers 10911/10921/10931, proxy-1 "
        "8081 (gRPC) 8082 (ops), proxy-2 8181/8182, Prometheus 9090, Pushgateway 9091.",
    )
    p.add_argument(
        "--real",
        action="store_true",
        help="a real Apache RocketMQ 5 name server and brokers instead of the stubs "
        "(the jars of `make rocketmq`, a JDK 17)",
    )
    p.add_argument(
        "--real-profile",
        choices=["test", "bench"],
        default="test",
        help="JVM sizing of the real name server and brokers (rocketmq_local/launcher.py): "
        "test = small heaps, quick start (default); bench = full JIT, 1 GB heaps",
    )
    ports = p.add_mutually_exclusive_group()
    ports.add_argument(
        "--base-port",
        type=int,
        help="use ten consecutive ports from here: name server, brokers (+1..+3), "
        "proxy-1 gRPC/ops (+4/+5), proxy-2 (+6/+7), Prometheus (+8), Pushgateway (+9); "
        "with --real the brokers take +12, +16, +20 (each also binds port-2 and port+1)",
    )
    ports.add_argument("--free-ports", action="store_true", help="let the OS pick every port")
    p.add_argument(
        "--fleet",
        action="store_true",
        help="the proxies probe each key once between them ([fleet] peers; fleet ports "
        "8083/8183, or --base-port +10/+11)",
    )
    p.add_argument("--run-dir", help="logs, event logs, Prometheus data (default: a new temp dir)")
    p.add_argument(
        "--prometheus-dir",
        default=str(REPO / "deploy" / "prometheus"),
        help="directory with prometheus.yml and rules/ (default deploy/prometheus)",
    )
    p.add_argument(
        "--topic",
        action="append",
        help="topic created on every broker (repeatable; default TestTopic and OrderTopic)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.free_ports:
        ports = Ports.free()
    elif args.base_port is not None:
        ports = Ports.from_base(args.base_port, real=args.real)
    else:
        ports = Ports.defaults()
    if args.run_dir:
        run = Path(args.run_dir).resolve()
        run.mkdir(parents=True, exist_ok=True)
    else:
        run = Path(tempfile.mkdtemp(prefix="rmq-stack-"))
    topics = args.topic or ["TestTopic", "OrderTopic"]
    real = args.real_profile if args.real else None
    stack = Stack(ports, run, Path(args.prometheus_dir).resolve(), topics, real, args.fleet)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    failed = False
    try:
        say(f"starting the stack; logs in {run / 'logs'}")
        stack.start()
        say(stack.describe())
        while (dead := stack.first_exited()) is None:
            time.sleep(0.5)
        say(f"{dead.name} exited with code {dead.exited()}; last lines of {dead.log}:")
        say(dead.log_tail())
        failed = True
    except Stop as why:
        say(f"{why}: stopping")
    except StackError as exc:
        say(f"error: {exc}")
        failed = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        clean = stack.stop()
    say(f"stopped; logs kept in {run}")
    return 1 if failed or not clean else 0


if __name__ == "__main__":
    sys.exit(main())
