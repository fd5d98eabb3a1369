"""The official clients' own histograms, from their OTLP exports into the proxy's /metrics.

A client (Python 5.1.2, Java 5.2.0) told ``Metric(on=True)`` exports four histograms once a
minute, in milliseconds, with the attributes ``topic``, ``consumer_group``, ``client_id``
and ``invocation_status``; its language and version come in the call's metadata
(``x-mq-language``, ``x-mq-client-version``). ``ClientMetricsIngest`` adds what each
export adds to ``ProxyMetrics``' histograms of the same names, labelled by group, topic,
language, version and status: never by client id, and at most ``max_label_sets`` label sets
per worker (past it, new ones are dropped and counted).

Both clients export cumulative totals: each export carries everything since the series
began. The worker remembers the last totals of each client's series (at most
``max_client_series``, the least recently updated forgotten first) and adds the difference.
A series this worker has not seen yet is added whole when it is young (its start less than
``FIRST_EXPORT_S`` before its time: a client's first export) or when its client was seen
here before (a new topic or group of a known client); else it is the baseline, added as
nothing: a client whose connection moved to another worker, or that outlived a proxy
restart, would otherwise count its whole history twice. What that costs is at most the
one interval before the move. Delta exports are added as they are.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, HistogramDataPoint

from proxy.observability.metrics import CLIENT_HISTOGRAMS, ProxyMetrics

# A client's first export comes one interval (60 s) after its series began, or at its
# shutdown before that; a series first seen here older than this is a baseline.
FIRST_EXPORT_S = 90.0
# Series and clients not updated for this long are forgotten (clients export every 60 s).
FORGET_AFTER_S = 600.0
FORGET_EVERY_S = 60.0
# Label values longer than this are cut (a topic or group name is at most 127 characters).
MAX_LABEL_CHARS = 255
_STATUSES = frozenset(("success", "failure"))

# The reasons of rocketmq_proxy_client_metrics_dropped_total.
LABEL_LIMIT = "label_limit"  # a new label set past client_metrics.max_label_sets
MALFORMED = "malformed"  # a data point that is not a histogram one can add up
SERIES_EVICTED = "series_evicted"  # a client's series forgotten at max_client_series


class BadExport(Exception):
    """An export that is not an OTLP metrics request at all (the whole call fails)."""


@dataclass
class _Series:
    """A client's series as last exported: cumulative totals."""

    start: int
    counts: list[int]
    total: float
    seen: float


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
    """Exports in, histogram increments out. ``ingest`` runs in a worker thread (parsing
    and walking a large export takes milliseconds); a lock keeps its state consistent."""

    def __init__(
        self,
        metrics: ProxyMetrics,
        *,
        max_label_sets: int,
        max_client_series: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.max_label_sets = max_label_sets
        self.max_client_series = max_client_series
        self._clock = clock
        self._lock = threading.Lock()
        self._label_sets: set[tuple[str, ...]] = set()
        self._series: OrderedDict[tuple[object, ...], _Series] = OrderedDict()
        self._clients: OrderedDict[str, float] = OrderedDict()
        self._forgot_at = self._clock()

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
        header_client = headers.get("x-mq-client-id", "")
        with self._lock:
            now = self._clock()
            self._forget(now)
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
                            self._point(
                                metric.name, temporality, point,
                                language, version, header_client, now, tally,
                            )  # fmt: skip
        if tally.rejected:
            self.metrics.client_dropped(MALFORMED, tally.rejected)
        return tally

    def _point(
        self,
        name: str,
        temporality: int,
        point: HistogramDataPoint,
        language: str,
        version: str,
        header_client: str,
        now: float,
        tally: Tally,
    ) -> None:
        bounds = tuple(point.explicit_bounds)
        counts = list(point.bucket_counts)
        if len(counts) != len(bounds) + 1:
            tally.reject(f"{name}: {len(counts)} bucket counts for {len(bounds)} bounds")
            return
        if any(not math.isfinite(b) for b in bounds) or any(
            a >= b for a, b in itertools.pairwise(bounds)
        ):
            tally.reject(f"{name}: bounds not finite and increasing")
            return
        total = point.sum if point.HasField("sum") else 0.0
        if not math.isfinite(total) or total < 0:
            tally.reject(f"{name}: sum {total} is not a finite duration")
            return
        attributes = {a.key: a.value.string_value for a in point.attributes}
        client = attributes.get("client_id") or header_client
        if temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA:
            added, added_total = counts, total
        elif temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE:
            key = (client, name, bounds, *sorted(attributes.items()))
            added, added_total = self._difference(key, client, point, counts, total, now)
        else:
            tally.reject(f"{name}: temporality {temporality} is neither delta nor cumulative")
            return
        if not any(added):
            return
        status = attributes.get("invocation_status", "")
        labels = (
            _cut(attributes.get("consumer_group", "")),
            _cut(attributes.get("topic", "")),
            language,
            version,
            status if status in _STATUSES else "",
        )
        label_set = (name, *labels)
        if label_set not in self._label_sets:
            if len(self._label_sets) >= self.max_label_sets:
                self.metrics.client_dropped(LABEL_LIMIT)
                return
            self._label_sets.add(label_set)
        self.metrics.client_histogram(name, labels, _rebucket(name, bounds, added), added_total)
        tally.added += 1

    def _difference(
        self,
        key: tuple[object, ...],
        client: str,
        point: HistogramDataPoint,
        counts: list[int],
        total: float,
        now: float,
    ) -> tuple[list[int], float]:
        """What a cumulative point adds to what this worker added of its series before."""
        series = self._series.get(key)
        known_client = client in self._clients
        if client:
            self._clients[client] = now
            self._clients.move_to_end(client)
            while len(self._clients) > self.max_client_series:
                self._clients.popitem(last=False)
        if (
            series is not None
            and series.start == point.start_time_unix_nano
            and all(n >= before for n, before in zip(counts, series.counts, strict=True))
        ):
            added = [n - before for n, before in zip(counts, series.counts, strict=True)]
            added_total = max(total - series.total, 0.0)
        elif series is not None or known_client:
            added, added_total = counts, total  # restarted, or new to a known client
        else:
            age_s = (point.time_unix_nano - point.start_time_unix_nano) / 1e9
            young = point.start_time_unix_nano > 0 and 0 <= age_s <= FIRST_EXPORT_S
            added, added_total = (counts, total) if young else ([0] * len(counts), 0.0)
        self._series[key] = _Series(point.start_time_unix_nano, counts, total, now)
        self._series.move_to_end(key)
        while len(self._series) > self.max_client_series:
            self._series.popitem(last=False)
            self.metrics.client_dropped(SERIES_EVICTED)
        return added, added_total

    def _forget(self, now: float) -> None:
        """Drop series and clients that stopped exporting (at most once a minute)."""
        if now - self._forgot_at < FORGET_EVERY_S:
            return
        self._forgot_at = now
        stale = now - FORGET_AFTER_S
        while self._series and next(iter(self._series.values())).seen < stale:
            self._series.popitem(last=False)
        while self._clients and next(iter(self._clients.values())) < stale:
            self._clients.popitem(last=False)

    @property
    def label_sets(self) -> int:
        return len(self._label_sets)


def _rebucket(name: str, bounds: tuple[float, ...], counts: list[int]) -> list[int]:
    """A client's bucket counts in the proxy's buckets of ``name``: each of the client's
    buckets goes to the proxy's first bucket whose bound is at least its own (exact for
    the official clients' bounds, which are the proxy's; never below the true value)."""
    ours = CLIENT_HISTOGRAMS[name][1]
    if bounds == ours:
        return counts
    out = [0] * (len(ours) + 1)
    for i, n in enumerate(counts):
        j = bisect.bisect_left(ours, bounds[i]) if i < len(bounds) else len(ours)
        out[j] += n
    return out


def _cut(value: str) -> str:
    return value[:MAX_LABEL_CHARS]
