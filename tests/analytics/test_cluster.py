"""The job on a real Spark standalone cluster: a master and two workers, each a JVM of its
own on loopback (the session's ``standalone_cluster``, tests/analytics/_cluster.py), the job
submitted with deploy/spark/run-on-cluster.sh as on any cluster, its tasks run by executor
JVMs the workers start.

The driver's Python has PySpark and the other third-party packages but not ours, so the
job's code comes from the zip the script ships; the executors get a plain Python (the
interpreter the virtualenvs are made from, without PySpark or ours), as a worker host has.

The batch job must write the very rows local mode writes. (The stream with a worker killed
under it is not here yet: docs/analytics.md, "Tests on a standalone cluster".)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest

from polling_report.job import JobOptions, run_batch
from tests.analytics._cluster import HOST, StandaloneCluster, spark_home
from tests.analytics.test_batch import DAY, EXPECTED_DAY1, crafted_log

# The session's cluster; the first test to use it also waits for it to start.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]
ROW_KEY = ("window_start", "proxy", "group", "topic", "mode")


@pytest.fixture(scope="module")
def driver_python(tmp_path_factory) -> str:
    """A virtualenv's python that sees this one's third-party packages (PySpark,
    prometheus-client, ...) through a .pth line, but not the editable installs of the
    proxy and polling_report: their finders are set up by .pth files of this virtualenv,
    which a path line does not run."""
    root = tmp_path_factory.mktemp("driver-venv")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    site = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    Path(site, "venv-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    found = subprocess.check_output(
        [python, "-c", "import importlib.util as u; print(*(m for m in "
         "('pyspark', 'prometheus_client', 'proxy', 'polling_report') if u.find_spec(m)))"],
        cwd=root, text=True,
    ).split()  # fmt: skip
    assert found == ["pyspark", "prometheus_client"], found
    return str(python)


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


def all_rows(spark, out: Path) -> list[dict]:
    """Every stored row, every column (the date partition too), in key order."""
    rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
    return sorted(rows, key=lambda r: tuple(r[k] for k in ROW_KEY))


def new_app_dirs(cluster: StandaloneCluster, before: dict[str, set[Path]]) -> dict[str, list[Path]]:
    """Per worker alive, the application directories made since ``before``: one per
    executor the worker started for an application."""
    return {
        w.name: sorted(set(w.work_dir.glob("app-*")) - before[w.name])
        for w in cluster.alive_workers()
        if w.work_dir is not None
    }


def app_dirs(cluster: StandaloneCluster) -> dict[str, set[Path]]:
    return {
        w.name: set(w.work_dir.glob("app-*"))
        for w in cluster.alive_workers()
        if w.work_dir is not None
    }


def test_the_batch_job_on_the_cluster_writes_the_rows_of_local_mode(
    spark, standalone_cluster, driver_python, tmp_path
):
    cluster = standalone_cluster
    events = tmp_path / "events"
    crafted_log(events)
    local_out, cluster_out = tmp_path / "local", tmp_path / "cluster"
    # Local mode, in this process's session (local[2]).
    run_batch(spark, JobOptions(events=str(events), out=str(local_out), dates=(DAY,)))

    before = app_dirs(cluster)
    out_log, err_log = tmp_path / "submit.out", tmp_path / "submit.err"
    with open(out_log, "w") as out, open(err_log, "w") as err:
        proc = submit(
            cluster, driver_python, [str(events), str(cluster_out), "--date", DAY], out, err
        )
    with running(proc):
        returncode = proc.wait(timeout=240)
    stdout = out_log.read_text()
    assert returncode == 0, err_log.read_text()[-4000:]
    assert stdout.startswith("rmq-polling-report: 8 records, 4 malformed lines"), stdout
    assert "dates written: 2024-05-01" in stdout

    # Its tasks ran in an executor on every worker: JVMs apart from the driver's.
    for worker, apps in new_app_dirs(cluster, before).items():
        assert len(apps) == 1, (worker, apps)
        logs = "".join(p.read_text(errors="replace") for p in apps[0].glob("*/stderr"))
        assert "Running task" in logs, (worker, logs[-2000:])

    local, on_cluster = all_rows(spark, local_out), all_rows(spark, cluster_out)
    assert len(local) == len(EXPECTED_DAY1)
    assert on_cluster == local
