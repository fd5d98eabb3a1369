"""Child processes of the local stack: start with a log file, wait until ready, stop in order.

Plain blocking code on purpose: this is a foreground developer tool with nothing else to do
while it waits, and every wait is a bounded poll loop with a deadline.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class StackError(RuntimeError):
    """A component failed to start or died; the message says which and why."""


@dataclass
class Child:
    """One process of the stack, its output going to ``log``."""

    name: str
    argv: list[str]
    log: Path
    # How long it may take to stop after SIGTERM before it is killed.
    stop_timeout_s: float = 10.0
    proc: subprocess.Popen | None = field(default=None, repr=False)
    # Exit codes that mean "stopped by itself on SIGTERM": a JVM exits 143 (128 + 15).
    clean_codes: tuple[int, ...] = (0, -signal.SIGTERM)

    @classmethod
    def adopt(
        cls, name: str, proc: subprocess.Popen, log: Path, stop_timeout_s: float = 10.0
    ) -> Child:
        """A child some other code started (the RocketMQ launcher's JVMs, each in a session
        of its own), supervised and stopped like ours. A JVM's SIGTERM exit code, 143,
        counts as a clean stop."""
        args = [proc.args] if isinstance(proc.args, str | bytes | os.PathLike) else proc.args
        return cls(name, [os.fsdecode(a) for a in args], log, stop_timeout_s, proc,
                   clean_codes=(0, -signal.SIGTERM, 128 + signal.SIGTERM))  # fmt: skip

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, env: dict[str, str] | None = None) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as out:
            # A session of its own: a Ctrl-C in the terminal reaches only the supervisor,
            # which then stops the children in order (proxies drain before brokers go).
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def wait_for_log(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """Wait until a line of the log matches ``pattern``; return the match."""
        regex = re.compile(pattern, re.MULTILINE)
        return self._wait(lambda: regex.search(self.log_text()), timeout_s, f"/{pattern}/")

    def wait_for_http(self, url: str, timeout_s: float) -> None:
        """Wait until ``url`` answers 200."""

        def ok() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    return response.status == 200
            except (urllib.error.URLError, OSError):
                return False

        self._wait(ok, timeout_s, url)

    def _wait(self, check: Callable[[], object], timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while True:
            found = check()
            if found:
                return found
            code = self.exited()
            if code is not None:
                raise StackError(
                    f"{self.name} exited with code {code} before it was ready; "
                    f"last lines of {self.log}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} not ready within {timeout_s:.0f}s ({what})")
            time.sleep(0.05)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> int:
        """Wait for the exit after ``terminate``; kill it past ``stop_timeout_s``."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)


def stop_in_order(waves: list[list[Child]], say: Callable[[str], None]) -> bool:
    """SIGTERM each wave of children together, wait for it, then the next wave.

    Returns True when every child exited on SIGTERM by itself (one of its clean codes)."""
    clean = True
    for wave in waves:
        started = [c for c in wave if c.proc is not None]
        # Whether a child had died by itself is known only before it is sent SIGTERM.
        already = {id(c): c.proc.poll() for c in started if c.proc is not None}
        since = time.monotonic()
        for child in started:
            child.terminate()
        for child in started:
            code = child.wait_stopped()
            took = time.monotonic() - since
            if already[id(child)] is not None and already[id(child)] != 0:
                say(f"  {child.name:<12} had already exited with code {already[id(child)]}")
                clean = False
            elif code not in child.clean_codes:
                say(f"  {child.name:<12} stopped with code {code} (log: {child.log})")
                clean = False
            else:
                say(f"  {child.name:<12} stopped ({took:.1f} s)")
    return clean
