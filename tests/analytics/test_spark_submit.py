"""deploy/spark/run-on-cluster.sh runs the job through spark-submit unchanged, here with a
local master (one JVM). test_cluster.py submits it to a standalone cluster of separate JVMs
on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analytics.test_batch import crafted_log

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_spark_submit_runs_the_job_unchanged(spark, tmp_path):
    crafted_log(tmp_path / "events")
    bin_dir = Path(sys.executable).parent  # the virtualenv's spark-submit
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_SUBMIT_EXTRA": "--conf spark.ui.enabled=false",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    out = tmp_path / "out"
    command = [
        str(REPO / "deploy/spark/run-on-cluster.sh"),
        "local[1]",
        str(tmp_path / "events"),
        str(out),
        "--date",
        "2024-05-01",
    ]
    # Its own process group: spark-submit starts a JVM, which starts the Python driver.
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.startswith("rmq-polling-report: 8 records, 4 malformed lines")
    assert "dates written: 2024-05-01" in stdout
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 9  # test_batch.EXPECTED_DAY1
    assert sum(r["requests"] for r in rows if r["proxy"] != "_fleet") == 8
