"""From stored aggregates to a ``Summary``: a few small queries, collected to the driver.

They run on the aggregates read back from Parquet (small: one row per window and key), not
on the events, so the report costs no second pass over the input and shows what is stored.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from polling_report.model import Summary, Totals, WindowRow
from polling_report.recommend import RatePoint, recommend
from polling_report.schema import FLEET, GROUP_KEYS

_COUNTS = ("requests", "long_polls", "short_poll_hits", "found", "messages")


def _utc(seconds: int | None) -> datetime | None:
    # Collected timestamps would come back naive, in the driver's local time zone; epoch
    # seconds do not depend on it.
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


def _only_row(aggregate: DataFrame) -> Row:
    """The row of an aggregate without grouping: Spark gives one even over no input."""
    row = aggregate.first()
    assert row is not None
    return row


def window_rows(stored: DataFrame) -> list[WindowRow]:
    """The rows of ``stored`` as ``WindowRow`` records, by window, each window's fleet
    rollup after its proxies."""
    rows = (
        stored.withColumn("window_start", F.unix_seconds("window_start"))
        .withColumn("window_end", F.unix_seconds("window_end"))
        .orderBy("window_start", (F.col("proxy") == FLEET), *GROUP_KEYS)
        .collect()
    )
    return [
        WindowRow.from_dict(
            {
                **r.asDict(),
                "window_start": _utc(r["window_start"]),
                "window_end": _utc(r["window_end"]),
            }
        )
        for r in rows
    ]


def summarize(
    stored: DataFrame,
    summary: Summary,
    complete_before: float,
    target: float,
    min_requests: int,
) -> Summary:
    """Fill ``summary`` from ``stored`` aggregates; a window is complete when it ended at or
    before ``complete_before`` (epoch seconds). ``summary.latest`` is the latest complete
    window, or the newest window if none is complete yet."""
    start = F.unix_seconds("window_start")
    end = F.unix_seconds("window_end")
    # The bounds and the latest windows in one query (each query on the cached rows costs
    # a job of its own, 0.1-0.4 s).
    bounds = _only_row(
        stored.agg(
            F.min(start).alias("first"),
            F.max(end).alias("last"),
            F.max(F.when(end <= F.lit(int(complete_before)), start)).alias("latest_complete"),
            F.max(start).alias("newest"),
        )
    )
    summary.first_window = _utc(bounds["first"])
    summary.last_window_end = _utc(bounds["last"])

    fleet = stored.where(F.col("proxy") == FLEET)
    totals = (
        fleet.groupBy("group", "topic", "mode")
        .agg(
            *(F.sum(c).alias(c) for c in _COUNTS),
            F.sum(F.col("pops") + F.col("notifications")).alias("broker_requests"),
        )
        .orderBy("group", "topic", "mode")
        .collect()
    )
    summary.totals = [Totals(**row.asDict()) for row in totals]

    latest_start = bounds["latest_complete"]
    summary.latest_complete = latest_start is not None
    if latest_start is None:
        # A log younger than window + lateness has no complete window yet: show and push
        # the newest one rather than nothing (it is replaced as it fills up).
        latest_start = bounds["newest"]
    if latest_start is not None:
        summary.latest = window_rows(stored.where(start == F.lit(latest_start)))

    # The proxy's switch counts each proxy's own requests: one point per proxy and window.
    points = (
        stored.where(F.col("proxy") != FLEET)
        .groupBy("window_start", "window_seconds", "proxy", "group", "topic")
        .agg(F.sum("requests").alias("requests"), F.sum("short_poll_hits").alias("hits"))
        .select(
            "group",
            "topic",
            (F.col("requests") / F.col("window_seconds")).alias("rate"),
            "requests",
            "hits",
        )
        .collect()
    )
    summary.recommendations = recommend(
        (RatePoint(**p.asDict()) for p in points), target, min_requests
    )
    return summary
