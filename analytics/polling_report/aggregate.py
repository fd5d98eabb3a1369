"""The aggregation, shared by the batch job and the stream, in three steps.

- ``per_proxy``: the one pass over the records. Per window (event time = the request's
  arrival), proxy, group, topic and mode: the request counts and a KLL sketch of the wait
  times (``wait_sketch``, Spark's ``kll_sketch_agg_bigint``).
- ``with_fleet``: adds the fleet rollup (``proxy = "_fleet"``) from the per-proxy rows,
  never from the records: counts are summed, sketches merged (``kll_merge_agg_bigint``).
  A merged KLL sketch keeps the error bound of one built from all the values at once.
- ``finish``: the ratios operators tune long polling from, broker requests per delivered
  message, the wait-time quantiles read off the sketch, and the date partition.

The batch job runs the three in one plan (``aggregate``). A stream's one stateful
aggregation is ``per_proxy``, so its state holds the sketches; each micro-batch's fleet
rows are merged again from the stored per-proxy rows, sketches included (``sink.upsert``).

Quantile error: a sketch of ``KLL_K`` items holds every value while its group has at most
that many, and then gives exact nearest-rank quantiles (the value at rank ceil(q * n) of
the sorted waits). Beyond, the value returned for quantile q has a rank within
``RANK_ERROR`` * n of q * n (DataSketches' bound for this k, at 99 % confidence).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from polling_report.schema import (
    EVENT_SCHEMA,
    FLEET,
    GROUP_KEYS,
    PARTITION_DATE,
    WAIT_COLUMNS,
    WAIT_SKETCH,
)

# The sketches' k (Spark's default): a sketch holds every value up to k of them (exact
# quantiles), about 4.7 kB at 100,000 values.
KLL_K = 200
# DataSketches' normalized rank error of one quantile for k = 200, at 99 % confidence
# (``Epsilon`` in ``kll_sketch_to_string_bigint``): tests/analytics/test_quantiles.py checks
# the quantiles of groups far larger than k against exact values with it.
RANK_ERROR = 0.0133

COUNTS = ("requests", "long_polls", "short_poll_hits", "found", "messages", "pops", "notifications")
WINDOW_KEYS = ("window_start", "window_end", "window_seconds")


def _count(condition: Column) -> Column:
    return F.sum(condition.cast("long"))


def _ratio(numerator: str, denominator: str) -> Column:
    # Requests are never zero in a group that exists; messages may be, then null (no NaN).
    return F.when(F.col(denominator) > 0, F.col(numerator) / F.col(denominator))


def per_proxy(events: DataFrame, window_s: int, watermark_s: int | None = None) -> DataFrame:
    """Counts and wait sketch per window of ``window_s``, proxy, group, topic and mode, from
    well-formed events (``source.valid_events``).

    ``watermark_s`` (streams only): how late a record may arrive; a window's state is kept
    until the newest event time seen is that much past the window's end, later records
    are dropped.
    """
    counters = (
        F.count(F.lit(1)).alias("requests"),
        _count(F.col("is_long_polling")).alias("long_polls"),
        _count(F.col("is_short_polling_hit")).alias("short_poll_hits"),
        _count(F.col("result") == "found").alias("found"),
        F.sum("messages").alias("messages"),
        F.sum("pops").alias("pops"),
        F.sum("notifications").alias("notifications"),
        F.kll_sketch_agg_bigint("wait_ms", KLL_K).alias(WAIT_SKETCH),
    )
    if watermark_s is None:
        # Batch: the window's start in epoch ms as the key, the floor of ``ts`` to a
        # multiple of the window (what ``F.window`` computes for a tumbling window from the
        # epoch), and the timestamps made once per group instead of a struct per record.
        # Every row has a ``ts``: ``valid_events`` drops the lines without one.
        window_ms = window_s * 1000
        start_ms = F.col("ts") - F.pmod(F.col("ts"), F.lit(window_ms))
        grouped = events.groupBy(start_ms.alias("start_ms"), *GROUP_KEYS).agg(*counters)
        start = F.timestamp_millis("start_ms")
        end = F.timestamp_millis(F.col("start_ms") + window_ms)
    else:
        # A stream: the state's windows are evicted by the watermark on the event time,
        # which needs the key to be a window of that column.
        timed = events.withColumn("event_time", F.timestamp_millis("ts"))
        timed = timed.withWatermark("event_time", f"{watermark_s} seconds")
        grouped = timed.groupBy(
            F.window("event_time", f"{window_s} seconds").alias("window"), *GROUP_KEYS
        ).agg(*counters)
        start, end = F.col("window.start"), F.col("window.end")
    return grouped.select(
        start.alias("window_start"),
        end.alias("window_end"),
        F.lit(window_s).alias("window_seconds"),
        *GROUP_KEYS,
        *COUNTS,
        WAIT_SKETCH,
    )


def window_date() -> Column:
    """The window's UTC date (the session runs in UTC): the output partition."""
    return F.date_format(F.col("window_start"), "yyyy-MM-dd").alias(PARTITION_DATE)


def with_fleet(rows: DataFrame) -> DataFrame:
    """``rows`` (``per_proxy``'s columns, no fleet rows) and the fleet's rows merged from
    them, with their date partition: each row counts for its proxy and for the fleet. A
    proxy's row passes through as it is (a merge of one sketch holds the same values).

    The merge runs in parallel over the shuffle partitions, and the writer takes its rows
    from there, without a shuffle of its own. (Shuffled by date instead, one file per
    date, the whole merge ran in one task: 4.8-7.5 s of a 10 million record run.)"""
    dated = rows.withColumn(PARTITION_DATE, window_date())
    doubled = dated.withColumn("proxy", F.explode(F.array(F.col("proxy"), F.lit(FLEET))))
    return doubled.groupBy(PARTITION_DATE, *WINDOW_KEYS, *GROUP_KEYS).agg(
        *(F.sum(c).alias(c) for c in COUNTS),
        F.kll_merge_agg_bigint(WAIT_SKETCH, KLL_K).alias(WAIT_SKETCH),
    )


def finish(rows: DataFrame) -> DataFrame:
    """The stored aggregates from ``with_fleet``'s rows (a row-by-row projection)."""
    ranks = F.array(*(F.lit(float(q)) for q in WAIT_COLUMNS))
    quantiles = F.kll_sketch_get_quantile_bigint(WAIT_SKETCH, ranks)
    return rows.withColumn("wait_q", quantiles).select(
        *WINDOW_KEYS,
        *GROUP_KEYS,
        *COUNTS,
        (F.col("requests") / F.col("window_seconds")).alias("request_rate"),
        _ratio("long_polls", "requests").alias("long_poll_share"),
        _ratio("short_poll_hits", "requests").alias("short_poll_hit_ratio"),
        _ratio("found", "requests").alias("found_ratio"),
        F.when(
            F.col("messages") > 0,
            (F.col("pops") + F.col("notifications")) / F.col("messages"),
        ).alias("broker_requests_per_message"),
        *(F.col("wait_q")[i].alias(name) for i, name in enumerate(WAIT_COLUMNS.values())),
        WAIT_SKETCH,
        PARTITION_DATE,
    )


def aggregate(events: DataFrame, window_s: int) -> DataFrame:
    """The batch job's aggregates: per proxy and for the fleet, one pass over ``events``."""
    return finish(with_fleet(per_proxy(events, window_s)))


def base_columns(stored: DataFrame) -> DataFrame:
    """``per_proxy``'s columns of stored aggregates (what ``with_fleet`` takes)."""
    return stored.select(*WINDOW_KEYS, *GROUP_KEYS, *COUNTS, WAIT_SKETCH)


# output_schema's result by the session's ANSI setting (the one setting that could change
# it): building the plan costs 0.2-0.5 s of every run (2-core VM), the schema is the code's.
_OUTPUT_SCHEMAS: dict[str, T.StructType] = {}


def output_schema(spark: SparkSession) -> T.StructType:
    """The aggregates' schema, from the plan of an empty input (nothing is read or run)."""
    ansi = str(spark.conf.get("spark.sql.ansi.enabled", "true"))
    schema = _OUTPUT_SCHEMAS.get(ansi)
    if schema is None:
        schema = aggregate(spark.createDataFrame([], EVENT_SCHEMA), 60).schema
        _OUTPUT_SCHEMAS[ansi] = schema
    return schema
