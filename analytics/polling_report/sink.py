"""Writing the aggregates: Parquet partitioned by date, a date replaced, never appended to.

Batch: each run overwrites exactly the date partitions it produced (dynamic partition
overwrite), so re-running a day replaces it and leaves the other days alone.

Stream: a micro-batch in update mode holds the new state of every per-proxy window it
changed (counts and wait sketch, ``aggregate.per_proxy``). It replaces the stored rows of
the same key (window, proxy, group, topic, mode) in its dates' partitions; the fleet rows
of those dates are merged again from the per-proxy rows that result, sketches included;
and those partitions are rewritten, so a window updated by late records is replaced, not
duplicated. The merge reads the very files the rewrite replaces, so it is first written whole to a
staging directory beside them (``_staging``: Spark's readers skip names that start with an
underscore) and the rewrite reads that. Files, not ``localCheckpoint``: a local checkpoint
lives in the executors' block stores, and an executor lost before the rewrite took its
blocks with it, with no lineage left to recompute them (a standalone cluster that lost a
worker mid-stream).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from polling_report.aggregate import base_columns, finish, window_date, with_fleet
from polling_report.schema import FLEET, PARTITION_DATE, ROW_KEY

# Under the output directory; a micro-batch's merge before it replaces its dates.
STAGING = "_staging"


def write_dates(aggregates: DataFrame, out: str) -> None:
    """Replace the date partitions of ``out`` that ``aggregates`` has rows for: a file per
    date and partition of ``aggregates`` that holds rows of it."""
    (
        aggregates.write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy(PARTITION_DATE)
        .parquet(out)
    )


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists, on whatever file system its URI names (via Hadoop)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # set while a context runs
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path))


def read_dates(
    spark: SparkSession, out: str, schema: StructType, dates: list[str] | None
) -> DataFrame:
    """The stored aggregates (of ``dates`` if given); empty if nothing is stored yet."""
    if not path_exists(spark, out):
        return spark.createDataFrame([], schema)
    stored = spark.read.schema(schema).parquet(out)
    return stored.where(F.col(PARTITION_DATE).isin(dates)) if dates is not None else stored


def delete_path(spark: SparkSession, path: str) -> None:
    """Delete ``path`` and what is under it, on whatever file system its URI names."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(
        hadoop_path, True
    )


def upsert(batch: DataFrame, out: str, schema: StructType) -> list[str]:
    """Merge a micro-batch of updated per-proxy windows (``aggregate.per_proxy``'s
    columns) into ``out``, whose rows have ``schema``; return the dates rewritten."""
    spark = batch.sparkSession
    dates = sorted(r[0] for r in batch.select(window_date()).distinct().collect())
    if not dates:
        return []
    stored = read_dates(spark, out, schema, dates).where(F.col("proxy") != FLEET)
    kept = stored.join(batch.select(*ROW_KEY), list(ROW_KEY), "left_anti")
    proxies = base_columns(kept).unionByName(base_columns(batch))
    staging = f"{out.rstrip('/')}/{STAGING}"
    finish(with_fleet(proxies)).write.mode("overwrite").parquet(staging)
    staged = spark.read.schema(schema).parquet(staging)
    write_dates(staged.repartition(PARTITION_DATE), out)
    delete_path(spark, staging)
    return dates
