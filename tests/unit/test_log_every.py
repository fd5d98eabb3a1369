"""A repeating log line, at most once per interval, the next one counting what was left
out (proxy/observability/log_every.py)."""

from __future__ import annotations

import logging

from proxy.observability.log_every import LogEvery


def test_one_line_per_interval_and_the_next_counts_the_rest(caplog):
    now = [100.0]
    lines = LogEvery(logging.getLogger("test.every"), 1.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="test.every")
    for i in range(5):
        lines.warning("refused %s", i)
    now[0] += 1.0
    lines.warning("refused %s", "late")
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0",
        "refused late (4 more since the last line)",
    ]
