"""``rmq-polling-report``: aggregate the proxies' event logs, print a report, optionally
push the latest window to a Pushgateway.

    rmq-polling-report EVENTS_PATH --out PARQUET_PATH [--window 1m] [--date YYYY-MM-DD ...]
        [--pushgateway URL] [--job rmq_polling_report] [--master local[*]]
        [--stream --checkpoint DIR [--once]] [--thresholds-out PATH] [--html PATH]

Runs ``local[*]`` unless ``--master`` says otherwise or spark-submit launched it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from datetime import date
from types import FrameType
from typing import TYPE_CHECKING

from polling_report.durations import check_window, parse_duration
from polling_report.job import DEFAULT_JOB, JobOptions
from polling_report.recommend import DEFAULT_MIN_REQUESTS, DEFAULT_TARGET, write_thresholds

if TYPE_CHECKING:
    from polling_report.model import Summary

log = logging.getLogger("polling_report.cli")


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _window(text: str) -> int:
    try:
        return check_window(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _date(text: str) -> str:
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be in (0, 1]")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rmq-polling-report",
        description="Aggregate the proxies' polling event logs (PySpark), write Parquet "
        "partitioned by date, print a report and recommend the adaptive threshold.",
    )
    p.add_argument("events", metavar="EVENTS_PATH", help="event-log directory (path or URI)")
    p.add_argument("--out", required=True, metavar="PARQUET_PATH", help="aggregates output")
    p.add_argument("--window", type=_window, default=60, help="window length (default 1m)")
    p.add_argument(
        "--date",
        dest="dates",
        type=_date,
        nargs="+",
        action="extend",
        default=[],
        metavar="YYYY-MM-DD",
        help="only these UTC dates (repeatable); a re-run replaces them in the output",
    )
    p.add_argument("--pushgateway", metavar="URL", help="push the latest window here")
    p.add_argument("--job", default=DEFAULT_JOB, help=f"Pushgateway job (default {DEFAULT_JOB})")
    p.add_argument("--master", help="Spark master (default local[*], or spark-submit's)")
    p.add_argument("--stream", action="store_true", help="run as Structured Streaming")
    p.add_argument("--checkpoint", metavar="DIR", help="stream checkpoint (with --stream)")
    p.add_argument(
        "--once",
        action="store_true",
        help="with --stream: process every file there now (availableNow), then stop",
    )
    p.add_argument(
        "--trigger", type=_duration, default=60, help="with --stream: micro-batch interval"
    )
    p.add_argument(
        "--lateness",
        type=_duration,
        default=120,
        help="how late a record may arrive (stream watermark; a window is complete this "
        "long after its end); default 2m",
    )
    p.add_argument(
        "--target-hit-ratio",
        type=_ratio,
        default=DEFAULT_TARGET,
        help=f"first-pop hit ratio the threshold must reach (default {DEFAULT_TARGET})",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=DEFAULT_MIN_REQUESTS,
        help=f"requests needed to recommend (default {DEFAULT_MIN_REQUESTS})",
    )
    p.add_argument(
        "--thresholds-out",
        metavar="PATH",
        help="write the recommended thresholds as the proxies' "
        "receive.adaptive_thresholds_file (JSON, a local path; replaced whole)",
    )
    p.add_argument(
        "--html",
        metavar="PATH",
        help="also write the report as a self-contained HTML page with charts over time "
        "(a local path; replaced whole, after each micro-batch of a stream)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the phases' timings")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.stream and not args.checkpoint:
        parser().error("--stream needs --checkpoint DIR")
    if args.once and not args.stream:
        parser().error("--once goes with --stream")
    _log_to_stderr(logging.INFO if args.verbose else logging.WARNING)
    opts = JobOptions(
        events=args.events,
        out=args.out,
        window_s=args.window,
        dates=tuple(args.dates),
        lateness_s=args.lateness,
        pushgateway=args.pushgateway,
        job=args.job,
        target_hit_ratio=args.target_hit_ratio,
        min_requests=args.min_requests,
        checkpoint=args.checkpoint,
        once=args.once,
        trigger_s=args.trigger,
        html=args.html,
    )
    # Imported here: `--help` and argument errors need no JVM.
    from polling_report.job import run_batch, run_stream
    from polling_report.report import render
    from polling_report.session import get_session

    def publish(summary: Summary) -> None:
        if args.thresholds_out:
            n = write_thresholds(summary.recommendations, args.thresholds_out)
            print(f"wrote {n} adaptive thresholds to {args.thresholds_out}", file=sys.stderr)

    def on_batch(summary: Summary) -> None:
        print(render(summary), flush=True)
        publish(summary)

    session = get_session(args.master)
    try:
        if args.stream:
            stop = _stop_on_signals()
            summary = run_stream(
                session.spark, opts, on_batch=on_batch, should_stop=lambda: stop["requested"]
            )
        else:
            summary = run_batch(session.spark, opts)
            publish(summary)
    except Exception as exc:  # any failure: say what failed, exit non-zero
        log.exception("failed: %s", exc)
        return 1
    finally:
        if session.owned:
            session.spark.stop()
    sys.stdout.write(render(summary))
    return 0


def _log_to_stderr(level: int) -> None:
    """The job's own log lines on stderr, whatever PySpark did to the root logger. (Under
    spark-submit the JVM merges the driver's stderr into stdout, so timings stay off unless
    asked for with --verbose.)"""
    logger = logging.getLogger("polling_report")
    if not any(getattr(h, "_rmq_report", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler._rmq_report = True  # type: ignore[attr-defined]  # our marker, read by getattr
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def _stop_on_signals() -> dict[str, bool]:
    """SIGINT/SIGTERM end a running stream after its current micro-batch."""
    flag = {"requested": False}

    def request(signum: int, frame: FrameType | None) -> None:
        flag["requested"] = True

    signal.signal(signal.SIGINT, request)
    signal.signal(signal.SIGTERM, request)
    return flag


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
