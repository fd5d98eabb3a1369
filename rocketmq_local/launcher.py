"""Real Apache RocketMQ 5 on loopback: a name server, N brokers and optionally the Apache
proxy, each a JVM of its own on free ports, with its own home, store and log folders.

The jars come from ``make rocketmq`` (``rocketmq_local/pom.xml`` copied into
``.cache/rocketmq/lib``); nothing is downloaded here. Used by the test suite's real tier
(one cluster per session, ``tests/conftest.py``), the benchmarks and ``make stack --real``.

Plain blocking code on purpose: starting a JVM is a subprocess and a bounded wait for its
ready line; callers in an event loop run it in a thread (or before the loop starts).

    with RealCluster.start(brokers=2) as cluster:
        cluster.create_topic("T")
        print(cluster.namesrv_address, [b.address for b in cluster.brokers])
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from rocketmq_local import admin
from rocketmq_local.admin import admin_call

REPO = Path(__file__).resolve().parents[1]
POM = Path(__file__).resolve().parent / "pom.xml"
#: Where ``make rocketmq`` puts the jars; RMQ_REAL_LIB points elsewhere.
DEFAULT_LIB = REPO / ".cache" / "rocketmq" / "lib"
HOST = "127.0.0.1"
CLUSTER_NAME = "DefaultCluster"

# The store casts buffers to sun.nio.ch.DirectBuffer and reflects into java.util and
# java.nio; JDK 17 refuses both unless opened (the distribution's runbroker.sh does this).
_JDK17_OPENS = [
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
]


class LauncherError(RuntimeError):
    """A RocketMQ process could not be started, or an admin request failed."""


class Profile(enum.Enum):
    """How much each JVM gets.

    ``TEST``: small heaps, the serial collector and C1 only, so a name server and two
    brokers start in a few seconds and sit idle at ~1 % of a core. ``BENCH``: the full JIT
    and larger heaps, for measurements of the brokers under load.
    """

    TEST = "test"
    BENCH = "bench"

    def jvm_options(self, role: str) -> list[str]:
        if self is Profile.TEST:
            heap = {"namesrv": "128m", "broker": "384m", "proxy": "384m", "admin": "128m"}[role]
            return [
                f"-Xms{heap}",
                f"-Xmx{heap}",
                # A broker of 5.5.0 ran out of 256 MB of direct memory after a few hundred
                # fresh topics in one session (the conformance suite makes many).
                f"-XX:MaxDirectMemorySize={'512m' if role == 'broker' else '256m'}",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ]
        heap = {"namesrv": "256m", "broker": "1g", "proxy": "1g", "admin": "128m"}[role]
        return [f"-Xms{heap}", f"-Xmx{heap}", "-XX:MaxDirectMemorySize=1g", "-XX:+UseG1GC"]


def lib_dir() -> Path:
    """The jar folder; fails with what to run when it is missing."""
    lib = Path(os.environ.get("RMQ_REAL_LIB", DEFAULT_LIB))
    if not lib.is_dir() or not any(lib.glob("rocketmq-broker-*.jar")):
        raise LauncherError(
            f"no RocketMQ jars in {lib}: run `make rocketmq` (Maven Central must be reachable)"
        )
    return lib


def rocketmq_version() -> str:
    """The pinned release, read from the jar names in the cache."""
    jar = next(lib_dir().glob("rocketmq-broker-*.jar"))
    return jar.stem.removeprefix("rocketmq-broker-")


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise LauncherError("no `java` on PATH and no JAVA_HOME: install a JDK 17")
    return found


MQADMIN_TIMEOUT_S = 60.0


def mqadmin(namesrv: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one command of the real ``mqadmin`` (the tools jar, a JVM of its own, bounded)
    against the name server ``namesrv``. It exits 0 even when its command failed: callers
    read a failure from the exception it prints on its error output."""
    with tempfile.TemporaryDirectory(prefix="mqadmin-") as home:
        argv = [
            java_binary(), "-Xms64m", "-Xmx128m", "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1", *_JDK17_OPENS, f"-Duser.home={home}",
            f"-Drocketmq.home.dir={home}", "-Djava.net.preferIPv4Stack=true",
            "-cp", f"{lib_dir()}/*", "org.apache.rocketmq.tools.command.MQAdminStartup",
            args[0], "-n", namesrv, *args[1:],
        ]  # fmt: skip
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=MQADMIN_TIMEOUT_S,
            env={**os.environ, "ROCKETMQ_HOME": home}, cwd=home,
        )  # fmt: skip


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


# Ports chosen ahead for a program to bind later come from below the range the kernel hands
# out for port 0 and for outgoing connections: one chosen inside that range and released
# can be taken by any other socket before its program binds it (CI saw a fleet port a test
# had chosen taken by another proxy's HTTP port 0). Nothing takes a port below the range
# unasked. From CHOSEN_PORTS_LOW, clear of the well-known defaults (9876, 10911, 9090).
CHOSEN_PORTS_LOW = 20_000
_handed_out: set[int] = set()  # this process's choices: never the same port twice


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port_block(offsets: tuple[int, ...] = (0,)) -> int:
    """A port P such that P + every offset is free now (a broker binds P, P-2 and P+1),
    chosen at random below the ephemeral range (``CHOSEN_PORTS_LOW``), and not one this
    process has chosen before."""
    low, high = CHOSEN_PORTS_LOW + 2, _ephemeral_low() - 2  # room for the offsets
    rng = random.Random()
    for _ in range(500):
        port = rng.randint(low, high) if high - low > 1_000 else _kernel_port()
        block = {port + d for d in offsets}
        if block & _handed_out:
            continue
        if all(1024 < q < 65536 and _port_free(q) for q in block):
            _handed_out.update(block)
            return port
    raise LauncherError("no free block of ports found")


def _kernel_port() -> int:
    """A port the kernel picks (a machine whose ephemeral range leaves no room below it)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def ready_timeout() -> float:
    """How long a JVM of a cluster may take to say it is ready: 90 s, or
    RMQ_REAL_READY_TIMEOUT_S. A cluster started while another one runs on the same 2 cores
    (the smoke tier's benchmarks beside the suite's session cluster) may need more."""
    return float(os.environ.get("RMQ_REAL_READY_TIMEOUT_S") or 90.0)


@dataclass
class JavaProcess:
    """One RocketMQ JVM: its home folder (logs, store, config) and its process."""

    name: str
    role: str
    home: Path
    ready_marker: str
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        """The JVM's process; spawn() has run."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never spawned")
        return self.proc

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def out_log(self) -> Path:
        return self.home / "out.log"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs" / "rocketmqlogs"

    def spawn(self, main_class: str, args: list[str], profile: Profile) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [
            java_binary(),
            *profile.jvm_options(self.role),
            *_JDK17_OPENS,
            f"-Duser.home={self.home}",
            f"-Drocketmq.home.dir={self.home}",
            f"-Drmq.logback.configurationFile=rmq.{self.role}.logback.xml",
            "-Djava.net.preferIPv4Stack=true",
            "-cp",
            f"{lib_dir()}/*",
            main_class,
            *args,
        ]
        env = {**os.environ, "ROCKETMQ_HOME": str(self.home)}
        with open(self.out_log, "wb") as out:
            # A process group of its own: a Ctrl-C meant for the test runner does not reach
            # the JVM first, so the owner stops it in order.
            self.proc = subprocess.Popen(
                argv,
                cwd=self.home,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                process_group=0,
            )

    def wait_ready(self, timeout_s: float | None = None) -> None:
        timeout_s = timeout_s or ready_timeout()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.ready_marker in self.out_log.read_text(errors="replace"):
                return
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise LauncherError(
                    f"{self.name} exited with code {code} before it was ready:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise LauncherError(
                    f"{self.name} not ready within {timeout_s:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.1)

    def threads_named(self, name: str) -> list[int]:
        """The ids of the JVM's threads whose name starts with ``name`` (as the kernel
        keeps it: its first 15 characters)."""
        found = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that has just ended
                if (task / "comm").read_text().strip().startswith(name[:15]):
                    found.append(int(task.name))
        return found

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.out_log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no output)"
        # The logback start-up chatter says nothing; keep the lines after it.
        kept = [line for line in text.splitlines() if "|-INFO in " not in line]
        return "\n".join(kept[-lines:])

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            os.kill(self.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the JVM runs its shutdown hooks), SIGKILL past ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped JVM cannot handle SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


@dataclass
class RealBroker:
    name: str
    port: int
    process: JavaProcess

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self.process.home / "store"


@dataclass
class ApacheProxy:
    """The Apache RocketMQ proxy in cluster mode: the peer our proxy is measured against."""

    grpc_port: int
    remoting_port: int
    process: JavaProcess

    @property
    def grpc_address(self) -> str:
        return f"{HOST}:{self.grpc_port}"


# The broker thread that writes the commit and rollback records (op messages) in batches:
# tests/conformance/test_transactions.py checks that it sleeps (``_broker_conf``).
OP_BATCH_THREAD = "TransactionalOpBatchService"


def _broker_conf(name: str, port: int, namesrv: str, store: Path, extra: dict[str, str]) -> str:
    conf = {
        "brokerClusterName": CLUSTER_NAME,
        "brokerName": name,
        "brokerId": "0",
        "brokerRole": "ASYNC_MASTER",
        "flushDiskType": "ASYNC_FLUSH",
        "listenPort": str(port),
        # Loopback only (NettyServerConfig's default is every interface); the HA port
        # (port + 1) has no such setting and still listens on all of them.
        "bindAddress": HOST,
        "namesrvAddr": namesrv,
        "brokerIP1": HOST,
        "brokerIP2": HOST,
        "storePathRootDir": str(store),
        "storePathCommitLog": str(store / "commitlog"),
        # Small mapped files: a test broker preallocates less than 100 MB of disk.
        "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
        "mappedFileSizeConsumeQueue": str(600_000),
        # Only V2 retry topics (%RETRY%group+topic) wake parked POP and NOTIFICATION
        # requests when a message is revived; RocketMQ 5 clusters run with it on.
        "enableRetryTopicV2": "true",
        # Writes are refused once the disk is fuller than this (default 90 %); shared
        # build machines are often 70-80 % full.
        "diskSpaceWarningLevelRatio": "98",
        "diskMaxUsedSpaceRatio": "98",
        # Tests create topics and groups on the fly, as clients of a dev cluster do.
        "autoCreateTopicEnable": "true",
        "autoCreateSubscriptionGroup": "true",
        # Transaction checks (defaults: every 30 s, of half messages older than 6 s) soon
        # enough for a test to see one: every second, of half messages older than 3 s.
        "transactionCheckInterval": "1000",
        "transactionTimeOut": "3000",
        # transactionCheckMax stays at its default, 15: a check the proxy loses counts
        # against it as on a production cluster (the soak raises it, bench/soak.py says why).
        # A commit or rollback is recorded (an op message) by a batching thread, at once
        # when its queue's pending records pass transactionOpMsgMaxSize bytes (default 4 KB),
        # else after transactionOpBatchInterval (default 3 s). With the 3 s above, a check
        # could find an ended transaction not yet recorded and ask its producer again. And
        # 5.5.0's thread takes its next wake-up from the oldest last write of every queue,
        # idle ones included: once any queue has been quiet for longer than the interval,
        # that time is past and the thread loops without waiting, a whole core for as long
        # as the broker runs. A 1-byte batch records every end at once; a day's interval
        # keeps the next wake-up ahead, so the thread sleeps until the next end.
        "transactionOpMsgMaxSize": "1",
        "transactionOpBatchInterval": str(24 * 3600 * 1000),
        # A send may wait this long in the broker's queue before the broker sheds it as
        # busy (default 200 ms): test machines run several JVMs and client processes on
        # 2 cores, and a shed send fails a test that is not about flow control.
        "waitTimeMillsInSendQueue": "1000",
        # The timer wheel (timed messages) is flushed every timerFlushIntervalMs (default
        # 1 s), and each flush compares the whole wheel (16 MB at the default 3-day range)
        # byte by byte with its mapped file: with the C1-only JIT of these JVMs that is about
        # 20 % of a core per broker, for as long as the broker runs. Every 10 s it is 2 %. A
        # killed broker loses nothing by it: its mapped pages stay in the page cache.
        "timerFlushIntervalMs": "10000",
        # SQL92 filters of pull consumers (a POP consumer's are applied either way on 5.5.0),
        # as clusters that serve SQL92 subscriptions run.
        "enablePropertyFilter": "true",
        # RECALL_MESSAGE (5.3.2+) is refused unless enabled.
        "recallMessageEnable": "true",
        # Lite topics (5.5): a message to a LITE parent topic is stored in its lite topic's
        # own queue (a light message queue, "%LMQ%$<parent>$<lite topic>") by multi-dispatch;
        # with either off, lite consumers never see a message.
        "enableLmq": "true",
        "enableMultiDispatch": "true",
        **extra,
    }
    return "".join(f"{k}={v}\n" for k, v in conf.items())


@dataclass
class RealCluster:
    """A running name server and brokers (and optionally the Apache proxy)."""

    root: Path
    namesrv_port: int
    namesrv: JavaProcess
    brokers: list[RealBroker]
    proxy: ApacheProxy | None = None
    owns_root: bool = False
    profile: Profile = Profile.TEST

    @property
    def namesrv_address(self) -> str:
        return f"{HOST}:{self.namesrv_port}"

    def broker(self, name: str) -> RealBroker:
        for b in self.brokers:
            if b.name == name:
                return b
        raise KeyError(name)

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        brokers: int = 2,
        *,
        root: Path | None = None,
        apache_proxy: bool = False,
        profile: Profile = Profile.TEST,
        broker_conf: dict[str, str] | None = None,
        broker_conf_of: Callable[[str], dict[str, str]] | None = None,
        names: tuple[str, ...] | None = None,
        ports: tuple[int, ...] | None = None,
        namesrv_port: int | None = None,
        ready_timeout_s: float | None = None,
    ) -> RealCluster:
        """Start a name server and ``brokers`` brokers (their start overlaps); wait until
        every broker has registered. On any failure everything started is stopped.
        ``broker_conf_of(name)`` adds settings of one broker (e.g. its own metrics port)."""
        ready_timeout_s = ready_timeout_s or ready_timeout()
        owns_root = root is None
        root = Path(tempfile.mkdtemp(prefix="rmq-real-")) if root is None else root
        root.mkdir(parents=True, exist_ok=True)
        names = names or tuple(f"broker-{chr(ord('a') + i)}" for i in range(brokers))
        ns_port = namesrv_port or free_port_block()
        namesrv = JavaProcess("namesrv", "namesrv", root / "namesrv", "boot success")
        cluster = cls(root, ns_port, namesrv, [], owns_root=owns_root, profile=profile)
        try:
            namesrv.home.mkdir(parents=True, exist_ok=True)
            (namesrv.home / "namesrv.conf").write_text(
                f"listenPort={ns_port}\nbindAddress={HOST}\n"
                f"kvConfigPath={namesrv.home}/kvConfig.json\n"
            )
            namesrv.spawn(
                "org.apache.rocketmq.namesrv.NamesrvStartup",
                ["-c", str(namesrv.home / "namesrv.conf")],
                profile,
            )
            namesrv.wait_ready(ready_timeout_s)
            for i, name in enumerate(names):
                # A broker binds its port, port - 2 (the "fast" port) and port + 1 (HA).
                port = ports[i] if ports else free_port_block((-2, 0, 1))
                proc = JavaProcess(name, "broker", root / name, "boot success")
                proc.home.mkdir(parents=True, exist_ok=True)
                conf = proc.home / "broker.conf"
                conf.write_text(
                    _broker_conf(name, port, cluster.namesrv_address, proc.home / "store",
                                 {**(broker_conf or {}),
                                  **(broker_conf_of(name) if broker_conf_of else {})})
                )  # fmt: skip
                proc.spawn("org.apache.rocketmq.broker.BrokerStartup", ["-c", str(conf)], profile)
                cluster.brokers.append(RealBroker(name, port, proc))
            for b in cluster.brokers:
                b.process.wait_ready(ready_timeout_s)
            cluster.wait_registered(ready_timeout_s)
            if apache_proxy:
                cluster.start_apache_proxy(ready_timeout_s=ready_timeout_s)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def restart_broker(self, name: str, ready_timeout_s: float | None = None) -> RealBroker:
        """Start a stopped (or killed) broker again on the same port and store."""
        broker = self.broker(name)
        if broker.process.running():
            raise LauncherError(f"{name} is still running (pid {broker.process.pid})")
        broker.process.spawn(
            "org.apache.rocketmq.broker.BrokerStartup",
            ["-c", str(broker.process.home / "broker.conf")],
            self.profile,
        )
        broker.process.wait_ready(ready_timeout_s)
        return broker

    def start_apache_proxy(
        self, ready_timeout_s: float | None = None, settings: dict[str, object] | None = None
    ) -> ApacheProxy:
        """The Apache proxy (cluster mode) in front of this cluster, ``settings`` added to its
        rmq-proxy.json. It needs a registered broker at start: it creates a system topic
        and exits if that fails."""
        grpc_port = free_port_block()
        remoting_port = free_port_block()
        proc = JavaProcess("apache-proxy", "proxy", self.root / "apache-proxy",
                           "rocketmq-proxy startup successfully")  # fmt: skip
        proc.home.mkdir(parents=True, exist_ok=True)
        conf = proc.home / "rmq-proxy.json"
        conf.write_text(
            json.dumps(
                {
                    "rocketMQClusterName": CLUSTER_NAME,
                    "namesrvAddr": self.namesrv_address,
                    "proxyMode": "cluster",
                    "grpcServerPort": grpc_port,
                    "remotingListenPort": remoting_port,
                    "grpcClientConsumerMinLongPollingTimeoutMillis": 5000,
                    "grpcClientConsumerMaxLongPollingTimeoutMillis": 20000,
                    **(settings or {}),
                }
            )
        )
        proc.spawn(
            "org.apache.rocketmq.proxy.ProxyStartup",
            ["-pc", str(conf), "-pm", "cluster", "-n", self.namesrv_address],
            self.profile,
        )
        self.proxy = ApacheProxy(grpc_port, remoting_port, proc)
        proc.wait_ready(ready_timeout_s)
        return self.proxy

    def processes(self) -> list[JavaProcess]:
        procs = [self.namesrv, *(b.process for b in self.brokers)]
        return [*([self.proxy.process] if self.proxy else []), *procs]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the proxy, then the brokers together, then the name server, each by process
        id (SIGTERM, SIGKILL past ``timeout_s``); remove the folders the launcher made."""
        waves = [[self.proxy.process] if self.proxy else [], [b.process for b in self.brokers],
                 [self.namesrv]]  # fmt: skip
        for wave in waves:
            started = time.monotonic()
            for proc in wave:
                proc.signal(signal.SIGCONT)  # a stopped JVM cannot handle SIGTERM
                proc.signal(signal.SIGTERM)
            for proc in wave:
                proc.stop(max(0.1, timeout_s - (time.monotonic() - started)))
        if self.owns_root and not os.environ.get("RMQ_REAL_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RealCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- admin requests ------------------------------------------------------------------

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Wait until the name server lists every broker of this cluster."""
        deadline = time.monotonic() + timeout_s
        want = {b.name for b in self.brokers}
        while True:
            response = admin_call(self.namesrv_address, RemotingCommand(
                code=RequestCode.GET_BROKER_CLUSTER_INFO))  # fmt: skip
            if response.code == ResponseCode.SUCCESS and response.body:
                # fastjson writes integer map keys unquoted; only the broker names matter.
                text = response.body.decode(errors="replace")
                if all(f'"{name}"' in text for name in want):
                    return
            if time.monotonic() > deadline:
                raise LauncherError(f"brokers {sorted(want)} not registered within {timeout_s}s")
            time.sleep(0.2)

    def create_topic(
        self, topic: str, queues: int = 4, *, fifo: bool = False, brokers: list[str] | None = None
    ) -> None:
        """The topic on every broker (or those named), routed (``rocketmq_local.admin``)."""
        targets = [self.broker(n) for n in brokers] if brokers else self.brokers
        admin.create_topic(
            self.namesrv_address, topic, queues, fifo=fifo,
            brokers={b.name: b.address for b in targets},
        )  # fmt: skip

    def create_group(self, group: str, *, retry_max_times: int = 16, fifo: bool = False) -> None:
        """The group on every broker (e.g. a short retry budget, so a test reaches the
        dead-letter queue in a few redeliveries; ``rocketmq_local.admin``)."""
        admin.create_group(
            self.namesrv_address, group, retry_max_times=retry_max_times, fifo=fifo,
            brokers={b.name: b.address for b in self.brokers},
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run a real cluster in the foreground until Ctrl-C (for trying things by hand)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--topic", action="append", default=[])
    parser.add_argument("--apache-proxy", action="store_true")
    parser.add_argument("--profile", choices=[p.value for p in Profile], default="test")
    args = parser.parse_args(argv)
    started = time.monotonic()
    cluster = RealCluster.start(
        args.brokers, apache_proxy=args.apache_proxy, profile=Profile(args.profile)
    )
    try:
        for topic in args.topic:
            cluster.create_topic(topic)
        print(f"RocketMQ {rocketmq_version()} ready in {time.monotonic() - started:.1f}s; "
              f"root {cluster.root}")  # fmt: skip
        print(f"  namesrv {cluster.namesrv_address} pid {cluster.namesrv.pid}")
        for b in cluster.brokers:
            print(f"  {b.name} {b.address} pid {b.process.pid}")
        if cluster.proxy:
            print(
                f"  apache-proxy grpc {cluster.proxy.grpc_address} pid {cluster.proxy.process.pid}"
            )
        sys.stdout.flush()
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
