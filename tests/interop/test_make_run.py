"""``make run`` as the README gives it, then the official Java client and the official
Python client, each in its default configuration (Java: TLS on; Python: TLS off), sending,
receiving and acking through its one gRPC port at the same time."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.official import scenarios as scenario
from testkit.official.harness import REPO, ProxyProcess
from tests.support.ports import free_port

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

READY = re.compile(r"^rmq-proxy ready grpc=(\S+) http=(\S+) namesrv=(\S+)\s*$")
START_S = 120.0  # make checks its stamps first; the proxy then starts in seconds
STOP_S = 30.0


@pytest.fixture
def make_run(tmp_path):
    """``make run`` on free ports, in a process group of its own; Ctrl-C (SIGINT to the
    group) stops it, as a user would."""
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "make-run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["make", "run", f"RUN_ARGS=--grpc-port {grpc_port} --http-port {http_port}"],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=out,
            start_new_session=True,
        )
    assert proc.stdout is not None
    found: list[re.Match] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            match = READY.match(raw.decode(errors="replace").strip())
            if match and not found:
                found.append(match)
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, name="make-run-stdout", daemon=True)
    reader.start()
    try:
        ready.wait(START_S)
        assert found, f"make run printed no ready line\n{log.read_text()[-4000:]}"
        grpc, http, namesrv = found[0].groups()
        assert grpc == f"127.0.0.1:{grpc_port}"
        yield ProxyProcess(grpc, http, namesrv, proc.pid, log, log, proc, reader)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_S)
            raise AssertionError(
                f"make run did not stop on Ctrl-C\n{log.read_text()[-4000:]}"
            ) from None
        reader.join(STOP_S)
    # make reports the interrupted recipe; the proxy itself stopped cleanly.
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
    assert code in (0, 2, -signal.SIGINT), code


def test_java_and_python_defaults_through_make_run_at_once(make_run, run_client):
    def one(lang: str) -> None:
        tag = scenario.unique(f"make-run-{lang}")
        ids, prefix = scenario.produce(run_client, lang, make_run, "TestTopic", 5, "--tag", tag)
        group = scenario.unique(f"make-run-{lang}")
        out = scenario.consume(
            run_client, lang, make_run, "TestTopic", group, "--filter", tag, "--expect", 5, "--ack"
        )
        scenario.assert_delivered_once(out, ids, prefix, "TestTopic", tag=tag)

    with ThreadPoolExecutor(2, thread_name_prefix="make-run") as pool:
        futures = {lang: pool.submit(one, lang) for lang in ("java", "python")}
    failures = [f"{lang}: {f.exception()}" for lang, f in futures.items() if f.exception()]
    assert not failures, "\n\n".join(failures)
