"""One local SparkSession for every analytics test (a JVM start costs seconds).

local[2] (the CI machine's cores), the driver on loopback, no UI, few shuffle partitions,
quiet logs. The job's own session settings (UTC, dynamic partition overwrite) are applied
by ``session.get_session`` when a test runs the job through it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import time
import urllib.request
import venv
from pathlib import Path

import pytest

from tests.support.ports import free_port


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    # Spark would pick the first non-loopback interface for its own services otherwise.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from polling_report.session import REQUIRED_SQL_CONF

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("rmq-polling-report-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        # Micro-batches of a test stream should not wait for the next poll of the source.
        .config("spark.sql.streaming.pollingDelay", "10ms")
    )
    for key, value in REQUIRED_SQL_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory):
    """A Spark standalone cluster of three JVMs on loopback (testkit/spark_cluster.py): a
    master and two workers of 1 core and 1 GB each, started once for the session, all
    registered; stopped by pid at the end. A cluster that does not come up within 90 s
    fails the tests that asked for it, with the daemons' logs."""
    from testkit.spark_cluster import standalone_cluster as start_cluster

    with start_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as cluster:
        yield cluster


@pytest.fixture(scope="session")
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


@pytest.fixture
def pushgateway(tmp_path):
    """A real Pushgateway (Debian's prometheus-pushgateway) on a free loopback port; its
    URL. Stopped by pid at the end, also when the test fails."""
    binary = shutil.which("prometheus-pushgateway")
    if binary is None:
        pytest.fail("prometheus-pushgateway is not installed (scripts/system-deps.sh)")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--web.listen-address=127.0.0.1:{port}",
            f"--persistence.file={tmp_path / 'pushgateway.data'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pushgateway exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("pushgateway not ready within 15 s")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def pushed(url: str, job: str = "rmq_polling_report") -> dict[tuple[str, frozenset], float]:
    """The job's samples on the Pushgateway: (name, labels without job/instance) -> value."""
    from testkit.metrics_text import every_sample

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = {}
    for name, labels, value in every_sample(text):
        if not name.startswith("rocketmq_polling_report_") or labels.get("job") != job:
            continue
        kept = {k: v for k, v in labels.items() if k not in ("job", "instance")}
        found[(name, frozenset(kept.items()))] = value
    return found
