"""The threshold rule and the command line's parsing: plain Python, no Spark."""

from __future__ import annotations

import pytest

from polling_report.cli import parser
from polling_report.durations import check_window, parse_duration
from polling_report.recommend import RatePoint, recommend, write_thresholds
from proxy.receive.adaptive import Thresholds
from proxy.receive.thresholds import parse


def pt(rate: float, requests: int, hits: int, group: str = "g", topic: str = "t") -> RatePoint:
    return RatePoint(group, topic, rate, requests, hits)


def test_threshold_is_the_lowest_rate_whose_busier_windows_reach_the_target():
    points = [
        pt(80.0, 100, 99),  # busy windows hit almost always
        pt(60.0, 100, 95),
        pt(40.0, 100, 88),  # >= 40: 282 of 300 = 94 %, still above 90 %
        pt(20.0, 100, 40),  # >= 20: 322 of 400 = 80.5 %: below
        pt(5.0, 100, 10),
    ]
    [rec] = recommend(points, target=0.9, min_requests=100)
    assert (rec.qualified, rec.threshold_rps, rec.low_rps) == (True, 40.0, 20.0)
    assert (rec.requests_above, rec.windows_above) == (300, 3)
    assert rec.hit_ratio_above == pytest.approx(282 / 300)
    assert (rec.windows, rec.requests, rec.max_rate) == (5, 500, 80.0)
    assert rec.overall_hit_ratio == pytest.approx(332 / 500)
    assert "adaptive_high_rate = 40.00" in rec.explain()


def test_a_lower_rate_can_qualify_after_a_dip_and_ties_are_not_split():
    points = [
        pt(50.0, 100, 85),  # alone: 85 %, below the target
        pt(30.0, 100, 100),  # >= 30: 92.5 %
        pt(10.0, 60, 60),  # two windows at 10 req/s: taken together or not at all
        pt(10.0, 60, 0),  # >= 10: 245 of 320 = 76.6 %
    ]
    [rec] = recommend(points, target=0.9, min_requests=100)
    assert rec.threshold_rps == 30.0


def test_no_rate_qualifies_keeps_notify_and_too_little_data_recommends_nothing():
    low_hits = [pt(r, 100, 30) for r in (5.0, 10.0, 50.0)]
    few = [pt(1.0, 10, 10, group="quiet")]
    busy = [pt(r, 100, 30, group="busy") for r in (40.0, 70.0)]
    recs = {r.group: r for r in recommend(low_hits + few + busy, target=0.9, min_requests=100)}
    # Above twice the highest rate seen, and never below the proxy's default (50 req/s).
    assert (recs["g"].qualified, recs["g"].enough_data, recs["g"].threshold_rps) == (
        False,
        True,
        100.0,
    )
    assert "keep adaptive_high_rate above twice that rate" in recs["g"].explain()
    assert recs["busy"].threshold_rps == 140.0
    assert (recs["quiet"].qualified, recs["quiet"].enough_data) == (False, False)
    assert recs["quiet"].threshold_rps == 50.0  # the proxy's default
    assert "too few" in recs["quiet"].explain()


def test_each_group_and_topic_gets_its_own_recommendation_in_order():
    points = [pt(9.0, 100, 100, "b", "t"), pt(3.0, 100, 100, "a", "t2"), pt(4.0, 100, 0, "a", "t1")]
    recs = recommend(points, target=0.9, min_requests=1)
    assert [(r.group, r.topic, r.qualified, r.threshold_rps) for r in recs] == [
        ("a", "t1", False, 50.0),
        ("a", "t2", True, 3.0),
        ("b", "t", True, 9.0),
    ]


def test_durations_and_windows():
    assert [parse_duration(t) for t in ("45", "30s", "1m", "2h", "1d")] == [45, 30, 60, 7200, 86400]
    for bad in ("", "1.5m", "-1m", "1w", "m"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert check_window(60) == 60
    with pytest.raises(ValueError):
        check_window(7 * 60)  # 1440 minutes are not a multiple of 7


def test_command_line_follows_the_contract():
    dates = ["--date", "2024-05-01", "2024-05-02", "--date", "2024-05-03"]
    more = ["--pushgateway", "http://pg:9091", "--master", "local[2]"]
    args = parser().parse_args(["logs/", "--out", "agg/", "--window", "5m", *dates, *more])
    assert (args.events, args.out, args.window, args.master) == ("logs/", "agg/", 300, "local[2]")
    assert args.dates == ["2024-05-01", "2024-05-02", "2024-05-03"]
    assert (args.pushgateway, args.job, args.stream) == (
        "http://pg:9091",
        "rmq_polling_report",
        False,
    )
    stream = parser().parse_args(["s3a://b/logs", "--out", "o", "--stream", "--checkpoint", "c"])
    assert (stream.stream, stream.checkpoint, stream.once) == (True, "c", False)
    for bad in (["x", "--out", "o", "--date", "2024-13-01"], ["x", "--out", "o", "--window", "7m"]):
        with pytest.raises(SystemExit):
            parser().parse_args(bad)


def test_the_thresholds_file_is_what_the_proxies_read(tmp_path):
    recs = recommend(
        [
            pt(80.0, 100, 99),  # g/t: qualifies at 40
            pt(40.0, 100, 95),
            pt(30.0, 200, 0, group="idle"),  # never hits: notify, 2 x 30 = 60
            pt(1.0, 5, 5, group="few"),  # too little data: left to the proxy's default
        ],
        target=0.9,
        min_requests=100,
    )
    path = tmp_path / "thresholds.json"
    path.write_text("old")
    assert write_thresholds(recs, str(path)) == 2
    assert parse(path.read_bytes()) == {
        ("g", "t"): Thresholds(40.0, 20.0),
        ("idle", "t"): Thresholds(60.0, 30.0),
    }
    assert [p.name for p in tmp_path.iterdir()] == ["thresholds.json"]  # no temporary left


def test_thresholds_out_is_an_option():
    args = parser().parse_args(["ev", "--out", "o", "--thresholds-out", "/x/t.json"])
    assert args.thresholds_out == "/x/t.json"
