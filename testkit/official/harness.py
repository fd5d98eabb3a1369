"""Processes for the interop tests: the proxy under test, and the official clients' drivers.

Everything here is a separate process on 127.0.0.1 with a free port, started and stopped by
pid with bounded waits. The official clients run in their own runtimes (``.venv-interop`` for
Python, ``testkit/official/node`` for Node.js, both from ``make interop-deps``; a JVM with
``.cache/rocketmq/java-client`` for Java, from ``make rocketmq``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rocketmq_local.launcher import java_binary

INTEROP_DIR = Path(__file__).resolve().parent
REPO = INTEROP_DIR.parents[1]
INTEROP_PYTHON = REPO / ".venv-interop" / "bin" / "python"
PYTHON_DRIVER = INTEROP_DIR / "python_client.py"
NODE_DIR = INTEROP_DIR / "node"
NODE_DRIVER = NODE_DIR / "client.mjs"
NODE_CLIENT_PACKAGE = NODE_DIR / "node_modules" / "rocketmq-client-nodejs"
#: Built by ``make rocketmq`` from rocketmq_local/java-client (its own pom), apart from the
#: server jars in .cache/rocketmq/lib: the two classpaths never mix.
JAVA_CLIENT_DIR = REPO / ".cache" / "rocketmq" / "java-client"
JAVA_CLIENT_JAR = JAVA_CLIENT_DIR / "interop-java-client.jar"
JAVA_CLIENT_MAIN = "interop.JavaClient"
# A short-lived client JVM: C1 only and the serial collector start fastest on 2 cores.
JAVA_CLIENT_OPTS = ("-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
LANGS = ("python", "node", "java")

# The one line `rmq-proxy` prints on stdout once it serves.
READY_LINE = re.compile(
    r"^rmq-proxy ready grpc=(\S+) (?:remoting=(\S+) )?http=(\S+) namesrv=(\S+)\s*$"
)
READY_TIMEOUT = 30.0
RENEW_SLICE_MS = 10_000
STOP_TIMEOUT = 10.0
KILL_WAIT = 5.0
LOG_TAIL = 4000


def tail(path: Path, limit: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:]


def proxy_command() -> tuple[list[str], dict[str, str]]:
    """The command (and environment) that runs the proxy under test.

    RMQ_INTEROP_PROXY=/path/to/rmq-proxy tests another build. Otherwise ``python -m proxy.cli``
    with THIS checkout first on PYTHONPATH: the venv's ``rmq-proxy`` console script may be an
    editable install of another checkout (a git worktree shares the venv of main), and the
    tests must exercise the code they sit beside.
    """
    env = dict(os.environ)
    override = os.environ.get("RMQ_INTEROP_PROXY")
    if override:
        return [override], env
    if not (REPO / "proxy" / "cli.py").exists():
        raise AssertionError(f"no proxy/cli.py under {REPO}")
    paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return [sys.executable, "-m", "proxy.cli"], env


@dataclass
class ProxyProcess:
    """A running ``rmq-proxy`` (embedded broker stubs, or ``--namesrv`` of a real cluster);
    ``stop()`` ends it by pid."""

    grpc: str
    http: str
    namesrv: str
    pid: int
    stdout_log: Path
    stderr_log: Path
    proc: subprocess.Popen = field(repr=False)
    _reader: threading.Thread = field(repr=False)
    remoting: str | None = None  # the remoting port's host:port, when it is on

    def logs(self) -> str:
        return (
            f"--- rmq-proxy stdout (tail) ---\n{tail(self.stdout_log)}\n"
            f"--- rmq-proxy stderr (tail) ---\n{tail(self.stderr_log)}"
        )

    def stop(self, timeout_s: float = STOP_TIMEOUT) -> str | None:
        """SIGTERM, wait ``timeout_s`` (a drain that waits for connections to age needs
        longer), SIGKILL if need be. Returns a complaint, or None for a clean stop."""
        complaint = None
        if self.proc.poll() is not None:
            complaint = f"rmq-proxy exited on its own with code {self.proc.returncode}"
        else:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(KILL_WAIT)
                complaint = f"rmq-proxy did not stop within {timeout_s:.0f}s of SIGTERM"
        self._reader.join(KILL_WAIT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return complaint


def start_proxy(
    workdir: Path,
    topics: tuple[str, ...],
    mode: str | None = None,
    brokers: int = 3,
    namesrv: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> ProxyProcess:
    """Start ``rmq-proxy`` on free ports and wait (bounded) for its ready line: with
    ``brokers`` embedded broker stubs, or in front of the name server ``namesrv``."""
    workdir.mkdir(parents=True, exist_ok=True)
    stdout_log = workdir / "rmq-proxy.stdout.log"
    stderr_log = workdir / "rmq-proxy.stderr.log"
    cmd, env = proxy_command()
    # Push consumers' messages are popped for 10 s slices and renewed (60 s by default),
    # so a test sees a listener outlast a slice within seconds.
    env.setdefault("RMQ_PROXY_RECEIVE_RENEW_SLICE_MS", str(RENEW_SLICE_MS))
    backend = ["--namesrv", namesrv] if namesrv else ["--embedded-brokers", str(brokers)]
    cmd += [*backend, "--grpc-port", "0", "--http-port", "0"]
    for topic in topics:
        cmd += ["--topic", topic]
    if mode:
        cmd += ["--mode", mode]
    cmd += list(extra_args)
    with open(stderr_log, "wb") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, cwd=workdir, env=env
        )
    stdout = proc.stdout
    assert stdout is not None  # PIPE
    ready = threading.Event()
    found: list[re.Match] = []

    def read_stdout() -> None:
        # Keeps draining after the ready line, so the proxy never blocks on a full pipe.
        with open(stdout_log, "w") as out:
            for raw in stdout:
                line = raw.decode(errors="replace")
                out.write(line)
                out.flush()
                match = READY_LINE.match(line.strip())
                if match and not found:
                    found.append(match)
                    ready.set()
        ready.set()  # EOF: the proxy closed stdout or died

    reader = threading.Thread(target=read_stdout, name="rmq-proxy-stdout", daemon=True)
    reader.start()
    ready.wait(READY_TIMEOUT)
    if not found:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(KILL_WAIT)
        reader.join(KILL_WAIT)
        stdout.close()
        raise AssertionError(
            f"rmq-proxy printed no ready line within {READY_TIMEOUT:.0f}s "
            f"(exit code {proc.returncode}); command: {' '.join(cmd)}\n"
            f"--- stdout ---\n{tail(stdout_log)}\n--- stderr ---\n{tail(stderr_log)}"
        )
    grpc, remoting, http, namesrv = found[0].groups()
    return ProxyProcess(
        grpc, http, namesrv, proc.pid, stdout_log, stderr_log, proc, reader, remoting=remoting
    )


def driver_command(lang: str, home: Path) -> list[str]:
    if lang == "python":
        if not INTEROP_PYTHON.exists():
            raise AssertionError(f"{INTEROP_PYTHON} is missing: run `make interop-deps`")
        return [str(INTEROP_PYTHON), str(PYTHON_DRIVER)]
    if lang == "node":
        node = shutil.which("node")
        if node is None:
            raise AssertionError("node is not on PATH (Node.js 20 is needed for the interop tests)")
        if not NODE_CLIENT_PACKAGE.exists():
            raise AssertionError(f"{NODE_CLIENT_PACKAGE} is missing: run `make interop-deps`")
        return [node, str(NODE_DRIVER)]
    if lang == "java":
        if not JAVA_CLIENT_JAR.exists() or not any((JAVA_CLIENT_DIR / "lib").glob("*.jar")):
            raise AssertionError(f"{JAVA_CLIENT_JAR} is missing: run `make rocketmq`")
        classpath = f"{JAVA_CLIENT_JAR}{os.pathsep}{JAVA_CLIENT_DIR / 'lib'}/*"
        # user.home comes from the password database, not $HOME: the client logs under it.
        opts = [*JAVA_CLIENT_OPTS, f"-Duser.home={home}"]
        return [java_binary(), *opts, "-cp", classpath, JAVA_CLIENT_MAIN]
    raise ValueError(f"unknown client language {lang!r}")


def client_log(lang: str, home: Path) -> str:
    """The client's own log: the Python and Java clients write a file under HOME, the Node
    driver sends its client's log to stderr."""
    path = {
        "python": home / "logs" / "rocketmq_python" / "rocketmq_client.log",
        "java": home / "logs" / "rocketmq" / "rocketmq-client.log",
    }.get(lang)
    log = tail(path) if path else ""
    return f"--- {lang} client log (tail) ---\n{log}" if log else ""


def run_driver(
    lang: str, args: list[str], *, timeout: float, home: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run a driver to completion; on timeout ``subprocess.run`` kills it (by pid) and waits.
    ``env`` adds variables (credentials, TLS) to the driver's environment."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **(env or {}), HOME=str(home))
    # The official client must not see the project's own apache.rocketmq.v2 modules.
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONHOME", None)
    cmd = driver_command(lang, home) + args
    try:
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=home,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise AssertionError(
            f"{lang} client did not finish within {timeout:.0f}s: {' '.join(args)}\n"
            f"--- stdout ---\n{(out or '')[-LOG_TAIL:]}\n--- stderr ---\n"
            f"{(err or '')[-LOG_TAIL:]}\n{client_log(lang, home)}"
        ) from None


def run_client(
    lang: str, *args: str | int, timeout: float, home: Path, env: dict[str, str] | None = None
) -> dict:
    """Run ``produce`` / ``consume`` with the official ``lang`` client; return its JSON.

    The driver is given a deadline a little shorter than ``timeout`` so that it gives up
    with its own diagnostics before it would be killed.
    """
    argv = [str(a) for a in args]
    if "--deadline-seconds" not in argv:
        argv += ["--deadline-seconds", str(max(timeout - 5.0, 1.0))]
    started = time.monotonic()
    done = run_driver(lang, argv, timeout=timeout, home=home, env=env)
    elapsed = time.monotonic() - started
    rounds = re.search(r'"receives":\s*(\d+),\s*"empty_receives":\s*(\d+)', done.stdout)
    detail = f", {rounds[1]} receives, {rounds[2]} empty" if rounds else ""
    # Shown by pytest -rA and on failure: which run took how long.
    print(f"{lang} {argv[0]} {elapsed:.1f}s (exit {done.returncode}{detail})")
    if done.returncode != 0:
        raise AssertionError(
            f"{lang} client failed (exit {done.returncode}, {elapsed:.1f}s): {' '.join(argv)}\n"
            f"--- stderr (tail) ---\n{done.stderr[-LOG_TAIL:]}\n{client_log(lang, home)}"
        )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"{lang} client printed nothing: {' '.join(argv)}\n{done.stderr}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{lang} client printed no JSON ({exc}): {done.stdout!r}") from None


def sleep_until(deadline: float) -> None:
    """Wait for a point on the monotonic clock (a bounded, computed wait)."""
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)  # time itself: the scenarios wait out an invisible time
