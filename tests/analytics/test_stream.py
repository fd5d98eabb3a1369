"""Structured Streaming over the same log: the same rows as the batch job; a checkpointed
re-run reads only new files; a record later than the watermark is dropped."""

from __future__ import annotations

import os

import pytest

from polling_report.job import JobOptions, run_batch, run_stream
from proxy.config import EventLogFormat
from tests.analytics._events import event, write_log
from tests.analytics.test_batch import DAY, MALFORMED, crafted_log, stored_rows

pytestmark = pytest.mark.slow


def order_files(root):
    """Give the part files increasing modification times in name order of their days: the
    file source reads the oldest first, and the next day's file must come last here."""
    files = sorted(root.rglob("part-*"), key=lambda p: (p.parent.name, p.parent.parent.name))
    for i, path in enumerate(files):
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))


def by_key(rows):
    return {(r["window_start"], r["proxy"], r["group"], r["topic"], r["mode"]): r for r in rows}


@pytest.mark.parametrize("fmt", list(EventLogFormat))
def test_stream_and_batch_agree_then_a_rerun_reads_only_new_files(spark, tmp_path, fmt):
    events = tmp_path / "events"
    crafted_log(events, fmt=fmt)
    order_files(events)
    batch = run_batch(spark, JobOptions(events=str(events), out=str(tmp_path / "batch")))

    opts = JobOptions(
        events=str(events),
        out=str(tmp_path / "stream"),
        checkpoint=str(tmp_path / "checkpoint"),
        once=True,
        max_files_per_trigger=1,  # one file per micro-batch: windows get updated, and merged
    )
    streamed = run_stream(spark, opts)

    assert (streamed.lines, streamed.malformed) == (batch.lines, batch.malformed)
    assert (streamed.malformed, streamed.records) == (len(MALFORMED), 9)
    stream_rows = by_key(stored_rows(spark, str(tmp_path / "stream")))
    batch_rows = by_key(stored_rows(spark, str(tmp_path / "batch")))
    assert stream_rows == batch_rows
    assert len(stream_rows) == 11  # nine rows on the first day, two on the second
    assert streamed.dates == [DAY, "2024-05-02"]

    # Later: one record within the watermark (two minutes behind the newest event time,
    # 2024-05-02 00:00:30) and one far behind it.
    write_log(
        events,
        "part-4",
        [event(f"{DAY}T10:00:30", proxy="p3", wait_ms=1)],
        fmt=fmt,
    )
    write_log(events, "part-5", [event("2024-05-02T00:00:40", proxy="p1", wait_ms=9)], fmt=fmt)
    again = run_stream(spark, opts)

    assert (again.lines, again.malformed) == (2, 0)  # the checkpoint skips the old files
    rows = by_key(stored_rows(spark, str(tmp_path / "stream")))
    day2 = {k: r for k, r in rows.items() if k[0].startswith("2024-05-02")}
    assert sorted((k[1], r["requests"], r["wait_p99_ms"]) for k, r in day2.items()) == [
        ("_fleet", 2, 9),
        ("p1", 2, 9),
    ]
    # The late record was dropped: the first day is as before, without proxy p3.
    day1 = {k: r for k, r in rows.items() if k[0].startswith(DAY)}
    assert day1 == {k: r for k, r in batch_rows.items() if k[0].startswith(DAY)}
    assert again.dates == ["2024-05-02"]
