"""The SparkSession: ``local[*]`` with laptop settings by default, anything via ``--master``
or ``spark-submit`` (whose configuration then wins)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql import SparkSession

# Settings every run needs, wherever it runs: UTC so that windows and date partitions are
# the same on every machine; dynamic overwrite so that writing a day replaces only that day.
#
# The quantiles (percentile_approx) are kept in object buffers; past 128 groups in a task
# Spark would switch to sorting every input row by group. A task's groups hold its rows'
# wait times either way, so memory is bounded by the rows per task, not the group count;
# hash aggregation throughout measured 1.3x faster on the benchmark's 40,000 groups.
REQUIRED_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "1000000",
}

# Local runs only (a cluster's own spark-defaults decide there): the aggregates are small,
# so a few shuffle partitions beat the default 200 empty tasks; no progress bars between
# the report's lines; the driver on loopback.
#
# In local mode the driver JVM does all the work, and a batch job wants throughput, not
# short pauses: the parallel collector with half the heap as young generation (the job
# allocates fast and most of it dies young) made the benchmark's warm runs 18.1-19.9 s
# instead of G1's 20.5-21.0 s (10 million records, local[2]). Builder settings reach
# spark-submit before the JVM starts, so these apply (the tests' own session keeps G1);
# a user's spark.driver.extraJavaOptions are still added after them.
LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "2g",
    "spark.driver.defaultJavaOptions": "-XX:+UseParallelGC -XX:NewRatio=1",
}


@dataclass(slots=True)
class Session:
    spark: SparkSession
    owned: bool  # created here, so stopped here; a caller's session is left running


def launched_by_spark_submit() -> bool:
    """spark-submit (and the pyspark shell) start the JVM first and pass its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(master: str | None = None, app_name: str = "rmq-polling-report") -> Session:
    """The active session if there is one (tests, notebooks), else a new one.

    Without ``master`` and outside spark-submit the job runs ``local[*]``.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        _apply(active)
        return Session(active, owned=False)
    builder = SparkSession.builder.appName(app_name)
    if master is None and not launched_by_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Spark's own services would otherwise bind the first non-loopback interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        for key, value in LOCAL_CONF.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _apply(spark)
    return Session(spark, owned=True)


def _apply(spark: SparkSession) -> None:
    for key, value in REQUIRED_SQL_CONF.items():
        spark.conf.set(key, value)
