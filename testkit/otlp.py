"""OTLP metric exports as the official RocketMQ clients send them, built from the
``opentelemetry-proto`` messages: for the tests of ``client_metrics.mode = proxy`` and the
exporters' soak (``bench/export_soak.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    ResourceMetrics,
    ScopeMetrics,
)

from proxy.observability.metrics import CLIENT_HISTOGRAMS

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def client_headers(
    language: str = "JAVA", version: str = "5.2.0", client_id: str = "c1"
) -> tuple[tuple[str, str], ...]:
    """The metadata the clients' exporters send (their auth interceptors' headers)."""
    return (
        ("x-mq-language", language),
        ("x-mq-client-version", version),
        ("x-mq-client-id", client_id),
    )


def point(
    counts: Sequence[int],
    total: float = 10.0,
    *,
    name: str = "rocketmq_delivery_latency",
    start_ns: int = 1_000_000_000_000,
    age_s: float = 60.0,
    **attributes: str,
) -> HistogramDataPoint:
    """One data point of histogram ``name`` with its official buckets; ``age_s``: its time
    after its start; ``attributes``: topic, consumer_group, client_id, invocation_status."""
    bounds = CLIENT_HISTOGRAMS[name][1]
    return HistogramDataPoint(
        attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items()],
        start_time_unix_nano=start_ns,
        time_unix_nano=start_ns + int(age_s * 1e9),
        count=sum(counts),
        sum=total,
        bucket_counts=list(counts),
        explicit_bounds=list(bounds),
    )


def export(
    *points: tuple[str, HistogramDataPoint], temporality: int = CUMULATIVE
) -> ExportMetricsServiceRequest:
    """An export of (histogram name, point) pairs, one metric per pair."""
    metrics = [
        Metric(
            name=name,
            histogram=Histogram(data_points=[p], aggregation_temporality=temporality),  # type: ignore[arg-type]
        )
        for name, p in points
    ]
    return ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])]
    )
