"""The official clients' own histograms, from their OTLP exports into the proxy's /metrics.

A client (Python 5.1.2, Java 5.2.0) told ``Metric(on=True)`` exports four histograms once a
minute, in milliseconds, with the attributes ``topic``, ``consumer_group``, ``client_id``
and ``invocation_status``; its language and version come in the call's metadata
(``x-mq-language``, ``x-mq-client-version``). ``ClientMetricsIngest`` checks each data
point and hands the export to ``ClientTotals`` (client_totals.py), which adds what it adds
to the histograms of the same names, labelled by group, topic, language, version and
status: never by client id.

One export is one client's: its points are taken for the client the first of them names
(the ``client_id`` attribute, else the ``x-mq-client-id`` header), and a point naming
another is rejected. With the per-client series limit, that bounds what one export, and
one client, can add.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, HistogramDataPoint

from proxy.observability.client_totals import ClientTotals, Outcome, SeriesPoint
from proxy.observability.metrics import CLIENT_HISTOGRAMS, ProxyMetrics

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
MALFORMED = "malformed"  # a reason of rocketmq_proxy_client_metrics_dropped_total
# Label values longer than this are cut (a topic or group name is at most 127 characters).
MAX_LABEL_CHARS = 255
_STATUSES = frozenset(("success", "failure"))


class BadExport(Exception):
    """An export that is not an OTLP metrics request at all (the whole call fails)."""


@dataclass
class Tally:
    """What one export did: data points added, and those rejected as malformed."""

    added: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)

    def reject(self, why: str) -> None:
        self.rejected += 1
        if len(self.errors) < 3:
            self.errors.append(why)


class ClientMetricsIngest:
    """Exports in, checked points out to ``totals``. ``ingest`` runs in a worker thread
    (parsing and walking a large export takes milliseconds)."""

    def __init__(self, metrics: ProxyMetrics, totals: ClientTotals) -> None:
        self.metrics = metrics
        self.totals = totals

    def ingest_bytes(self, raw: bytes, headers: Mapping[str, str]) -> Tally:
        """Parse an export and add it; ``BadExport`` if it does not parse."""
        try:
            request = ExportMetricsServiceRequest.FromString(raw)
        except Exception as exc:  # DecodeError, or a RuntimeError from upb on deep nesting
            raise BadExport(f"not an OTLP ExportMetricsServiceRequest: {exc}") from None
        return self.ingest(request, headers)

    def ingest(self, request: ExportMetricsServiceRequest, headers: Mapping[str, str]) -> Tally:
        tally = Tally()
        language = _cut(headers.get("x-mq-language", ""))
        version = _cut(headers.get("x-mq-client-version", ""))
        client: str | None = None
        points: list[SeriesPoint] = []
        for name, temporality, point in _data_points(request, tally):
            checked = _check(name, temporality, point, language, version, tally)
            if checked is None:
                continue
            named, series = checked
            owner = named or headers.get("x-mq-client-id", "")
            if client is None:
                client = owner
            if owner != client:
                tally.reject(f"{name}: client {owner!r} in an export of client {client!r}")
                continue
            points.append(series)
        if points:
            for outcome in self.totals.add(client or "", points):
                if outcome is Outcome.ADDED:
                    tally.added += 1
                elif outcome is Outcome.MALFORMED:
                    tally.reject("cumulative counts went down within a series")
                elif outcome is not Outcome.STALE:
                    self.metrics.client_dropped(outcome.value)
        if tally.rejected:
            self.metrics.client_dropped(MALFORMED, tally.rejected)
        return tally


def _data_points(
    request: ExportMetricsServiceRequest, tally: Tally
) -> Iterator[tuple[str, int, HistogramDataPoint]]:
    """The data points of the four client histograms, with their histogram's name and
    temporality; other metrics are skipped, and one of those names that is not a
    histogram is rejected."""
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in CLIENT_HISTOGRAMS:
                    continue  # the Java client's gauges, another exporter's metrics
                if metric.WhichOneof("data") != "histogram":
                    tally.reject(f"{metric.name} is not a histogram")
                    continue
                temporality = metric.histogram.aggregation_temporality
                for point in metric.histogram.data_points:
                    yield metric.name, temporality, point


def _check(
    name: str,
    temporality: int,
    point: HistogramDataPoint,
    language: str,
    version: str,
    tally: Tally,
) -> tuple[str, SeriesPoint] | None:
    """The point as a ``SeriesPoint``, with the client it names; None if malformed."""
    bounds = tuple(point.explicit_bounds)
    counts = tuple(point.bucket_counts)
    if len(counts) != len(bounds) + 1:
        tally.reject(f"{name}: {len(counts)} bucket counts for {len(bounds)} bounds")
        return None
    if any(not math.isfinite(b) for b in bounds) or any(
        a >= b for a, b in itertools.pairwise(bounds)
    ):
        tally.reject(f"{name}: bounds not finite and increasing")
        return None
    total = point.sum if point.HasField("sum") else 0.0
    if not math.isfinite(total) or total < 0:
        tally.reject(f"{name}: sum {total} is not a finite duration")
        return None
    if temporality not in (CUMULATIVE, DELTA):
        tally.reject(f"{name}: temporality {temporality} is neither delta nor cumulative")
        return None
    attributes = {a.key: a.value.string_value for a in point.attributes}
    status = attributes.get("invocation_status", "")
    labels = (
        _cut(attributes.get("consumer_group", "")),
        _cut(attributes.get("topic", "")),
        language,
        version,
        status if status in _STATUSES else "",
    )
    key = repr((name, bounds, sorted(attributes.items())))
    series = SeriesPoint(
        key, name, labels, bounds, point.start_time_unix_nano, point.time_unix_nano,
        counts, total, cumulative=temporality == CUMULATIVE,
    )  # fmt: skip
    return attributes.get("client_id", ""), series


def _cut(value: str) -> str:
    """A label value as kept: at most MAX_LABEL_CHARS, without control characters."""
    value = value[:MAX_LABEL_CHARS]
    return value if value.isprintable() else "".join(c for c in value if c.isprintable())
