"""The clients of the remoting port as processes, each run by a driver that speaks the same
JSON lines: ``JAVA``, the official Java client's remoting API (rocketmq-client 5.5.0:
DefaultMQProducer, TransactionMQProducer, DefaultMQPushConsumer, DefaultLitePullConsumer;
``rocketmq_local/java-remoting-client``, built by ``make rocketmq``), and ``CPP``, the
native C++ client (librocketmq through PyPI ``rocketmq`` 0.4.4; ``testkit/official/cpp``,
its interpreter .venv-cpp made by ``make interop-deps``), and ``GO``, the Go client
(rocketmq-client-go v2; ``rocketmq_local/go-remoting-client``, built by ``make rocketmq``).

A consumer runs in the background (``start``) and says when it has started; ``result``
waits for its one JSON line. A producer runs to its end (``run``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rocketmq_local.launcher import java_binary
from testkit.official.harness import JAVA_CLIENT_OPTS, LOG_TAIL, REPO, tail

JAVA_DIR = REPO / ".cache" / "rocketmq" / "java-remoting-client"
JAVA_JAR = JAVA_DIR / "interop-java-remoting-client.jar"
JAVA_MAIN = "interop.RemotingClient"
CPP_PYTHON = REPO / ".venv-cpp" / "bin" / "python"
CPP_DRIVER = Path(__file__).parent / "cpp" / "driver.py"
GO_BINARY = REPO / ".cache" / "rocketmq" / "go-remoting-client" / "driver"
READY_TIMEOUT_S = 30.0


def _java_command(home: Path) -> list[str]:
    if not JAVA_JAR.exists() or not any((JAVA_DIR / "lib").glob("*.jar")):
        raise AssertionError(f"{JAVA_JAR} is missing: run `make rocketmq`")
    classpath = f"{JAVA_JAR}{os.pathsep}{JAVA_DIR / 'lib'}/*"
    # user.home holds the client's log and a broadcasting consumer's offsets.
    return [java_binary(), *JAVA_CLIENT_OPTS, f"-Duser.home={home}", "-cp", classpath, JAVA_MAIN]


def _java_log(home: Path) -> str:
    return tail(home / "logs" / "rocketmqlogs" / "rocketmq_client.log")


def _cpp_command(home: Path) -> list[str]:
    if not CPP_PYTHON.exists():
        raise AssertionError(f"{CPP_PYTHON} is missing: run `make interop-deps`")
    return [str(CPP_PYTHON), str(CPP_DRIVER)]


def _cpp_log(home: Path) -> str:
    # librocketmq writes $HOME/logs/rocketmq-cpp/<pid>_rocketmq-cpp.log.0 (HOME is ``home``).
    logs = sorted((home / "logs" / "rocketmq-cpp").glob("*.log.*"))
    return "\n".join(tail(log) for log in logs) or "(no client log)"


@dataclass
class RemotingClient:
    """One driver process; ``lines`` are its JSON lines so far."""

    args: list[str]
    home: Path
    proc: subprocess.Popen[str] = field(repr=False)
    client_log: Callable[[Path], str] = field(repr=False)
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
        return f"--- stderr ---\n{err}\n--- client log ---\n{self.client_log(self.home)}"


@dataclass(frozen=True)
class Driver:
    """How to run one client's driver: its command line and its log, by home directory."""

    command: Callable[[Path], list[str]]
    log: Callable[[Path], str]

    def start(self, home: Path, *args: str | int) -> RemotingClient:
        """Start the driver with ``args``; returns once it has started its client. Its
        home directory is ``home`` (the client's logs and local offsets)."""
        home.mkdir(parents=True, exist_ok=True)
        argv = [str(a) for a in args]
        with open(home / "stderr.log", "a") as err:
            proc = subprocess.Popen(
                self.command(home) + argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=home,
                env={**os.environ, "HOME": str(home)},
            )
        client = RemotingClient(argv, home, proc, self.log)
        threading.Thread(target=client._read, name="remoting-client", daemon=True).start()
        client.wait_ready()
        return client

    def run(self, home: Path, *args: str | int, timeout_s: float = 60.0) -> dict:
        """Run the driver to its end; its result."""
        return self.start(home, *args).result(timeout_s)


def _go_command(home: Path) -> list[str]:
    if not GO_BINARY.exists():
        raise AssertionError(f"{GO_BINARY} is missing: run `make rocketmq`")
    return [str(GO_BINARY)]


def _go_log(home: Path) -> str:
    return tail(home / "logs" / "rocketmq-go.log")


JAVA = Driver(_java_command, _java_log)
CPP = Driver(_cpp_command, _cpp_log)
GO = Driver(_go_command, _go_log)
