"""The job: read, aggregate, write, summarise, push; once over what is there (batch) or
incrementally as files arrive (stream). Both use ``source.valid_events`` and
``aggregate``'s steps, so they compute the same rows from the same input."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from polling_report.aggregate import aggregate, output_schema, per_proxy
from polling_report.html import write_html
from polling_report.model import Summary
from polling_report.push import push
from polling_report.recommend import DEFAULT_MIN_REQUESTS, DEFAULT_TARGET
from polling_report.schema import WAIT_SKETCH
from polling_report.sink import read_dates, upsert, write_dates
from polling_report.source import INPUT_METRICS, read_event_stream, read_events, valid_events
from polling_report.summary import summarize, window_rows

log = logging.getLogger(__name__)

DEFAULT_JOB = "rmq_polling_report"


@dataclass(slots=True)
class JobOptions:
    events: str  # the event-log directory (local path or Hadoop URI)
    out: str  # the aggregates' Parquet directory
    window_s: int = 60
    dates: tuple[str, ...] = ()  # only these date partitions; all when empty
    # How late a record may arrive: the stream's watermark delay, and how long after its
    # end a window counts as complete (the one pushed and shown as the latest).
    lateness_s: int = 120
    pushgateway: str | None = None
    job: str = DEFAULT_JOB
    target_hit_ratio: float = DEFAULT_TARGET
    min_requests: int = DEFAULT_MIN_REQUESTS
    html: str | None = None  # write the HTML report (charts over time) here, a local path
    # Streams only.
    checkpoint: str | None = None
    once: bool = False  # availableNow: process what is there, emit every window, stop
    trigger_s: int = 60
    max_files_per_trigger: int | None = None
    now: Callable[[], float] = field(default=time.time)  # wall clock (epoch seconds)


def run_batch(spark: SparkSession, opts: JobOptions) -> Summary:
    """Aggregate the selected dates and replace them in the output."""
    observation = Observation(INPUT_METRICS)
    events = valid_events(read_events(spark, opts.events, opts.dates), observation)
    started = time.monotonic()
    # The job's one pass over the input: the write. Counting happens on the way.
    write_dates(aggregate(events, opts.window_s), opts.out)
    metrics = observation.get
    log.info("aggregated and written in %.1f s", time.monotonic() - started)
    summary = Summary(
        source=opts.events,
        window_s=opts.window_s,
        lines=int(metrics.get("lines") or 0),
        malformed=int(metrics.get("malformed") or 0),
    )
    return _finish(spark, opts, summary, list(opts.dates) or None)


def _finish(
    spark: SparkSession, opts: JobOptions, summary: Summary, dates: list[str] | None
) -> Summary:
    """Summarise what is stored for ``dates`` (all if None) and push it if asked to."""
    # The summary's queries read the stored rows, without their sketches, once into memory.
    stored = _stored(spark, opts.out, dates).drop(WAIT_SKETCH).cache()
    try:
        if dates is None:
            dates = sorted(r[0] for r in stored.select("date").distinct().collect())
        summary.dates = dates
        started = time.monotonic()
        summarize(
            stored,
            summary,
            complete_before=opts.now() - opts.lateness_s,
            target=opts.target_hit_ratio,
            min_requests=opts.min_requests,
        )
        log.info("summarised in %.1f s", time.monotonic() - started)
        if opts.html:
            write_html(opts.html, window_rows(stored), summary)
    finally:
        stored.unpersist()
    if opts.pushgateway:
        push(opts.pushgateway, opts.job, summary)
    return summary


def _stored(spark: SparkSession, out: str, dates: list[str] | None) -> DataFrame:
    return read_dates(spark, out, output_schema(spark), dates)


@dataclass(slots=True)
class _StreamState:
    """What the micro-batches of one stream run have done so far (driver side)."""

    dates: set[str] = field(default_factory=set)
    batches_written: int = 0
    seen_progress: set[int] = field(default_factory=set)
    lines: int = 0
    malformed: int = 0


def run_stream(
    spark: SparkSession,
    opts: JobOptions,
    on_batch: Callable[[Summary], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Summary:
    """Run the aggregation as a Structured Streaming query over the growing directory.

    With ``opts.once`` it processes every file there (``availableNow``) and returns;
    otherwise it runs a micro-batch every ``opts.trigger_s`` until ``should_stop()``.
    Windows are written in update mode and merged by key (``sink.upsert``); the
    checkpoint remembers which files were read and the state of open windows.
    """
    if not opts.checkpoint:
        raise ValueError("a stream needs a checkpoint directory")
    state = _StreamState()
    events = valid_events(
        read_event_stream(spark, opts.events, opts.dates, opts.max_files_per_trigger)
    )
    # The query's one stateful aggregation: per proxy, the wait sketches in its state. The
    # fleet rows are merged from the stored per-proxy rows as each micro-batch is written.
    rows = per_proxy(events, opts.window_s, watermark_s=opts.lateness_s)
    schema = output_schema(spark)

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            state.dates.update(upsert(batch, opts.out, schema))
        finally:
            batch.unpersist()
        state.batches_written += 1

    writer = (
        rows.writeStream.outputMode("update")
        .option("checkpointLocation", opts.checkpoint)
        .foreachBatch(write_batch)
        .queryName("rmq_polling_report")
    )
    writer = (
        writer.trigger(availableNow=True)
        if opts.once
        else writer.trigger(processingTime=f"{opts.trigger_s} seconds")
    )
    query = writer.start()
    summary = Summary(source=opts.events, window_s=opts.window_s)
    try:
        while query.isActive:
            query.awaitTermination(0.25)  # type: ignore[arg-type]  # annotated int, takes seconds as a float
            if _collect_progress(query, state) and not opts.once:
                _report_stream(spark, opts, state, summary, on_batch)
            if should_stop():
                break
    finally:
        if query.isActive:
            query.stop()
    error = query.exception()
    if error is not None:
        raise RuntimeError(f"the stream failed: {error}")
    _collect_progress(query, state)
    return _report_stream(spark, opts, state, summary, None)


def _collect_progress(query: StreamingQuery, state: _StreamState) -> bool:
    """Add the input counters of progress reports not seen yet; True if there were any
    that read data."""
    new = False
    for progress in query.recentProgress:
        if progress.batchId in state.seen_progress:
            continue
        state.seen_progress.add(progress.batchId)
        observed = progress.observedMetrics.get(INPUT_METRICS)
        if observed is not None:
            state.lines += int(observed["lines"] or 0)
            state.malformed += int(observed["malformed"] or 0)
            new = new or bool(observed["lines"])
    return new


def _report_stream(
    spark: SparkSession,
    opts: JobOptions,
    state: _StreamState,
    summary: Summary,
    on_batch: Callable[[Summary], None] | None,
) -> Summary:
    summary.lines, summary.malformed = state.lines, state.malformed
    _finish(spark, opts, summary, sorted(state.dates))
    if on_batch is not None:
        on_batch(summary)
    return summary
