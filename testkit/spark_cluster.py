"""A Spark standalone cluster on loopback for the tests: a master and workers, each a JVM of
its own, started with PySpark's own ``bin/spark-class`` (the ``standalone_cluster`` fixture
in conftest.py; docs/analytics.md, "Tests on a standalone cluster").

Everything binds 127.0.0.1 on free ports; each worker offers 1 core and 1 GB to executors
and keeps its work directory (the executors' own directories and logs) under the cluster's
root. Every JVM is started in a process group of its own, so stopping a worker's group also
stops the executor JVMs the worker started. :class:`ClusterError` says what went wrong,
with the tail of every daemon's log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from rocketmq_local.launcher import free_port_block

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
WORKER_CORES = 1
WORKER_MEMORY = "1g"  # what a worker offers to executors (the tests ask 512m each)
DAEMON_MEMORY = "256m"  # the master's and each worker's own heap
# Short-lived daemons on a small machine: no JIT beyond C1, the serial collector.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# The daemons' own settings (their --properties-file): no REST submission server (it would
# bind the fixed port 6066), nothing cleaned up behind the tests' back.
DAEMON_CONF = """\
spark.master.rest.enabled       false
spark.worker.cleanup.enabled    false
spark.shuffle.service.enabled   false
"""


class ClusterError(RuntimeError):
    """The cluster did not start, or did not reach the state a test waited for."""


def spark_home() -> Path:
    """The SPARK_HOME of the installed pyspark package (bin/, jars/, python/lib/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass(slots=True)
class Daemon:
    """One JVM the fixture started (the master or a worker)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    webui_port: int
    work_dir: Path | None = None  # workers: where their executors run

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2500) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return text[-chars:]


@dataclass(slots=True)
class StandaloneCluster:
    root: Path
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)
    killed: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The master URL for ``--master``."""
        return f"spark://{HOST}:{self.master.port}"

    @property
    def webui(self) -> str:
        return f"http://{HOST}:{self.master.webui_port}"

    def daemons(self) -> list[Daemon]:
        return [self.master, *self.workers]

    def alive_workers(self) -> list[Daemon]:
        return [w for w in self.workers if w not in self.killed]

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON): workers, applications, status."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as r:
            state: dict[str, Any] = json.load(r)
        return state

    def registered_workers(self) -> int:
        """Workers the master holds ALIVE."""
        state = self.state()
        if "aliveworkers" in state:
            return int(state["aliveworkers"])
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def active_apps(self) -> list[dict[str, Any]]:
        return list(self.state().get("activeapps", []))

    def wait_for_workers(self, count: int, timeout: float = START_TIMEOUT_S) -> None:
        """Until the master holds exactly ``count`` workers ALIVE."""
        seen: list[int] = []

        def registered() -> bool:
            seen.append(self.registered_workers())
            return seen[-1] == count

        self.wait(registered, timeout, f"{count} workers registered with the master "
                  f"(last seen: {seen[-1:] or 'no answer'})")  # fmt: skip

    def kill_worker(self, worker: Daemon, timeout: float = 60.0) -> None:
        """SIGKILL one worker's JVM (its pid alone, as a crash would), then wait until the
        master has dropped it. Its executors lose their worker and exit by themselves."""
        assert worker in self.workers and worker not in self.killed
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)
        self.killed.append(worker)
        self.wait_for_workers(len(self.alive_workers()), timeout)

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``condition`` (connection errors count as not yet) until it holds, failing
        with every daemon's log tail when a daemon that should run has exited or after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            for daemon in self.daemons():
                if daemon not in self.killed and not daemon.alive():
                    raise ClusterError(
                        f"{daemon.name} (pid {daemon.pid}) exited with "
                        f"{daemon.proc.returncode} while waiting for {what}\n" + self.diagnostics()
                    )
            with suppress(OSError, ValueError):
                if condition():
                    return
            if time.monotonic() > deadline:
                raise ClusterError(f"no {what} within {timeout:.0f} s\n" + self.diagnostics())
            time.sleep(0.2)

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {d.name} (pid {d.pid}, {d.log}) ---\n{d.log_tail()}" for d in self.daemons()
        )


def _free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports, where the kernel hands out none by itself."""
    return [free_port_block() for _ in range(count)]


def _daemon_env(conf_dir: Path) -> dict[str, str]:
    # Nothing of the caller's Spark settings (the test session's SPARK_LOCAL_IP, a gateway
    # port) leaks in; the executors the workers start inherit this environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.pop("PYTHONPATH", None)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_LOCAL_IP=HOST,
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTS,
    )
    return env


def _start(name: str, args: list[str], root: Path, env: dict[str, str], **ports: Any) -> Daemon:
    log = root / "logs" / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: it and the executors it starts
        )
    return Daemon(name=name, proc=proc, log=log, **ports)


@contextmanager
def standalone_cluster(
    root: Path,
    workers: int = 2,
    timeout: float = START_TIMEOUT_S,
    worker_memory: str = WORKER_MEMORY,
) -> Iterator[StandaloneCluster]:
    """A master and ``workers`` workers of 1 core and ``worker_memory`` each, all
    registered, until the block ends; then every JVM is stopped (SIGTERM, SIGKILL after
    STOP_TIMEOUT_S), with its executors."""
    (root / "logs").mkdir(parents=True, exist_ok=True)
    conf_dir = root / "conf"
    conf_dir.mkdir(exist_ok=True)
    conf = conf_dir / "spark-defaults.conf"
    conf.write_text(DAEMON_CONF)
    env = _daemon_env(conf_dir)
    started: list[Daemon] = []
    ports = iter(_free_ports(2 + 2 * workers))  # RPC and web UI of each daemon
    try:
        port, webui = next(ports), next(ports)
        master = _start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(port),
             "--webui-port", str(webui), "--properties-file", str(conf)],
            root, env, port=port, webui_port=webui,
        )  # fmt: skip
        started.append(master)
        cluster = StandaloneCluster(root=root, master=master)
        started_at = time.monotonic()
        # Workers started before the master listens retry only after 5-15 s: wait for it.
        cluster.wait(lambda: cluster.state().get("status") == "ALIVE", timeout, "master ALIVE")
        for i in range(workers):
            port, webui = next(ports), next(ports)
            work_dir = root / f"worker-{i}"
            work_dir.mkdir(exist_ok=True)
            worker = _start(
                f"worker-{i}",
                ["org.apache.spark.deploy.worker.Worker", "--host", HOST, "--port", str(port),
                 "--webui-port", str(webui), "--cores", str(WORKER_CORES),
                 "--memory", worker_memory, "--work-dir", str(work_dir),
                 "--properties-file", str(conf), cluster.url],
                root, env, port=port, webui_port=webui, work_dir=work_dir,
            )  # fmt: skip
            started.append(worker)
            cluster.workers.append(worker)
        cluster.wait_for_workers(workers, max(1.0, timeout - (time.monotonic() - started_at)))
        yield cluster
    finally:
        stop(started)


def stop(daemons: list[Daemon]) -> None:
    """SIGTERM every daemon still running (workers first: a worker stopping stops its
    executors), SIGKILL what is left after STOP_TIMEOUT_S; then SIGKILL whatever is left in
    their process groups (the executors of a worker that was killed)."""
    for daemon in reversed(daemons):
        if daemon.alive():
            daemon.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for daemon in reversed(daemons):
        try:
            daemon.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(timeout=10)
    for daemon in daemons:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(daemon.pid, signal.SIGKILL)  # the group is the daemon's pid


# --- Submitting the job to the cluster (deploy/spark/run-on-cluster.sh) ---


def submit(
    cluster: StandaloneCluster, driver_python: str, args: list[str], out: IO[Any], err: IO[Any]
) -> subprocess.Popen[str]:
    """deploy/spark/run-on-cluster.sh MASTER ARGS..., in a process group of its own (the
    script, spark-submit's JVM and the Python driver it starts)."""
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.driver.memory": "512m",
        # Sized to the test workers (1 core, 1 GB each): one executor on each.
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        # JVMs that live a minute: the C1 compiler alone costs less CPU than C2's.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.cores.max": str(len(cluster.alive_workers())),
        # No task before every executor has registered, so that all of them take part.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        # Two state partitions for the stream; the first day's windows fall in both.
        "spark.sql.shuffle.partitions": "2",
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPARK_", "PYSPARK_")) and k != "PYTHONPATH"
    }
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_SUBMIT=str(spark_home() / "bin" / "spark-submit"),
        SPARK_LOCAL_IP=HOST,
        PYSPARK_DRIVER_PYTHON=driver_python,
        # The executors' Python: the base interpreter, without PySpark or our packages.
        PYSPARK_PYTHON=str(Path(driver_python).resolve()),
        SPARK_SUBMIT_EXTRA=" ".join(f"--conf {k}={v}" for k, v in conf.items()),
    )
    return subprocess.Popen(
        [str(REPO / "deploy/spark/run-on-cluster.sh"), cluster.url, *args],
        env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, text=True,
        start_new_session=True,
    )  # fmt: skip


@contextmanager
def running(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The submitted job, its whole process group SIGKILLed if it is still running at the end
    (a failed or timed-out test)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_for_output(proc: subprocess.Popen[str], log: Path, err: Path, text: str, timeout: float):
    """Until the job's stdout holds ``text`` (a report it prints after a micro-batch)."""
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            pytest.fail(
                f"the stream exited with {proc.returncode} before printing {text!r}:\n"
                + err.read_text(errors="replace")[-4000:]
            )
        if time.monotonic() > deadline:
            pytest.fail(
                f"no {text!r} within {timeout:.0f} s:\n" + err.read_text(errors="replace")[-4000:]
            )
        time.sleep(0.2)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def python_driver(proc: subprocess.Popen[str], driver_python: str) -> int:
    """The pid of the Python driver spark-submit's JVM started for run-on-cluster.sh."""
    for pid in descendants(proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].decode() == driver_python and any(a.endswith(b"submit_main.py") for a in argv):
            return pid
    raise AssertionError(f"no Python driver under pid {proc.pid}")
