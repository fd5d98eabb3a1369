"""ProxyMetrics: exact names, types, labels and values, read back from the exposition text."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from proxy.observability.client_totals import ClientHistograms
from proxy.observability.metrics import OTHER_LABEL, ProxyMetrics
from testkit.metrics_text import samples as metric_samples


def families(m: ProxyMetrics) -> dict[str, Metric]:
    """The families on /metrics; a counter child's ``<name>_created`` timestamp, which the
    0.0.4 text format writes as a gauge family of its own, is the counter's."""
    body, content_type = m.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return {
        name: f
        for name, f in fams.items()
        if not (name.endswith("_created") and name.removesuffix("_created") in fams)
    }


def samples(m: ProxyMetrics, sample_name: str) -> dict[frozenset, float]:
    """Every sample called ``sample_name``, keyed by its label set."""
    return {frozenset(lbl.items()): v for lbl, v in metric_samples(m.render()[0], sample_name)}


def labels(**kw: str) -> frozenset:
    return frozenset(kw.items())


def test_families_have_the_contract_names_and_types():
    m = ProxyMetrics(version="9.9.9")
    # The clients' histograms, which the OTLP service registers in client_metrics.mode proxy.
    m.registry.register(ClientHistograms(lambda: []))
    fams = families(m)
    expected = {
        "rocketmq_proxy_receive": "counter",
        "rocketmq_proxy_receive_wait_seconds": "histogram",
        "rocketmq_proxy_rpc_latency_seconds": "histogram",
        "rocketmq_proxy_notifications": "counter",
        "rocketmq_proxy_long_polls_in_flight": "gauge",
        "rocketmq_proxy_mode_switches": "counter",
        "rocketmq_proxy_nacks": "counter",
        "rocketmq_proxy_send_messages": "counter",
        "rocketmq_proxy_long_polls_limit": "gauge",
        "rocketmq_proxy_ready": "gauge",
        "rocketmq_proxy_build_info": "gauge",
        "rocketmq_proxy_gc_pause_seconds": "histogram",
        # The official clients' own metrics (client_metrics.mode = proxy), by their names.
        "rocketmq_send_cost_time": "histogram",
        "rocketmq_delivery_latency": "histogram",
        "rocketmq_await_time": "histogram",
        "rocketmq_process_time": "histogram",
        "rocketmq_proxy_client_metrics_exports": "counter",
        "rocketmq_proxy_client_metrics_dropped": "counter",
        "rocketmq_proxy_front_connections": "counter",
        "rocketmq_proxy_client_registrations_refused": "counter",
        "rocketmq_proxy_transaction_checks": "counter",
        "rocketmq_proxy_consumer_lag_messages": "gauge",
        "rocketmq_proxy_consumer_lag_oldest_seconds": "gauge",
    }
    assert {name: fams[name].type for name in expected} == expected
    assert set(fams) == set(expected)
    assert samples(m, "rocketmq_proxy_build_info") == {labels(version="9.9.9"): 1.0}
    assert samples(m, "rocketmq_proxy_ready") == {frozenset(): 0.0}


def test_gc_pauses_are_timed_by_generation_until_undone():
    m = ProxyMetrics()
    undo = m.watch_gc()
    try:
        gc.collect()  # a full collection
        gc.collect(0)
    finally:
        undo()
    assert samples(m, "rocketmq_proxy_gc_pause_seconds_count") == {}  # timed, not yet observed
    m.flush_gc_pauses()
    counts = samples(m, "rocketmq_proxy_gc_pause_seconds_count")
    assert counts[labels(generation="2")] >= 1
    assert counts[labels(generation="0")] >= 1
    gc.collect()
    m.flush_gc_pauses()
    assert samples(m, "rocketmq_proxy_gc_pause_seconds_count") == counts  # no longer timed


def test_registries_are_private():
    # Two instances in one process: a global registry would raise "Duplicated timeseries".
    a, b = ProxyMetrics(), ProxyMetrics()
    a.handed_back("client_gone")
    assert samples(a, "rocketmq_proxy_nacks_total") == {labels(reason="client_gone"): 1.0}
    assert samples(b, "rocketmq_proxy_nacks_total") == {}


def test_receive_done_counts_and_observes_wait():
    m = ProxyMetrics()
    m.receive_done("G", "T", "notify", True, False, "found", 0.3)
    m.receive_done("G", "T", "notify", True, False, "found", 0.0004)
    m.receive_done("G", "T", "coupled", False, True, "empty", 31.0)
    assert samples(m, "rocketmq_proxy_receive_total") == {
        labels(
            group="G", topic="T", mode="notify", is_long_polling="true",
            is_short_polling_hit="false", result="found",
        ): 2.0,
        labels(
            group="G", topic="T", mode="coupled", is_long_polling="false",
            is_short_polling_hit="true", result="empty",
        ): 1.0,
    }  # fmt: skip
    buckets = samples(m, "rocketmq_proxy_receive_wait_seconds_bucket")
    les = sorted({dict(k)["le"] for k in buckets}, key=float)
    assert les == [
        "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
        "1.0", "2.5", "5.0", "10.0", "15.0", "20.0", "25.0", "30.0", "+Inf",
    ]  # fmt: skip

    def bucket(mode: str, result: str, le: str) -> float:
        return buckets[labels(mode=mode, result=result, le=le)]

    assert bucket("notify", "found", "0.001") == 1.0  # 0.4 ms
    assert bucket("notify", "found", "0.25") == 1.0
    assert bucket("notify", "found", "0.5") == 2.0  # 300 ms
    assert bucket("notify", "found", "+Inf") == 2.0
    assert bucket("coupled", "empty", "30.0") == 0.0  # 31 s only in +Inf
    assert bucket("coupled", "empty", "+Inf") == 1.0
    counts = samples(m, "rocketmq_proxy_receive_wait_seconds_count")
    assert counts == {labels(mode="notify", result="found"): 2.0,
                      labels(mode="coupled", result="empty"): 1.0}  # fmt: skip
    sums = samples(m, "rocketmq_proxy_receive_wait_seconds_sum")
    assert abs(sums[labels(mode="notify", result="found")] - 0.3004) < 1e-9


def test_rpc_latency():
    m = ProxyMetrics()
    m.rpc("grpc", "receive_message", "OK", 0.0003)
    m.rpc("remoting", "pop_message", 0, 0.004, broker="broker-a", is_long_polling=True)
    m.rpc("remoting", "pop_message", 0, 0.004, broker="broker-a", is_long_polling=True)
    buckets = samples(m, "rocketmq_proxy_rpc_latency_seconds_bucket")
    grpc = dict(
        protocol_type="grpc", request_code="receive_message", response_code="OK",
        broker="", is_long_polling="false",
    )  # fmt: skip
    remoting = dict(
        protocol_type="remoting", request_code="pop_message", response_code="0",
        broker="broker-a", is_long_polling="true",
    )  # fmt: skip
    assert len({dict(k)["le"] for k in buckets}) == 17  # 16 bounds and +Inf
    assert buckets[labels(**grpc, le="0.0005")] == 1.0
    assert buckets[labels(**remoting, le="0.0025")] == 0.0
    assert buckets[labels(**remoting, le="0.005")] == 2.0
    assert buckets[labels(**remoting, le="30.0")] == 2.0
    assert samples(m, "rocketmq_proxy_rpc_latency_seconds_count") == {
        labels(**grpc): 1.0,
        labels(**remoting): 2.0,
    }


def test_notifications_long_polls_switches_nacks_sends():
    m = ProxyMetrics()
    m.probe_answered("broker-a", "true")
    m.probe_answered("broker-a", True)  # a bool is spelled the same way
    m.probe_answered("broker-b", "false")
    m.probe_answered("broker-b", "error")
    assert samples(m, "rocketmq_proxy_notifications_total") == {
        labels(broker="broker-a", has_msg="true"): 2.0,
        labels(broker="broker-b", has_msg="false"): 1.0,
        labels(broker="broker-b", has_msg="error"): 1.0,
    }

    m.long_poll_started("notify")
    m.long_poll_started("notify")
    m.long_poll_started("coupled")
    m.long_poll_finished("notify")
    assert samples(m, "rocketmq_proxy_long_polls_in_flight") == {
        labels(mode="notify"): 1.0,
        labels(mode="coupled"): 1.0,
    }

    m.mode_switch("G", "T", "coupled")
    m.mode_switch("G", "T", "notify")
    m.mode_switch("G", "T", "coupled")
    assert samples(m, "rocketmq_proxy_mode_switches_total") == {
        labels(group="G", topic="T", to="coupled"): 2.0,
        labels(group="G", topic="T", to="notify"): 1.0,
    }

    m.handed_back("client_gone", 3)
    m.handed_back("deadline")
    assert samples(m, "rocketmq_proxy_nacks_total") == {
        labels(reason="client_gone"): 3.0,
        labels(reason="deadline"): 1.0,
    }

    m.sent("T", "ok", 5)
    m.sent("T", "error")
    assert samples(m, "rocketmq_proxy_send_messages_total") == {
        labels(topic="T", result="ok"): 5.0,
        labels(topic="T", result="error"): 1.0,
    }


def test_process_gauges():
    m = ProxyMetrics()
    m.set_long_poll_limit(5000)
    m.set_ready(True)
    assert samples(m, "rocketmq_proxy_long_polls_limit") == {frozenset(): 5000.0}
    assert samples(m, "rocketmq_proxy_ready") == {frozenset(): 1.0}
    m.set_ready(False)
    assert samples(m, "rocketmq_proxy_ready") == {frozenset(): 0.0}


def test_openmetrics_on_request():
    m = ProxyMetrics()
    m.receive_done("G", "T", "notify", True, True, "found", 0.01)
    body, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert b"rocketmq_proxy_receive_total{" in body
    assert body.endswith(b"# EOF\n")


GC_UNDER_THE_LOCK = """
import gc
from proxy.observability.metrics import ProxyMetrics
m = ProxyMetrics()
undo = m.watch_gc()
gc.set_threshold(1, 1000, 10**6)  # a young collection at nearly every allocation
for i in range(1000):
    m.handed_back(f"reason-{i % 300}")  # new children: prometheus-client allocates under its lock
    if i % 100 == 0:
        m.flush_gc_pauses()
undo()
m.flush_gc_pauses()
print("done")
"""


def test_timing_collections_cannot_deadlock_prometheus_clients_lock(tmp_path):
    # In multiprocess mode (workers) prometheus-client updates values under one module-wide
    # Lock, and a collection can start while it is held: a gc callback that observed the
    # histogram there hung a worker for good. The callback now only queues the pause.
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", GC_UNDER_THE_LOCK], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"


def test_the_group_shows_the_live_workers_lag_sets_merged_and_forgets_the_dead(tmp_path):
    """Workers' lag gauges, as the supervisor reads them: one set per worker pid, the
    maximum where two have the pair; a worker that is not alive is skipped, a reaped one's
    file removed (its pairs leave the group's /metrics with it)."""
    import json

    from proxy.observability.live_gauges import file_of
    from proxy.observability.metrics import CONSUMER_LAG, GroupMetrics

    def publish(pid: int, pairs: dict[tuple[str, str], float]) -> None:
        series = [[list(pair), value] for pair, value in pairs.items()]
        with open(file_of(str(tmp_path), pid), "w") as fh:
            json.dump({CONSUMER_LAG.name: series}, fh)

    group = GroupMetrics(str(tmp_path))
    group._live._alive = lambda pid: pid != 3
    publish(1, {("G", "T"): 7, ("H", "T"): 1})
    publish(2, {("G", "T"): 9})
    publish(3, {("D", "T"): 5})  # dead, not yet reaped

    def lag() -> dict[frozenset, float]:
        found = metric_samples(group.render()[0], CONSUMER_LAG.name)
        return {frozenset(lbl.items()): v for lbl, v in found}

    assert lag() == {labels(group="G", topic="T"): 9.0, labels(group="H", topic="T"): 1.0}
    group.mark_dead(2)
    assert not os.path.exists(file_of(str(tmp_path), 2))
    assert lag() == {labels(group="G", topic="T"): 7.0, labels(group="H", topic="T"): 1.0}
    publish(1, {})  # its consumers left
    assert lag() == {}


def test_a_workers_lag_set_is_published_whole_and_without_what_left(tmp_path):
    from proxy.observability.live_gauges import GroupLiveGauges
    from proxy.observability.metrics import LIVE_GAUGES

    worker = ProxyMetrics(directory=str(tmp_path))
    group = GroupLiveGauges(LIVE_GAUGES, str(tmp_path))

    def seen() -> dict[str, dict[tuple[str, ...], float]]:
        return {m.name: {tuple(s.labels.values()): s.value for s in m.samples}
                for m in group.collect()}  # fmt: skip

    worker.set_consumer_lag("G", "T", 4, 1.5)
    worker.set_consumer_lag("H", "T", 0, 0.0)
    assert seen()["rocketmq_proxy_consumer_lag_messages"] == {}  # not published yet
    worker.publish_live_gauges()
    assert seen() == {
        "rocketmq_proxy_consumer_lag_messages": {("G", "T"): 4.0, ("H", "T"): 0.0},
        "rocketmq_proxy_consumer_lag_oldest_seconds": {("G", "T"): 1.5, ("H", "T"): 0.0},
    }
    worker.forget_consumer_lag("G", "T")
    worker.publish_live_gauges()
    assert seen()["rocketmq_proxy_consumer_lag_messages"] == {("H", "T"): 0.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"live-gauges_{os.getpid()}.json"]


def test_past_the_cap_new_group_topic_pairs_are_counted_as_other():
    m = ProxyMetrics()
    m._pairs.limit = 3  # MAX_LABELLED_PAIRS, made small
    for i in range(10):
        m.receive_done(f"g{i}", "t", "notify", True, False, "empty", 0.01)
    m.receive_done("g0", "t", "notify", True, False, "empty", 0.01)  # admitted before
    counted = samples(m, "rocketmq_proxy_receive_total")
    groups = {dict(k)["group"]: v for k, v in counted.items()}
    assert groups == {"g0": 2.0, "g1": 1.0, "g2": 1.0, OTHER_LABEL: 7.0}
    assert m._pairs.overflowed == 7


def test_fixed_label_sets_start_at_zero_and_match_their_enums():
    from proxy.observability.metrics import REGISTRATION_REFUSALS, TRANSACTION_CHECK_RESULTS
    from proxy.processor.registrations import Refusal
    from proxy.processor.transaction import CheckOutcome

    assert set(TRANSACTION_CHECK_RESULTS) == {o.value for o in CheckOutcome}
    assert set(REGISTRATION_REFUSALS) == {r.value for r in Refusal}
    m = ProxyMetrics()
    checks = samples(m, "rocketmq_proxy_transaction_checks_total")
    assert checks == {frozenset({("result", r)}): 0.0 for r in TRANSACTION_CHECK_RESULTS}
    refused = samples(m, "rocketmq_proxy_client_registrations_refused_total")
    assert refused == {frozenset({("reason", r)}): 0.0 for r in REGISTRATION_REFUSALS}
