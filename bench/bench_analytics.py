"""Polling-analytics benchmark: records per second of ``rmq-polling-report`` on local[2].

    .venv/bin/python -m bench.bench_analytics [--records 10000000] [--runs 2]

Generates an event log of ``--records`` lines in the proxies' layout
(``proxy=<id>/date=<day>/part-*``) with Spark itself (fast, and no Python loop per record),
once, into ``--data`` (reused while the parameters match), then times the batch job on it:
read with the explicit schema, count malformed lines, aggregate, write Parquet, summarise.
Not part of the test run. Goal: at least 500,000 records/s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from polling_report.job import JobOptions, run_batch
from polling_report.session import get_session

PROXIES = 8
GROUP_TOPICS = 20  # (group, topic) pairs
SPAN_S = 2 * 3600  # the records' event times cover two hours of one day
DAY_START_MS = 1_714_521_600_000  # 2024-05-01T00:00:00Z
MALFORMED_EVERY = 10_000  # one torn line per this many records


def generate(spark: SparkSession, records: int, out: Path) -> None:
    """Write ``records`` lines: deterministic pseudo-random fields from the row id."""
    r = F.col("id")

    def pick(salt: int, n: int):
        return F.pmod(F.xxhash64(r, F.lit(salt)), F.lit(n))

    gt = pick(2, GROUP_TOPICS)
    roll = pick(3, 100)
    hit = roll < 55 - gt  # busier-looking pairs hit more often
    long_poll = pick(4, 10) < 8
    found = hit | (pick(5, 100) < 40)
    mode = F.when(gt < 5, "coupled").when(gt < 18, "notify").otherwise("slicing")
    wait = F.when(hit, pick(6, 5)).when(found, pick(7, 20000)).otherwise(F.lit(20000))
    proxy = F.concat(F.lit("proxy-"), pick(1, PROXIES).cast("string"))
    record = F.struct(
        (F.lit(DAY_START_MS) + (r * F.lit(SPAN_S * 1000) / F.lit(records)).cast("long")).alias(
            "ts"
        ),
        proxy.alias("proxy"),
        F.concat(F.lit("group-"), gt.cast("string")).alias("group"),
        F.concat(F.lit("topic-"), gt.cast("string")).alias("topic"),
        mode.alias("mode"),
        long_poll.alias("is_long_polling"),
        hit.alias("is_short_polling_hit"),
        F.when(long_poll, F.lit(20000)).otherwise(F.lit(0)).alias("polling_ms"),
        wait.alias("wait_ms"),
        F.when(found, pick(8, 16) + 1).otherwise(F.lit(0)).alias("messages"),
        F.when(found, "found").otherwise("empty").alias("result"),
        (F.lit(1) + F.when(hit, 0).otherwise(pick(9, 3))).alias("pops"),
        F.when(hit | (mode == "coupled"), 0).otherwise(F.lit(4)).alias("notifications"),
        F.when(found, F.concat(F.lit("broker-"), pick(10, 4).cast("string"))).alias("broker"),
    )
    line = F.when(r % MALFORMED_EVERY == MALFORMED_EVERY - 1, F.lit('{"ts": 17145216')).otherwise(
        F.to_json(record)
    )
    (
        spark.range(records, numPartitions=32)
        .select(line.alias("value"), proxy.alias("proxy"), F.lit("2024-05-01").alias("date"))
        .write.mode("overwrite")
        .partitionBy("proxy", "date")
        .text(str(out))
    )


def ensure_data(spark: SparkSession, records: int, data: Path) -> Path:
    marker = data / "_BENCH_PARAMS.json"
    params = {"records": records, "proxies": PROXIES, "pairs": GROUP_TOPICS, "span_s": SPAN_S}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return data / "events"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    started = time.perf_counter()
    generate(spark, records, data / "events")
    marker.write_text(json.dumps(params))
    print(f"generated {records:,} records in {time.perf_counter() - started:.1f} s")
    return data / "events"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "rmq-bench-analytics"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    session = get_session(args.master)
    spark = session.spark
    data = Path(args.data)
    events = ensure_data(spark, args.records, data / f"n{args.records}")
    size_mb = sum(f.stat().st_size for f in events.rglob("*") if f.is_file()) / 1e6
    results = []
    for run in range(1, args.runs + 1):
        out = data / f"out-{run}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        summary = run_batch(spark, JobOptions(events=str(events), out=str(out)))
        seconds = time.perf_counter() - started
        results.append((run, summary.lines, summary.malformed, seconds))
        print(
            f"run {run}: {summary.lines:,} lines ({summary.malformed:,} malformed) in "
            f"{seconds:.1f} s = {summary.lines / seconds:,.0f} records/s",
            flush=True,
        )
    session.spark.stop()
    best = min(r[3] for r in results)
    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"input: {args.records:,} records, {size_mb:,.0f} MB of JSON lines, master {args.master}")
    print("| run | records | seconds | records/s |")
    print("|---|---|---|---|")
    for run, lines, _, seconds in results:
        print(f"| {run} | {lines:,} | {seconds:.1f} | {lines / seconds:,.0f} |")
    print(f"best: {args.records / best:,.0f} records/s (goal 500,000)")


if __name__ == "__main__":
    main()
