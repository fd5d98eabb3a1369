"""The aggregation, one function for the batch job and the stream.

Per window (event time = the request's arrival), proxy, group, topic and mode: request
counts, the ratios operators tune long polling from, broker requests per delivered message
and wait-time quantiles. The fleet rollup (``proxy = "_fleet"``) is computed in the same
aggregation from the raw rows, not summed from the per-proxy rows: quantiles of several
proxies cannot be merged from their per-proxy quantiles.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from polling_report.schema import (
    CORRUPT,
    EVENT_SCHEMA,
    FLEET,
    GROUP_KEYS,
    PARTITION_DATE,
    WAIT_COLUMNS,
)

# percentile_approx keeps every value while a group holds fewer than about this many, so
# small groups get exact quantiles (the value at rank ceil(q * n)); beyond, the error is at
# most 1/ACCURACY of the group's rank range.
ACCURACY = 10_000


def _count(condition: Column) -> Column:
    return F.sum(condition.cast("long"))


def _ratio(numerator: str, denominator: str) -> Column:
    # Requests are never zero in a group that exists; messages may be, then null (no NaN).
    return F.when(F.col(denominator) > 0, F.col(numerator) / F.col(denominator))


def aggregate(events: DataFrame, window_s: int, watermark_s: int | None = None) -> DataFrame:
    """Aggregate well-formed events (``source.valid_events``) into windows of ``window_s``.

    ``watermark_s`` (streams only): how late a record may arrive; a window's state is kept
    until the newest event time seen is that much past the window's end, later records
    are dropped.
    """
    timed = events.withColumn("event_time", F.timestamp_millis("ts"))
    if watermark_s is not None:
        timed = timed.withWatermark("event_time", f"{watermark_s} seconds")
    # Each record counts for its proxy and for the fleet: one extra row per record, in the
    # same pass (the stream allows one aggregation, and the fleet's quantiles need raw rows).
    doubled = timed.withColumn("proxy", F.explode(F.array(F.col("proxy"), F.lit(FLEET))))
    quantiles = [float(q) for q in WAIT_COLUMNS]
    grouped = doubled.groupBy(
        F.window("event_time", f"{window_s} seconds").alias("window"), *GROUP_KEYS
    ).agg(
        F.count(F.lit(1)).alias("requests"),
        _count(F.col("is_long_polling")).alias("long_polls"),
        _count(F.col("is_short_polling_hit")).alias("short_poll_hits"),
        _count(F.col("result") == "found").alias("found"),
        F.sum("messages").alias("messages"),
        F.sum("pops").alias("pops"),
        F.sum("notifications").alias("notifications"),
        F.percentile_approx("wait_ms", quantiles, ACCURACY).alias("wait_q"),
    )
    return grouped.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        F.lit(window_s).alias("window_seconds"),
        *GROUP_KEYS,
        "requests",
        "long_polls",
        "short_poll_hits",
        "found",
        "messages",
        "pops",
        "notifications",
        (F.col("requests") / F.lit(float(window_s))).alias("request_rate"),
        _ratio("long_polls", "requests").alias("long_poll_share"),
        _ratio("short_poll_hits", "requests").alias("short_poll_hit_ratio"),
        _ratio("found", "requests").alias("found_ratio"),
        F.when(
            F.col("messages") > 0,
            (F.col("pops") + F.col("notifications")) / F.col("messages"),
        ).alias("broker_requests_per_message"),
        *(F.col("wait_q")[i].alias(name) for i, name in enumerate(WAIT_COLUMNS.values())),
        # The window's UTC date (the session runs in UTC): the output partition.
        F.date_format(F.col("window.start"), "yyyy-MM-dd").alias(PARTITION_DATE),
    )


def output_schema(spark: SparkSession) -> T.StructType:
    """The aggregates' schema, from the plan of an empty input (nothing is read or run)."""
    fields = [f for f in EVENT_SCHEMA.fields if f.name != CORRUPT]
    return aggregate(spark.createDataFrame([], T.StructType(fields)), 60).schema
