"""``rmq-polling-report`` end to end on a crafted log: exit code, printed report, and the
gauges a real Pushgateway holds afterwards (the contract with the Grafana dashboards)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from polling_report.cli import main
from proxy.receive.thresholds import parse
from tests.analytics._events import event, write_log
from tests.analytics.conftest import pushed
from tests.analytics.test_batch import MALFORMED, crafted_log

pytestmark = pytest.mark.slow

P = "rocketmq_polling_report_"


def key(name: str, **labels) -> tuple[str, frozenset]:
    return (P + name, frozenset(labels.items()))


def row_gauges(proxy, group, topic, mode, requests, long_share, hits, found, per_msg, wait_s):
    labels = dict(proxy=proxy, group=group, topic=topic, mode=mode)
    gauges = {
        key("requests", **labels): requests,
        key("request_rate", **labels): requests / 60,
        key("long_poll_share", **labels): long_share,
        key("short_poll_hit_ratio", **labels): hits,
        key("found_ratio", **labels): found,
    }
    if per_msg is not None:
        gauges[key("broker_requests_per_message", **labels)] = per_msg
    for q in ("0.5", "0.9", "0.99"):
        gauges[key("wait_seconds", **labels, quantile=q)] = wait_s
    return gauges


def test_cli_prints_the_report_and_pushes_the_latest_window(spark, tmp_path, pushgateway, capsys):
    events = tmp_path / "events"
    crafted_log(events, next_day=False)
    out = str(tmp_path / "out")
    args = [str(events), "--out", out, "--pushgateway", pushgateway]
    # A low target and minimum so that the small log yields a threshold for g1/t1: its
    # windows at >= 5/60 req/s hit 2 of 5 times, all of them (>= 1/60) 3 of 7 times.
    thresholds = tmp_path / "thresholds.json"
    options = ["--target-hit-ratio", "0.4", "--min-requests", "1"]
    code = main([*args, *options, "--thresholds-out", str(thresholds)])

    assert code == 0
    # The recommendation as the proxies read it (receive.adaptive_thresholds_file).
    table = parse(thresholds.read_bytes())
    assert table.keys() == {("g1", "t1"), ("g2", "t2")}
    assert table["g1", "t1"].high_rate == pytest.approx(1 / 60, abs=1e-3)
    assert table["g1", "t1"].low_rate == pytest.approx(1 / 120, abs=1e-3)
    assert (table["g2", "t2"].high_rate, table["g2", "t2"].low_rate) == (50.0, 25.0)
    report = capsys.readouterr().out
    assert "8 records, 4 malformed lines" in report
    assert "Latest complete window 2024-05-01 10:01:00 to 2024-05-01 10:02:00 UTC" in report
    assert "g1 / t1: adaptive_high_rate 0.02, adaptive_low_rate 0.01 req/s" in report
    # No rate of g2/t2 hits at all: keep notify, above twice its rate, at least the default.
    assert "g2 / t2: adaptive_high_rate 50.00, adaptive_low_rate 25.00 req/s" in report

    # The second window of crafted_log, worked out by hand (see test_batch.EXPECTED_DAY1).
    expected = {
        **row_gauges("p1", "g1", "t1", "notify", 1, 1.0, 0.0, 1.0, 1.0, 0.9),
        **row_gauges("_fleet", "g1", "t1", "notify", 1, 1.0, 0.0, 1.0, 1.0, 0.9),
        # No message delivered: no broker-requests-per-message series at all (never NaN).
        **row_gauges("p2", "g2", "t2", "slicing", 1, 1.0, 0.0, 0.0, None, 0.05),
        **row_gauges("_fleet", "g2", "t2", "slicing", 1, 1.0, 0.0, 0.0, None, 0.05),
        key("recommended_threshold_rps", group="g1", topic="t1"): 1 / 60,
        key("recommended_threshold_rps", group="g2", topic="t2"): 50.0,
        key("window_end_timestamp_seconds"): datetime(2024, 5, 1, 10, 2, tzinfo=UTC).timestamp(),
        key("malformed_lines"): len(MALFORMED),
        key("records"): 8,
    }
    got = pushed(pushgateway)
    assert got.keys() == expected.keys()
    for k, value in expected.items():
        assert got[k] == pytest.approx(value), k

    # Another run replaces the job's metrics: the first run's series are gone.
    other = tmp_path / "other"
    write_log(other, "part-1", [event("2024-06-01T08:00:00", proxy="p9", group="g3")])
    assert main([str(other), "--out", str(tmp_path / "out2"), "--pushgateway", pushgateway]) == 0
    got = pushed(pushgateway)
    assert got[key("records")] == 1
    assert {dict(labels).get("group") for _, labels in got} == {"g3", None}
    assert key("recommended_threshold_rps", group="g1", topic="t1") not in got
