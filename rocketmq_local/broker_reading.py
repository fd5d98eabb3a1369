"""What a real RocketMQ 5.5.0 broker reads from a request: the broker's own header and
body classes, run in a JVM (``broker-reading/BrokerReading.java``, compiled here against
the jars of ``make rocketmq``). The remoting port's guard is held against it
(tests/interop/test_remoting_bodies.py)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocketmq_local.launcher import LauncherError, java_binary, lib_dir

SOURCE = Path(__file__).resolve().parent / "broker-reading" / "BrokerReading.java"
TIMEOUT_S = 120.0

HEADERS = "org.apache.rocketmq.remoting.protocol.header."
BODIES = "org.apache.rocketmq.remoting.protocol."


@dataclass(frozen=True)
class Request:
    """One request to read: ``kind`` "header" (its fields into ``cls``), "send" (a send's
    header, V1 or V2 names by ``code``) or "body" (its body into ``cls``)."""

    kind: str
    code: int
    cls: str = ""
    fields: dict[str, str] | None = None
    body: bytes = b""

    def line(self) -> str:
        return json.dumps(
            {
                "kind": self.kind,
                "code": self.code,
                "class": self.cls,
                "fields": self.fields or {},
                "body": base64.b64encode(self.body).decode(),
            }
        )


def read_all(requests: list[Request]) -> list[dict[str, Any]]:
    """What the broker's classes read from each request, in one JVM: ``{"ok": True,
    "value": ...}`` or ``{"ok": False, "error": ...}``. Raises LauncherError when no JDK or
    no jars are there."""
    javac = shutil.which("javac")
    if javac is None:
        raise LauncherError("no `javac` on PATH: install a JDK 17")
    classpath = f"{lib_dir()}/*"
    with tempfile.TemporaryDirectory(prefix="broker-reading-") as out:
        subprocess.run(
            [javac, "-d", out, "-cp", classpath, str(SOURCE)],
            check=True, capture_output=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        done = subprocess.run(
            [java_binary(), "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
             f"{out}:{classpath}", "BrokerReading"],
            input="".join(r.line() + "\n" for r in requests),
            capture_output=True, text=True, timeout=TIMEOUT_S, check=True,
        )  # fmt: skip
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(answers) != len(requests):
        raise LauncherError(f"{len(answers)} answers to {len(requests)} requests: {done.stderr}")
    return answers
