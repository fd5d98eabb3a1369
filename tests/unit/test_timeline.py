"""A poll's timeline: off unless its logger is at DEBUG, and written in the form the cold
benchmark (bench/cold.py) reads back."""

from __future__ import annotations

import logging

import pytest

from proxy.receive.timeline import Timeline, timelines


def test_no_timeline_unless_its_logger_is_at_debug(caplog):
    caplog.set_level(logging.INFO, logger="proxy.receive.timeline")
    assert Timeline.wanted() is None
    caplog.set_level(logging.DEBUG, logger="proxy.receive.timeline")
    assert isinstance(Timeline.wanted(), Timeline)


def test_the_logged_line_is_what_the_cold_benchmark_reads(caplog):
    caplog.set_level(logging.DEBUG, logger="proxy.receive.timeline")
    timeline = Timeline()
    origin = 100.0
    timeline.mark(100.0, "mode", "notify")
    timeline.mark(100.004, "pop", "broker-a")
    timeline.mark(100.0125, "popped", "broker-a/0")
    timeline.mark(101.5, "has_msg", "broker-b")
    timeline.mark(101.52, "written", "1")
    timeline.log(
        origin, "receive G/T arrived_ms=1700000000000 mode=notify polling_ms=10000 ids=ID1,ID2"
    )
    line = "2026-11-23 23:01:56,358 DEBUG proxy.receive.timeline: " + caplog.records[0].message
    polls = timelines(line)
    assert set(polls) == {"ID1", "ID2"}
    poll = polls["ID1"]
    assert poll["mode"] == "notify"
    assert poll["stages"] == [
        "mode:notify@0.0",
        "pop:broker-a@4.0",
        "popped:broker-a/0@12.5",
        "has_msg:broker-b@1500.0",
        "written:1@1520.0",
    ]
    assert poll["written"] == pytest.approx(1_700_000_000.0 + 1.52)
