"""The job on a real Spark standalone cluster: a master and two workers, each a JVM of its
own on loopback (the session's ``standalone_cluster``, testkit/spark_cluster.py), the job
submitted with deploy/spark/run-on-cluster.sh as on any cluster, its tasks run by executor
JVMs the workers start.

The driver's Python has PySpark and the other third-party packages but not ours, so the
job's code comes from the zip the script ships; the executors get a plain Python (the
interpreter the virtualenvs are made from, without PySpark or ours), as a worker host has.

The batch job must write the very rows local mode writes; the stream must go on when a
worker dies under it (SIGKILL), its windows neither lost nor doubled.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from polling_report.job import JobOptions, run_batch
from testkit.spark_cluster import (
    StandaloneCluster,
    python_driver,
    running,
    submit,
    wait_for_output,
)
from tests.analytics._events import event, write_log
from tests.analytics.test_batch import DAY, EXPECTED_DAY1, crafted_log, stored_rows
from tests.analytics.test_stream import by_key

# Both tests share the session's cluster; the first to run also waits for it to start.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

ROW_KEY = ("window_start", "proxy", "group", "topic", "mode")


def all_rows(spark, out: Path) -> list[dict]:
    """Every stored row, every column (the date partition too), in key order; the wait
    sketch as its count (its bytes depend on the order the waits came in)."""
    from pyspark.sql import functions as F

    stored = spark.read.parquet(str(out))
    stored = stored.withColumn("sketch_n", F.kll_sketch_get_n_bigint("wait_sketch"))
    rows = [r.asDict() for r in stored.drop("wait_sketch").collect()]
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


def publish(staging: Path, events: Path, name: str, records: list[dict]) -> None:
    """A new part file in the log, renamed into place whole (as the proxy's writer does):
    the running stream never lists a file half-written."""
    written = write_log(staging, name, records)
    target = events / written.relative_to(staging)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(written, target)


def reported(records: int) -> str:
    """The first line of the report after the stream has read ``records`` good records."""
    return f"rmq-polling-report: {records} records, 4 malformed lines"


def test_the_stream_on_the_cluster_goes_on_when_a_worker_dies(
    spark, standalone_cluster, driver_python, tmp_path
):
    cluster = standalone_cluster
    assert len(cluster.alive_workers()) == 2, "the stream needs both workers to lose one"
    events, staging = tmp_path / "events", tmp_path / "staging"
    crafted_log(events, next_day=False)  # the first day: 8 records, 4 malformed lines
    # After the kill: one more record for each of the first day's nine windows (per proxy and
    # fleet), whose state the stream holds, part of it in the killed executor's stores.
    again = dict(group="g1", topic="t1", mode="notify")
    day1_p1 = [
        event(f"{DAY}T10:00:45", proxy="p1", **again, wait_ms=30),
        event(f"{DAY}T10:00:46", proxy="p1", **{**again, "mode": "coupled"}, wait_ms=31),
        event(f"{DAY}T10:01:30", proxy="p1", **again, wait_ms=32),
    ]
    day1_p2 = [
        event(f"{DAY}T10:00:55", proxy="p2", **again, wait_ms=33),
        event(f"{DAY}T10:01:40", proxy="p2", group="g2", topic="t2", mode="slicing", wait_ms=34),
    ]
    day2 = [event("2024-05-02T00:00:30", proxy="p1", wait_ms=8)]  # moves the watermark on
    late = [event(f"{DAY}T10:00:30", proxy="p3", wait_ms=1)]  # then far behind it: dropped
    day2_later = [event("2024-05-02T00:00:40", proxy="p1", wait_ms=9)]  # within it

    # What the stream must end up with: the batch job over every record but the late one.
    expected_events = tmp_path / "expected-events"
    crafted_log(expected_events, next_day=False)
    for name, records in [("part-3", day1_p1), ("part-3", day1_p2), ("part-2", day2),
                          ("part-5", day2_later)]:  # fmt: skip
        write_log(expected_events, name, records)
    run_batch(spark, JobOptions(events=str(expected_events), out=str(tmp_path / "expected")))
    expected = stored_rows(spark, str(tmp_path / "expected"))

    out = tmp_path / "out"
    args = [str(events), str(out), "--stream", "--checkpoint", str(tmp_path / "checkpoint"),
            "--trigger", "1s"]  # fmt: skip
    out_log, err_log = tmp_path / "stream.out", tmp_path / "stream.err"
    with open(out_log, "w") as o, open(err_log, "w") as e:
        proc = submit(cluster, driver_python, args, o, e)
    with running(proc):
        wait_for_output(proc, out_log, err_log, reported(8), 240)
        # The stream's executors: one on each worker, each holding window state.
        apps = [a for a in cluster.active_apps() if a.get("name") == "rmq-polling-report"]
        assert len(apps) == 1, apps
        holding = []
        for worker in cluster.alive_workers():
            assert worker.work_dir is not None
            logs = "".join(
                p.read_text(errors="replace")
                for p in (worker.work_dir / apps[0]["id"]).glob("*/stderr")
            )
            assert "Running task" in logs, worker.name
            if "StateStoreProvider" in logs:
                holding.append(worker)
        assert holding, "no executor loaded a state store"

        # After the first micro-batch has been written and reported, a worker whose
        # executor holds window state dies, and with it that executor. The other one loads
        # that state from the checkpoint; every window in it gets a record more below.
        cluster.kill_worker(holding[0])
        publish(staging, events, "part-3", day1_p1)
        publish(staging, events, "part-3", day1_p2)
        wait_for_output(proc, out_log, err_log, reported(13), 150)
        publish(staging, events, "part-2", day2)
        wait_for_output(proc, out_log, err_log, reported(14), 150)
        publish(staging, events, "part-4", late)
        publish(staging, events, "part-5", day2_later)
        wait_for_output(proc, out_log, err_log, reported(16), 150)

        os.kill(python_driver(proc, driver_python), signal.SIGTERM)  # ends after its batch
        returncode = proc.wait(timeout=120)
    assert returncode == 0, err_log.read_text()[-4000:]
    last = out_log.read_text().rsplit("rmq-polling-report: ", 1)[1]
    assert last.startswith("16 records, 4 malformed lines")  # every line counted once
    assert "dates written: 2024-05-01, 2024-05-02" in last

    rows = stored_rows(spark, str(out))
    keys = [tuple(r[k] for k in ROW_KEY) for r in rows]
    assert len(keys) == len(set(keys)), "a window was written twice"
    assert by_key(rows) == by_key(expected)  # none lost, the late record dropped
    assert len(rows) == len(EXPECTED_DAY1) + 2
