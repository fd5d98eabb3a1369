"""Polling-analytics benchmark: records per second of ``rmq-polling-report``, on local[2]
and on a standalone cluster, each beside a same-run reference.

    .venv/bin/python -m bench.bench_analytics [--records 10000000] [--runs 3] [--no-cluster]
        [--profile ROUNDS] [--json results/bench-analytics.json]

Generates an event log of ``--records`` lines in the proxies' layout
(``proxy=<id>/date=<day>/part-*``) with Spark itself (fast, and no Python loop per record),
once, into ``--data`` (reused while the parameters match). Then, for each place it runs:

- **the job**: ``run_batch`` (read with the explicit schema, count malformed lines,
  aggregate, write Parquet, summarise);
- **the reference**: Spark reading the same files as JSON with a trivial schema (``ts``
  alone) and counting the lines that have one: the least any JSON job over them costs.

``--profile ROUNDS`` then times the job's steps on local[2], in the same warm JVM, each
round in this order: the reference; the parse (``valid_events``, every required field
converted, malformed lines counted); the parse and ``per_proxy``; the parse and the whole
aggregation (``aggregate``), both into Spark's ``noop`` sink, which computes every column
and stores nothing; the job. Medians, and each beside the reference's.

Job and reference alternate run by run, so the machine's load falls on both alike. The
places: ``local[2]`` (one JVM, two cores), then a standalone cluster of a master and two
workers of 1 core each (testkit/spark_cluster.py) with one executor on each. Not part of
the test run. Goals: at least 500,000 records/s on local[2]; the job within 2x of the
reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from polling_report.aggregate import aggregate, per_proxy
from polling_report.job import JobOptions, run_batch
from polling_report.session import REQUIRED_SQL_CONF, get_session
from polling_report.source import read_events, valid_events

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


@dataclass
class Place:
    """Where the job ran, and its runs: (records, job seconds, reference seconds)."""

    name: str
    runs: list[tuple[int, float, float]] = field(default_factory=list)

    def best(self) -> tuple[float, float]:
        """Records per second of the fastest job run and of the fastest reference run."""
        records = self.runs[0][0]
        return records / min(r[1] for r in self.runs), records / min(r[2] for r in self.runs)


def reference(spark: SparkSession, events: Path) -> tuple[int, float]:
    """The same files read as JSON with one field, the lines that have it counted."""
    started = time.perf_counter()
    n = spark.read.schema("ts LONG").json(str(events)).where(F.col("ts").isNotNull()).count()
    return n, time.perf_counter() - started


def measure(spark: SparkSession, place: Place, events: Path, data: Path, runs: int) -> None:
    for run in range(1, runs + 1):
        out = data / f"out-{run}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        summary = run_batch(spark, JobOptions(events=str(events), out=str(out)))
        seconds = time.perf_counter() - started
        counted, ref_seconds = reference(spark, events)
        assert counted == summary.records, (counted, summary.records)
        place.runs.append((summary.lines, seconds, ref_seconds))
        print(
            f"{place.name} run {run}: {summary.lines:,} lines ({summary.malformed:,} malformed):"
            f" job {seconds:.1f} s = {summary.lines / seconds:,.0f} records/s; reference"
            f" {ref_seconds:.1f} s = {summary.lines / ref_seconds:,.0f} records/s;"
            f" ratio {seconds / ref_seconds:.2f}",
            flush=True,
        )


def profile(spark: SparkSession, events: Path, data: Path, rounds: int) -> list[dict]:
    """The job's steps, each round in turn (module docstring); median seconds of each."""
    path = str(events)

    def parsed() -> DataFrame:
        return valid_events(read_events(spark, path), Observation())

    def job() -> None:
        out = data / "out-profile"
        shutil.rmtree(out, ignore_errors=True)
        run_batch(spark, JobOptions(events=path, out=str(out)))

    steps = {
        "reference: ts alone, counted": lambda: reference(spark, events),
        "parse: required fields, malformed counted": lambda: parsed().count(),
        "parse + per_proxy (noop sink)": lambda: _noop(per_proxy(parsed(), 60)),
        "parse + aggregate (noop sink)": lambda: _noop(aggregate(parsed(), 60)),
        "the job: aggregate, Parquet, summary": job,
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_ in range(1, rounds + 1):
        for name, step in steps.items():
            started = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - started)
            print(f"profile round {round_}: {name} {times[name][-1]:.1f} s", flush=True)
    reference_s = statistics.median(next(iter(times.values())))
    return [
        {"step": name, "median_s": round(statistics.median(t), 2),
         "of_reference": round(statistics.median(t) / reference_s, 2),
         "runs_s": [round(x, 2) for x in t]}
        for name, t in times.items()
    ]  # fmt: skip


def _noop(df: DataFrame) -> None:
    df.write.format("noop").mode("overwrite").save()


def cluster_session(master: str) -> SparkSession:
    """A session of this process on the standalone cluster: one executor of 1 core on each
    worker, the driver here (our packages are installed where its executors run: this
    machine)."""
    builder = (
        SparkSession.builder.master(master)
        .appName("rmq-polling-report-bench")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", CLUSTER_EXECUTOR_MEMORY)
        .config("spark.cores.max", "2")
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.executor.defaultJavaOptions", "-XX:+UseParallelGC -XX:NewRatio=1")
    )
    for key, value in REQUIRED_SQL_CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


# Each worker offers this to its executor: what local[2]'s driver has, split in two.
CLUSTER_WORKER_MEMORY = "1200m"
CLUSTER_EXECUTOR_MEMORY = "1g"


def stop_spark_jvm() -> None:
    """Stop the Spark JVM this process launched and wait until it is gone. It ends by
    itself when this process exits, but seconds later on a busy machine: the command
    would end with its JVM still running."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    gateway.shutdown()
    if proc.stdin is not None:
        proc.stdin.close()  # the JVM exits at the end of its standard input
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--no-cluster", action="store_true", help="local runs only")
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="then time the job's steps on local[2], this many rounds",
    )
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "rmq-bench-analytics"))
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    session = get_session(args.master)
    data = Path(args.data)
    events = ensure_data(session.spark, args.records, data / f"n{args.records}")
    size_mb = sum(f.stat().st_size for f in events.rglob("*") if f.is_file()) / 1e6
    places = [Place(args.master)]
    measure(session.spark, places[0], events, data, args.runs)
    steps = profile(session.spark, events, data, args.profile) if args.profile else []
    session.spark.stop()
    if not args.no_cluster:
        from testkit.spark_cluster import standalone_cluster

        root = Path(tempfile.mkdtemp(prefix="rmq-bench-cluster-"))
        try:
            with standalone_cluster(root, workers=2, worker_memory=CLUSTER_WORKER_MEMORY) as c:
                spark = cluster_session(c.url)
                places.append(Place("standalone, 2 workers x 1 core"))
                try:
                    measure(spark, places[-1], events, data, args.runs)
                finally:
                    spark.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"input: {args.records:,} records, {size_mb:,.0f} MB of JSON lines")
    print("| where | run | job s | job records/s | reference s | reference records/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for place in places:
        for run, (lines, seconds, ref) in enumerate(place.runs, 1):
            print(
                f"| {place.name} | {run} | {seconds:.1f} | {lines / seconds:,.0f} | {ref:.1f} |"
                f" {lines / ref:,.0f} | {seconds / ref:.2f} |"
            )
    for place in places:
        job, ref = place.best()
        print(
            f"{place.name}: best job {job:,.0f} records/s, best reference {ref:,.0f} records/s,"
            f" ratio {ref / job:.2f} (goals: 500,000 records/s on local[2], ratio <= 2)"
        )
    if steps:
        print(f"| {places[0].name}: step | median s | / reference | runs s |")
        print("|---|---|---|---|")
        for step in steps:
            runs = ", ".join(f"{x:.1f}" for x in step["runs_s"])
            print(
                f"| {step['step']} | {step['median_s']:.1f} | {step['of_reference']:.2f} | {runs} |"
            )
    if args.json:
        results = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "records": args.records,
            "input_mb": round(size_mb, 1),
            "places": [
                {
                    "name": place.name,
                    "runs": [
                        {"job_s": round(job_s, 2), "reference_s": round(ref_s, 2)}
                        for _, job_s, ref_s in place.runs
                    ],
                    "best_job_records_per_s": round(place.best()[0]),
                    "best_reference_records_per_s": round(place.best()[1]),
                }
                for place in places
            ],
            "profile": steps,
        }
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_spark_jvm()
