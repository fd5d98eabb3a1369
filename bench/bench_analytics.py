"""Polling-analytics benchmark: the event log's two formats (Parquet, JSON lines) side by
side: bytes per event on disk, the proxy writer's CPU per event, and the records per second
of ``rmq-polling-report`` on local[2] and on a standalone cluster, each beside a same-run
reference.

    .venv/bin/python -m bench.bench_analytics [--records 10000000] [--runs 3] [--no-cluster]
        [--profile ROUNDS] [--writer-slot-s 8] [--json results/bench-analytics.json]

Generates an event log of ``--records`` records in the proxies' layout
(``proxy=<id>/date=<day>/part-*``) with Spark itself (fast, and no Python loop per record)
as JSON lines, and converts it, file by file, to Parquet with the proxy's own writer
(``proxy.observability.eventlog_parquet``: its schema, encodings, compression and row
groups), once, into ``--data`` (reused while the parameters match). Then:

- for each place and each format, **the job**: ``run_batch`` (read, count malformed lines,
  aggregate, write Parquet, summarise);
- and **the reference**: the least any job over those files costs. JSON lines: Spark
  reading them with a trivial schema (``ts`` alone) and counting the lines that have one.
  Parquet: Spark reading the columns the job reads and counting each column's values;
- last, once Spark's JVMs are gone, **the writer**: the busy scenario
  (``bench.scenarios.busy``: 64 consumers, 1,000 msg/s) through one proxy writing its event
  log in each format in turn; the writer thread's CPU per event, read from the proxy's own
  count (``/v1/status``), files completed every ``--writer-age-s`` (60 s; the proxy's
  default is 300 s).

``--profile ROUNDS`` times the job's steps on local[2] over one format
(``--profile-format``, default parquet), in the same warm JVM, each round in this order:
the reference; the read (``valid_events``, every required field read, malformed lines
counted); the read and ``per_proxy``; the read and the whole aggregation (``aggregate``),
both into Spark's ``noop`` sink, which computes every column and stores nothing; the job.
Medians, and each beside the reference's.

Job and reference alternate run by run, so the machine's load falls on both alike. The
places: ``local[2]`` (one JVM, two cores), then a standalone cluster of a master and two
workers of 1 core each (testkit/spark_cluster.py) with one executor on each. Not part of
the test run. Goals (Parquet): at most a tenth of the JSON lines' bytes, a writer no
costlier than the JSON one, at least 1,000,000 records/s on local[2], within 2x of its
reference.
"""

from __future__ import annotations

import argparse
import asyncio
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

import orjson
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from bench import scenarios
from polling_report.aggregate import aggregate, per_proxy
from polling_report.job import JobOptions, run_batch
from polling_report.schema import EVENT_SCHEMA, REQUIRED_FIELDS
from polling_report.session import REQUIRED_SQL_CONF, get_session
from polling_report.source import read_events, valid_events
from proxy.config import EventLogFormat
from proxy.loop import run_main
from proxy.observability.eventlog_parquet import ParquetPart
from proxy.observability.receive_event import ReceiveEvent
from testkit.processes import System, status

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


def ensure_data(spark: SparkSession, records: int, data: Path) -> dict[EventLogFormat, Path]:
    """The generated log in both formats: JSON lines (``events``) and Parquet
    (``events-parquet``), the same records but the malformed lines, which Parquet cannot
    hold."""
    marker = data / "_BENCH_PARAMS.json"
    params = {"records": records, "proxies": PROXIES, "pairs": GROUP_TOPICS, "span_s": SPAN_S,
              "formats": ["jsonl", "parquet"]}  # fmt: skip
    paths = {EventLogFormat.PARQUET: data / "events-parquet", EventLogFormat.JSONL: data / "events"}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return paths
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    started = time.perf_counter()
    generate(spark, records, paths[EventLogFormat.JSONL])
    for text in paths[EventLogFormat.JSONL].rglob("part-*.txt"):
        text.rename(text.with_suffix(".jsonl"))  # the proxy's suffix, which the job reads
    print(f"generated {records:,} records in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    to_parquet(paths[EventLogFormat.JSONL], paths[EventLogFormat.PARQUET])
    print(f"converted them to Parquet in {time.perf_counter() - started:.1f} s")
    marker.write_text(json.dumps(params))
    return paths


def to_parquet(jsonl: Path, out: Path) -> None:
    """Each JSON-lines file as a Parquet file of the same name and partition, written as
    the proxy writes one (``ParquetPart``); lines that do not parse are left out."""
    for source in sorted(jsonl.rglob("part-*.jsonl")):
        target = out / source.relative_to(jsonl).with_suffix(".parquet")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("xb") as fh:
            part = ParquetPart(fh)
            with source.open("rb") as lines:
                for line in lines:
                    try:
                        record = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue
                    record.setdefault("broker", None)  # Spark's JSON leaves nulls out
                    part.add(ReceiveEvent(**record))
            part.finish()


def disk_bytes(root: Path, suffix: str) -> int:
    return sum(f.stat().st_size for f in root.rglob(f"part-*{suffix}"))


@dataclass
class Place:
    """Where the job ran, over which format, and its runs: (records, job seconds, reference
    seconds)."""

    name: str
    log_format: EventLogFormat
    runs: list[tuple[int, float, float]] = field(default_factory=list)

    def best(self) -> tuple[float, float]:
        """Records per second of the fastest job run and of the fastest reference run."""
        records = self.runs[0][0]
        return records / min(r[1] for r in self.runs), records / min(r[2] for r in self.runs)


def reference(spark: SparkSession, events: Path, log_format: EventLogFormat) -> tuple[int, float]:
    """The least a job over ``events`` costs (module docstring): the records it counted,
    and the seconds."""
    started = time.perf_counter()
    if log_format is EventLogFormat.JSONL:
        n = spark.read.schema("ts LONG").json(str(events)).where(F.col("ts").isNotNull()).count()
    else:
        columns = spark.read.schema(EVENT_SCHEMA).parquet(str(events))
        counts = columns.agg(*(F.count(c) for c in REQUIRED_FIELDS))
        n = min(counts.first() or [0])
    return n, time.perf_counter() - started


def measure(spark: SparkSession, place: Place, events: Path, data: Path, runs: int) -> None:
    for run in range(1, runs + 1):
        out = data / f"out-{run}"
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        summary = run_batch(spark, JobOptions(events=str(events), out=str(out)))
        seconds = time.perf_counter() - started
        counted, ref_seconds = reference(spark, events, place.log_format)
        assert counted == summary.records, (counted, summary.records)
        place.runs.append((summary.lines, seconds, ref_seconds))
        print(
            f"{place.name}, {place.log_format}, run {run}: {summary.lines:,} records"
            f" ({summary.malformed:,} malformed): job {seconds:.1f} s ="
            f" {summary.lines / seconds:,.0f} records/s; reference {ref_seconds:.1f} s ="
            f" {summary.lines / ref_seconds:,.0f} records/s; ratio {seconds / ref_seconds:.2f}",
            flush=True,
        )


def measure_both(
    spark: SparkSession, name: str, paths: dict[EventLogFormat, Path], data: Path, runs: int
) -> list[Place]:
    places = [Place(name, log_format) for log_format in paths]
    for place in places:
        measure(spark, place, paths[place.log_format], data, runs)
    return places


async def writer_cost(
    log_format: EventLogFormat, root: Path, slot_s: float, rounds: int, age_s: float
) -> dict:
    """The busy scenario through one notify proxy whose event log is in ``log_format``:
    the writer thread's CPU per event, once the files of the scenario's events are all
    complete (each completion, Parquet's row groups and footer, counted)."""
    config = root / f"proxy-{log_format}.toml"
    config.write_text(
        f'event_log_dir = "{root / log_format.value}"\nevent_log_format = "{log_format}"\n'
        f"event_log_max_age_s = {age_s}\n"
    )
    system = System(brokers=2, modes=("notify",), proxy_args={"notify": ["--config", config]})
    await system.start()
    try:
        proxy = system.proxies["notify"]
        started = time.perf_counter()
        await scenarios.busy(system, rounds=rounds, slot_s=slot_s, rate=1000)
        seconds = time.perf_counter() - started
        deadline = time.monotonic() + age_s + 30
        while True:  # the last file completes within its age
            log = (await status(proxy))["event_log"]
            if log["pending"] == 0 and log["open_files"] == 0:
                break
            assert time.monotonic() < deadline, f"files still open: {log}"
            await asyncio.sleep(0.5)
    finally:
        await system.stop()
    written = log["written"]
    return {
        "format": str(log_format),
        "events": written,
        "events_per_s": round(written / seconds),
        "writer_cpu_ms": log["cpu_ms"],
        "cpu_us_per_event": round(log["cpu_ms"] * 1000 / max(1, written), 2),
        "files": log["files_completed"],
        "bytes_per_event": round(disk_bytes(root / log_format.value, log_format.suffix)
                                 / max(1, written), 1),
    }  # fmt: skip


def profile(
    spark: SparkSession, events: Path, log_format: EventLogFormat, data: Path, rounds: int
) -> list[dict]:
    """The job's steps over ``events`` (in ``log_format``), each round in turn (module
    docstring); median seconds of each."""
    path = str(events)

    def parsed() -> DataFrame:
        return valid_events(read_events(spark, path), Observation())

    def job() -> None:
        out = data / "out-profile"
        shutil.rmtree(out, ignore_errors=True)
        run_batch(spark, JobOptions(events=path, out=str(out)))

    steps = {
        "reference": lambda: reference(spark, events, log_format),
        "read: required fields, malformed counted": lambda: parsed().count(),
        "read + per_proxy (noop sink)": lambda: _noop(per_proxy(parsed(), 60)),
        "read + aggregate (noop sink)": lambda: _noop(aggregate(parsed(), 60)),
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
    p.add_argument("--profile-format", default="parquet", choices=[f.value for f in EventLogFormat])
    p.add_argument("--writer-slot-s", type=float, default=8.0, help="busy scenario slot")
    p.add_argument(
        "--writer-rounds", type=int, default=3, help="busy scenario rounds (0: no writer runs)"
    )
    p.add_argument("--writer-age-s", type=float, default=60.0, help="event-log file age")
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "rmq-bench-analytics"))
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    session = get_session(args.master)
    data = Path(args.data)
    paths = ensure_data(session.spark, args.records, data / f"n{args.records}")
    sizes = {
        str(f): {"mb": round(disk_bytes(path, f.suffix) / 1e6, 1),
                 "bytes_per_record": round(disk_bytes(path, f.suffix) / args.records, 1)}
        for f, path in paths.items()
    }  # fmt: skip
    places = measure_both(session.spark, args.master, paths, data, args.runs)
    steps = []
    if args.profile:
        fmt = EventLogFormat(args.profile_format)
        steps = profile(session.spark, paths[fmt], fmt, data, args.profile)
    session.spark.stop()
    if not args.no_cluster:
        from testkit.spark_cluster import standalone_cluster

        root_dir = Path(tempfile.mkdtemp(prefix="rmq-bench-cluster-"))
        try:
            with standalone_cluster(root_dir, workers=2, worker_memory=CLUSTER_WORKER_MEMORY) as c:
                spark = cluster_session(c.url)
                try:
                    places += measure_both(
                        spark, "standalone, 2 workers x 1 core", paths, data, args.runs
                    )
                finally:
                    spark.stop()
        finally:
            shutil.rmtree(root_dir, ignore_errors=True)

    # Last, with Spark's JVMs gone: the gRPC clients of the scenario leave threads behind
    # that make a later fork (a JVM's launch) fail at random.
    stop_spark_jvm()
    writers = []
    with tempfile.TemporaryDirectory(prefix="rmq-bench-writer-") as root:
        for log_format in EventLogFormat if args.writer_rounds else ():
            cost = run_main(writer_cost(log_format, Path(root), args.writer_slot_s,
                                        args.writer_rounds, args.writer_age_s))  # fmt: skip
            print(f"writer, {log_format}: {cost}", flush=True)
            writers.append(cost)

    print()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"input: {args.records:,} records")
    print("| format | MB on disk | bytes per record |")
    print("|---|---|---|")
    for name, size in sizes.items():
        print(f"| {name} | {size['mb']:,.1f} | {size['bytes_per_record']:.1f} |")
    print("| the proxy's writer | events | events/s | CPU µs per event | bytes per event |")
    print("|---|---|---|---|---|")
    for w in writers:
        print(f"| {w['format']} | {w['events']:,} | {w['events_per_s']:,} |"
              f" {w['cpu_us_per_event']:.2f} | {w['bytes_per_event']:.1f} |")  # fmt: skip
    print("| where | format | run | job s | job records/s | reference s | reference records/s"
          " | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for place in places:
        for run, (lines, seconds, ref) in enumerate(place.runs, 1):
            print(
                f"| {place.name} | {place.log_format} | {run} | {seconds:.1f} |"
                f" {lines / seconds:,.0f} | {ref:.1f} | {lines / ref:,.0f} | {seconds / ref:.2f} |"
            )
    for place in places:
        job, ref = place.best()
        print(
            f"{place.name}, {place.log_format}: best job {job:,.0f} records/s, best reference"
            f" {ref:,.0f} records/s, ratio {ref / job:.2f}"
        )
    print("goals (Parquet): a tenth of the bytes, a writer no costlier, 1,000,000 records/s"
          " on local[2], ratio <= 2")  # fmt: skip
    if steps:
        print(f"| {places[0].name}, {args.profile_format}: step | median s | / reference"
              " | runs s |")  # fmt: skip
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
            "sizes": sizes,
            "writers": writers,
            "places": [
                {
                    "name": place.name,
                    "format": str(place.log_format),
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
