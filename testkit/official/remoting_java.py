"""The official Java client's remoting API (rocketmq-client 5.5.0: DefaultMQProducer,
TransactionMQProducer, DefaultMQPushConsumer, DefaultLitePullConsumer) as a process: the
driver ``rocketmq_local/java-remoting-client``, built by ``make rocketmq``.

A consumer runs in the background (``start``) and says when it has started; ``result``
waits for its one JSON line. A producer runs to its end (``run``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from rocketmq_local.launcher import java_binary
from testkit.official.harness import JAVA_CLIENT_OPTS, LOG_TAIL, REPO, tail

DRIVER_DIR = REPO / ".cache" / "rocketmq" / "java-remoting-client"
DRIVER_JAR = DRIVER_DIR / "interop-java-remoting-client.jar"
MAIN = "interop.RemotingClient"
READY_TIMEOUT_S = 30.0


def command(home: Path) -> list[str]:
    if not DRIVER_JAR.exists() or not any((DRIVER_DIR / "lib").glob("*.jar")):
        raise AssertionError(f"{DRIVER_JAR} is missing: run `make rocketmq`")
    classpath = f"{DRIVER_JAR}{os.pathsep}{DRIVER_DIR / 'lib'}/*"
    # user.home holds the client's log and a broadcasting consumer's offsets.
    return [java_binary(), *JAVA_CLIENT_OPTS, f"-Duser.home={home}", "-cp", classpath, MAIN]


def client_log(home: Path) -> str:
    return tail(home / "logs" / "rocketmqlogs" / "rocketmq_client.log")


@dataclass
class RemotingClient:
    """One driver process; ``lines`` are its JSON lines so far."""

    args: list[str]
    home: Path
    proc: subprocess.Popen[str] = field(repr=False)
    lines: list[dict] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)

    def _read(self) -> None:
        assert self.proc.stdout is not None  # PIPE
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))
                self._ready.set()
        self._ready.set()
        self._done.set()

    def wait_ready(self) -> None:
        if not self._ready.wait(READY_TIMEOUT_S) or not self.lines:
            self.kill()
            raise AssertionError(f"{self.describe()} did not start\n{self.diagnostics()}")

    def result(self, timeout_s: float) -> dict:
        """The driver's result line; it is killed (and the test fails) past ``timeout_s``."""
        if not self._done.wait(timeout_s):
            self.kill()
            raise AssertionError(f"{self.describe()} did not end in {timeout_s:.0f}s")
        code = self.proc.wait(5)
        if code != 0 or len(self.lines) < 2:
            raise AssertionError(f"{self.describe()} exited {code}\n{self.diagnostics()}")
        return self.lines[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)

    def describe(self) -> str:
        return f"remoting client {' '.join(self.args)}"

    def diagnostics(self) -> str:
        err = tail(self.home / "stderr.log", LOG_TAIL)
        return f"--- stderr ---\n{err}\n--- client log ---\n{client_log(self.home)}"


def start(home: Path, *args: str | int) -> RemotingClient:
    """Start the driver with ``args``; returns once it has started its client."""
    home.mkdir(parents=True, exist_ok=True)
    argv = [str(a) for a in args]
    with open(home / "stderr.log", "a") as err:
        proc = subprocess.Popen(
            command(home) + argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=home,
        )
    client = RemotingClient(argv, home, proc)
    threading.Thread(target=client._read, name="remoting-client", daemon=True).start()
    client.wait_ready()
    return client


def run(home: Path, *args: str | int, timeout_s: float = 60.0) -> dict:
    """Run the driver to its end; its result."""
    return start(home, *args).result(timeout_s)
