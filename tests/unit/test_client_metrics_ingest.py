"""``ClientMetricsIngest``: cumulative exports added up once, whatever the order in which a
worker sees a client's series; other bounds put in the proxy's buckets; stale state
forgotten and the series bound kept."""

from __future__ import annotations

from proxy.observability import client_metrics as cm
from proxy.observability.metrics import ProxyMetrics
from tests.support.otlp import export, point

HEADERS = {"x-mq-language": "JAVA", "x-mq-client-version": "5.2.0"}
NAME = "rocketmq_delivery_latency"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ingest(**kw) -> tuple[cm.ClientMetricsIngest, ProxyMetrics, Clock]:
    metrics = ProxyMetrics(version="test")
    clock = Clock()
    limits = {"max_label_sets": 100, "max_client_series": 100, **kw}
    return cm.ClientMetricsIngest(metrics, clock=clock, **limits), metrics, clock


def count(metrics: ProxyMetrics, group: str = "G", suffix: str = "_count", **labels) -> float:
    value = metrics.registry.get_sample_value(
        NAME + suffix,
        {"group": group, "topic": "T", "client_language": "JAVA", "client_version": "5.2.0",
         "invocation_status": "", **labels},
    )  # fmt: skip
    return value or 0.0


def sent(ingest_: cm.ClientMetricsIngest, counts, *, client="c1", start_ns=10**12, age_s=60.0):
    p = point(counts, start_ns=start_ns, age_s=age_s, consumer_group="G", topic="T",
              client_id=client)  # fmt: skip
    return ingest_.ingest(export((NAME, p)), HEADERS)


def test_a_restarted_series_counts_whole_and_a_repeat_counts_nothing():
    ing, metrics, _ = ingest()
    sent(ing, [1, 0, 0, 0, 0, 0, 0, 0])
    sent(ing, [1, 0, 0, 0, 0, 0, 0, 0], age_s=120)  # nothing new
    assert count(metrics) == 1
    sent(ing, [2, 0, 0, 0, 0, 0, 0, 0], start_ns=2 * 10**12)  # the client restarted
    assert count(metrics) == 3


def test_a_known_clients_new_series_counts_whole_even_when_old():
    """The Java client's series all start with its meter: a topic it sends to an hour
    later is new, not a client that moved here."""
    ing, metrics, _ = ingest()
    sent(ing, [1, 0, 0, 0, 0, 0, 0, 0])
    p = point([0, 3, 0, 0, 0, 0, 0, 0], age_s=3600, consumer_group="G2", topic="T",
              client_id="c1")  # fmt: skip
    ing.ingest(export((NAME, p)), HEADERS)
    assert count(metrics, "G2") == 3


def test_other_bounds_land_in_the_first_proxy_bucket_at_least_as_high():
    assert cm._rebucket(NAME, (3.0, 100.0), [1, 2, 4]) == [0, 1, 0, 0, 0, 2, 0, 4]
    assert cm._rebucket(NAME, (), [5]) == [0, 0, 0, 0, 0, 0, 0, 5]


def test_state_is_forgotten_and_bounded():
    ing, metrics, clock = ingest(max_client_series=2)
    for client in ("a", "b", "c"):
        sent(ing, [1, 0, 0, 0, 0, 0, 0, 0], client=client)
    assert len(ing._series) == 2
    dropped = metrics.registry.get_sample_value(
        "rocketmq_proxy_client_metrics_dropped_total", {"reason": "series_evicted"}
    )
    assert dropped == 1
    clock.now += cm.FORGET_AFTER_S + cm.FORGET_EVERY_S
    ing.ingest(export(), HEADERS)
    assert not ing._series and not ing._clients


def test_malformed_points_are_rejected_with_reasons():
    ing, _, _ = ingest()
    bad = [
        point([1, 2]),  # counts for other bounds
        point([1, 0, 0, 0, 0, 0, 0, 0], float("nan")),
        point([1, 0, 0, 0, 0, 0, 0, 0], -1.0),
    ]
    tally = ing.ingest(export(*((NAME, p) for p in bad)), HEADERS)
    assert (tally.added, tally.rejected) == (0, 3)
    assert len(tally.errors) == 3
