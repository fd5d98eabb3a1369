"""The official Python client through the proxy: a committed, a rolled-back and an
orphaned-then-checked transaction, a timed message delivered at its time, a recalled one
never (``python_tx_client.py``), on broker stubs and on the session's real RocketMQ 5.5.0.

Bounds: the brokers check a half message older than 3 s every second (the stub's default,
the real test brokers' ``transactionTimeOut`` / ``transactionCheckInterval``), so the orphan
is checked and committed within seconds. The timed message (4 s ahead) must arrive no earlier
than its time less RocketMQ's 1 s timer precision, and at most 4 s after it: the timer slot,
then a SimpleConsumer long poll answered at once by notify mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from tests.interop._harness import INTEROP_DIR, INTEROP_PYTHON
from tests.interop.conftest import targets

DRIVER = INTEROP_DIR / "python_tx_client.py"
EARLY_MS = 1000
LATE_MS = 4000


@pytest.mark.parametrize("target", targets(("notify",)), indirect=True)
def test_python_client_transactions_timed_and_recalled(target, tmp_path):
    topic = target.new_topic("tx")
    group = f"tx-g-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(INTEROP_PYTHON), str(DRIVER), "features", "--endpoint", target.proxy.grpc,
         "--topic", topic, "--group", group, "--delay-seconds", "4",
         "--deadline-seconds", "40"],
        capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stderr[-3000:]}\n{target.proxy.logs()}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    got = {r["id"]: r["at_ms"] for r in out["received"]}
    assert out["committed"] in got
    assert out["orphan"] in got, f"orphan never committed; checker saw {out['checked']}"
    assert out["orphan"] in out["checked"]  # it came through a check, not by itself
    assert out["rolled_back"] not in got
    assert out["recalled"] not in got
    assert out["recall_answer"] == out["recalled"]
    assert out["timed"] in got
    assert out["deliver_ms"] - EARLY_MS <= got[out["timed"]] <= out["deliver_ms"] + LATE_MS
    # Transactions are at least once: a real broker may check a transaction again before
    # the answer to its last check is in, and deliver a check-committed message twice.
    assert set(got) == {out["committed"], out["orphan"], out["timed"]}, out["received"]
