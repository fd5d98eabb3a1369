"""The batch job on a small crafted log, against aggregates worked out by hand.

Real PySpark in local mode (the session fixture in conftest.py).
"""

from __future__ import annotations

import json

import pytest

from polling_report.job import JobOptions, run_batch
from proxy.config import EventLogFormat
from tests.analytics._events import event, ms, write_log

pytestmark = pytest.mark.slow

DAY = "2024-05-01"
W1, W2 = f"{DAY}T10:00:00", f"{DAY}T10:01:00"

# Lines that must be counted as malformed, never fail the job: not JSON, a last line torn
# after every required field (in ``broker``, the last one), a wrong type, a record without
# its required fields.
MALFORMED = [
    "not json at all",
    json.dumps(event(f"{DAY}T10:00:06", broker="broker-a"))[:-6],
    json.dumps({**event(f"{DAY}T10:00:07"), "wait_ms": "slow"}),
    json.dumps({"ts": ms(f"{DAY}T10:00:08"), "proxy": "p1"}),
]


def crafted_log(root, next_day: bool = True, fmt: EventLogFormat = EventLogFormat.JSONL):
    """Eight good records over two windows, two proxies, two group/topics, three modes;
    four malformed lines; with ``next_day`` one more record on the next day. The records
    in ``fmt``; the malformed lines are JSON lines either way."""
    found = dict(result="found", broker="broker-a")
    write_log(
        root,
        "part-1",
        [
            event(f"{DAY}T10:00:01", proxy="p1", group="g1", topic="t1", mode="notify",
                  is_short_polling_hit=True, wait_ms=2, messages=3, pops=1, **found),
            event(f"{DAY}T10:00:10", proxy="p1", group="g1", topic="t1", mode="notify",
                  wait_ms=400, messages=1, pops=2, notifications=3, **found),
            event(f"{DAY}T10:00:20", proxy="p1", group="g1", topic="t1", mode="notify",
                  wait_ms=20000, pops=1, notifications=3),
            event(f"{DAY}T10:00:30", proxy="p1", group="g1", topic="t1", mode="notify",
                  is_long_polling=False, wait_ms=1, pops=1),
            event(f"{DAY}T10:00:40", proxy="p1", group="g1", topic="t1", mode="coupled",
                  is_short_polling_hit=True, wait_ms=3, messages=2, pops=1, **found),
            # On the window boundary: belongs to the second window.
            event(W2, proxy="p1", group="g1", topic="t1", mode="notify",
                  wait_ms=900, messages=4, pops=2, notifications=2, **found),
        ],
        MALFORMED,
        fmt,
    )  # fmt: skip
    write_log(
        root,
        "part-1",
        [
            event(f"{DAY}T10:00:50", proxy="p2", group="g1", topic="t1", mode="notify",
                  is_short_polling_hit=True, wait_ms=5, messages=1, pops=1, **found),
            event(f"{DAY}T10:01:59.999", proxy="p2", group="g2", topic="t2", mode="slicing",
                  wait_ms=50, pops=0, result="TOO_MANY_REQUESTS"),
        ],
        fmt=fmt,
    )  # fmt: skip
    if next_day:
        write_log(root, "part-2", [event("2024-05-02T00:00:30", proxy="p1", wait_ms=8)],
                  fmt=fmt)  # fmt: skip


def row(window, proxy, group, topic, mode, requests, long_polls, hits, found, messages, pops,
        notifications, per_message, p50, p90, p99):  # fmt: skip
    return {
        "window_start": window, "proxy": proxy, "group": group, "topic": topic, "mode": mode,
        "requests": requests, "long_polls": long_polls, "short_poll_hits": hits,
        "found": found, "messages": messages, "pops": pops, "notifications": notifications,
        "request_rate": requests / 60, "long_poll_share": long_polls / requests,
        "short_poll_hit_ratio": hits / requests, "found_ratio": found / requests,
        "broker_requests_per_message": per_message,
        "wait_p50_ms": p50, "wait_p90_ms": p90, "wait_p99_ms": p99,
    }  # fmt: skip


# Worked out by hand from crafted_log. Quantiles are nearest-rank: the value at rank
# ceil(q * n) of the sorted waits, e.g. p1's notify waits 1, 2, 400, 20000 give p50 = 2.
EXPECTED_DAY1 = [
    # window proxy   group topic mode     req long hit found msgs pops notif per_msg p50 p90 p99
    row(W1, "p1",     "g1", "t1", "notify",  4,  3,  1,  2,  4,  5,  6, 11 / 4,  2, 20000, 20000),
    row(W1, "p1",     "g1", "t1", "coupled", 1,  1,  1,  1,  2,  1,  0, 1 / 2,   3, 3, 3),
    row(W1, "p2",     "g1", "t1", "notify",  1,  1,  1,  1,  1,  1,  0, 1.0,     5, 5, 5),
    row(W1, "_fleet", "g1", "t1", "notify",  5,  4,  2,  3,  5,  6,  6, 12 / 5,  5, 20000, 20000),
    row(W1, "_fleet", "g1", "t1", "coupled", 1,  1,  1,  1,  2,  1,  0, 1 / 2,   3, 3, 3),
    row(W2, "p1",     "g1", "t1", "notify",  1,  1,  0,  1,  4,  2,  2, 1.0,     900, 900, 900),
    row(W2, "_fleet", "g1", "t1", "notify",  1,  1,  0,  1,  4,  2,  2, 1.0,     900, 900, 900),
    row(W2, "p2",     "g2", "t2", "slicing", 1,  1,  0,  0,  0,  0,  0, None,    50, 50, 50),
    row(W2, "_fleet", "g2", "t2", "slicing", 1,  1,  0,  0,  0,  0,  0, None,    50, 50, 50),
]  # fmt: skip


def stored_rows(spark, out, date=None):
    """Every stored row, its wait sketch as the number of waits it holds (``sketch_n``):
    sketches of the same waits taken in another order differ in their bytes."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(out)
    if date is not None:
        df = df.where(F.col("date").cast("string") == date)
    df = df.withColumn("sketch_n", F.kll_sketch_get_n_bigint("wait_sketch")).drop("wait_sketch")
    rows = []
    for r in df.collect():
        d = r.asDict()
        d["window_start"] = d["window_start"].strftime("%Y-%m-%dT%H:%M:%S")
        rows.append(d)
    return rows


def comparable(rows):
    keys = ("window_start", "proxy", "group", "topic", "mode")
    return sorted(({k: r[k] for k in EXPECTED_DAY1[0]} for r in rows), key=lambda r: [
        r[k] for k in keys])  # fmt: skip


@pytest.mark.parametrize("fmt", list(EventLogFormat))
def test_aggregates_match_hand_computed_and_malformed_lines_are_counted(spark, tmp_path, fmt):
    """The same numbers whether the records are Parquet or JSON lines."""
    crafted_log(tmp_path / "events", fmt=fmt)
    out = str(tmp_path / "out")
    summary = run_batch(spark, JobOptions(events=str(tmp_path / "events"), out=out))

    assert summary.lines == 8 + 1 + len(MALFORMED)
    assert summary.malformed == len(MALFORMED)
    assert summary.records == 9
    assert summary.dates == [DAY, "2024-05-02"]
    day1 = stored_rows(spark, out, DAY)
    assert comparable(day1) == comparable(EXPECTED_DAY1)
    # Each row's sketch holds its waits, the fleet's those of all its proxies.
    assert all(r["sketch_n"] == r["requests"] for r in day1)
    assert {r["window_seconds"] for r in day1} == {60}
    assert {(r["window_start"], r["window_end"].strftime("%H:%M")) for r in day1} == {
        (W1, "10:01"),
        (W2, "10:02"),
    }
    day2 = stored_rows(spark, out, "2024-05-02")
    assert sorted((r["proxy"], r["requests"], r["wait_p99_ms"]) for r in day2) == [
        ("_fleet", 1, 8),
        ("p1", 1, 8),
    ]

    # Fleet totals per group/topic/mode over the run, as the report prints them.
    totals = {(t.group, t.topic, t.mode): (t.requests, t.short_poll_hits) for t in summary.totals}
    assert totals == {
        ("g", "t", "notify"): (1, 0),
        ("g1", "t1", "coupled"): (1, 1),
        ("g1", "t1", "notify"): (6, 2),
        ("g2", "t2", "slicing"): (1, 0),
    }
    # The latest complete window is the next day's only one.
    assert {r.proxy for r in summary.latest} == {"p1", "_fleet"}
    assert summary.latest[0].window_start.isoformat() == "2024-05-02T00:00:00+00:00"


def test_a_rerun_of_a_day_replaces_it_and_leaves_other_days(spark, tmp_path):
    events = tmp_path / "events"
    crafted_log(events)
    out = str(tmp_path / "out")
    run_batch(spark, JobOptions(events=str(events), out=out))
    day2_before = stored_rows(spark, out, "2024-05-02")

    # Same day again, unchanged input: identical rows, none duplicated.
    first = run_batch(spark, JobOptions(events=str(events), out=out, dates=(DAY,)))
    assert comparable(stored_rows(spark, out, DAY)) == comparable(EXPECTED_DAY1)
    # Only that day was read (partition pruning): the next day's record is not counted.
    assert (first.lines, first.malformed) == (8 + len(MALFORMED), len(MALFORMED))

    # A file arrives for the first window; the re-run replaces that window's rows.
    write_log(events, "part-3", [event(f"{DAY}T10:00:59", proxy="p2", group="g1",
                                       topic="t1", mode="notify", wait_ms=7)])  # fmt: skip
    run_batch(spark, JobOptions(events=str(events), out=out, dates=(DAY,)))
    rows = stored_rows(spark, out, DAY)
    keys = [(r["window_start"], r["proxy"], r["group"], r["topic"], r["mode"]) for r in rows]
    assert len(keys) == len(set(keys)) == len(EXPECTED_DAY1)
    fleet = next(
        r for r in rows if r["window_start"] == W1 and r["proxy"] == "_fleet"
        and r["mode"] == "notify"
    )  # fmt: skip
    assert (fleet["requests"], fleet["short_poll_hits"]) == (6, 2)
    assert stored_rows(spark, out, "2024-05-02") == day2_before
