"""Reading the event log, in batch or as a stream, and separating malformed lines.

Spark's partition discovery turns ``proxy=<id>/date=<day>`` into columns; a filter on
``date`` prunes whole directories, so a run over one day reads only that day's files.
Hidden files (the writer's ``.part-*.inprogress``) are skipped by Spark's file listing.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from polling_report.schema import EVENT_SCHEMA, PARTITION_DATE, REQUIRED_FIELDS

INPUT_METRICS = "input"  # name of the observed input counters (lines, malformed)
_BAD = "_malformed"


def _json_options() -> dict[str, str]:
    # PERMISSIVE: a line that does not parse becomes a row of nulls, a value that does not
    # fit its field a null in that field, instead of failing the job (schema.py).
    return {"mode": "PERMISSIVE"}


def read_events(spark: SparkSession, path: str, dates: Sequence[str] = ()) -> DataFrame:
    """Every line under ``path`` (any Hadoop-compatible URI), pruned to ``dates`` if given."""
    df = spark.read.schema(EVENT_SCHEMA).options(**_json_options()).json(path)
    return _prune(df, dates)


def read_event_stream(
    spark: SparkSession,
    path: str,
    dates: Sequence[str] = (),
    max_files_per_trigger: int | None = None,
) -> DataFrame:
    """The same lines as a file stream: each new (renamed, complete) file is read once."""
    reader = spark.readStream.schema(EVENT_SCHEMA).options(**_json_options())
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    return _prune(reader.json(path), dates)


def _prune(df: DataFrame, dates: Sequence[str]) -> DataFrame:
    return df.where(F.col(PARTITION_DATE).isin(list(dates))) if dates else df


def malformed(df: DataFrame) -> Column:
    """True for a line with no value for some required field (a line that did not parse
    has none)."""
    return reduce(lambda a, b: a | b, (F.col(name).isNull() for name in REQUIRED_FIELDS))


def valid_events(df: DataFrame, observation: Observation | str = INPUT_METRICS) -> DataFrame:
    """The well-formed rows of ``df``, counting lines and malformed lines as they pass:
    the required fields and the date partition (``broker``, which nothing aggregates, is
    left out).

    ``observe`` counts during the job's one pass over the input (no second read): after a
    batch action the counts are in ``observation.get``; for a stream they are in each
    progress report's ``observedMetrics[observation]``. The optimizer prunes no column
    through an ``observe``, so the columns are chosen before it: a field that is not
    selected is not converted by the JSON reader (measured: 0.5 s of executor CPU less in
    6.5 s for 2 M records without ``broker``).
    """
    flagged = df.select(*REQUIRED_FIELDS, PARTITION_DATE, malformed(df).alias(_BAD))
    counted = flagged.observe(
        observation,
        F.count(F.lit(1)).alias("lines"),
        F.count_if(F.col(_BAD)).alias("malformed"),
    )
    return counted.where(~F.col(_BAD)).drop(_BAD)
