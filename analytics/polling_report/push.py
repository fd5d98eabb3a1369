"""Pushing the latest complete window to a Prometheus Pushgateway for Grafana (the newest
window while none is complete yet, e.g. right after a proxy started logging).

The metric names and labels are the contract with the dashboards (grouping key ``job``
only; ``push_to_gateway`` replaces every metric of the job, so series of a group that went
quiet disappear instead of going stale).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from polling_report.model import Summary
from polling_report.schema import WAIT_COLUMNS

PREFIX = "rocketmq_polling_report_"
ROW_LABELS = ("proxy", "group", "topic", "mode")
PUSH_TIMEOUT_S = 10.0


def build_registry(summary: Summary) -> CollectorRegistry:
    """The gauges of ``summary``; a series without a value (no messages delivered, no
    window) is left out rather than given NaN."""
    registry = CollectorRegistry()

    def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        return Gauge(PREFIX + name, doc, labels, registry=registry)

    requests = gauge("requests", "Requests in the window", ROW_LABELS)
    rate = gauge("request_rate", "Requests per second in the window", ROW_LABELS)
    long_share = gauge("long_poll_share", "Share of requests that were long polls", ROW_LABELS)
    hit_ratio = gauge(
        "short_poll_hit_ratio", "Share of requests whose first pop found messages", ROW_LABELS
    )
    found = gauge("found_ratio", "Share of requests answered with messages", ROW_LABELS)
    per_message = gauge(
        "broker_requests_per_message",
        "Broker requests (pops + notifications) per delivered message",
        ROW_LABELS,
    )
    wait = gauge("wait_seconds", "Wait time quantiles", (*ROW_LABELS, "quantile"))
    for row in summary.latest:
        labels = (row.proxy, row.group, row.topic, row.mode)
        requests.labels(*labels).set(row.requests)
        rate.labels(*labels).set(row.request_rate)
        long_share.labels(*labels).set(row.long_poll_share)
        hit_ratio.labels(*labels).set(row.short_poll_hit_ratio)
        found.labels(*labels).set(row.found_ratio)
        if row.broker_requests_per_message is not None:
            per_message.labels(*labels).set(row.broker_requests_per_message)
        for quantile, column in WAIT_COLUMNS.items():
            wait.labels(*labels, quantile).set(getattr(row, column) / 1000)

    threshold = gauge(
        "recommended_threshold_rps",
        "Recommended adaptive threshold (receive requests per second per proxy)",
        ("group", "topic"),
    )
    for rec in summary.recommendations:
        threshold.labels(rec.group, rec.topic).set(rec.threshold_rps)

    end = summary.latest_window_end
    if end is not None:
        gauge("window_end_timestamp_seconds", "End of the pushed window").set(end.timestamp())
    gauge("malformed_lines", "Lines that did not parse in this run").set(summary.malformed)
    gauge("records", "Records read in this run").set(summary.records)
    return registry


def push(gateway: str, job: str, summary: Summary) -> None:
    """Replace the job's metrics on ``gateway`` (host:port or URL) with ``summary``'s."""
    push_to_gateway(gateway, job=job, registry=build_registry(summary), timeout=PUSH_TIMEOUT_S)
