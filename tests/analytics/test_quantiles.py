"""The wait-time quantiles from KLL sketches against exact nearest-rank values.

A group of at most ``KLL_K`` waits gets exact quantiles (test_batch's hand-computed rows
check that too); a larger one gets values whose rank is within ``RANK_ERROR`` * n of the
exact rank, for each proxy and for the fleet, whose sketch is merged from the proxies'.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right

import pytest

from polling_report.aggregate import KLL_K, RANK_ERROR
from polling_report.job import JobOptions, run_batch
from polling_report.schema import WAIT_COLUMNS
from tests.analytics._events import event, write_log
from tests.analytics.test_batch import stored_rows

pytestmark = pytest.mark.slow

DAY = "2024-05-01"
BIG = 12_000  # waits in the first window, over two proxies: 60 times k


def known_log(root) -> dict[tuple[str, str], list[int]]:
    """Write the log; return each (window start, proxy or _fleet)'s waits."""
    waits = list(range(BIG))
    random.Random(44).shuffle(waits)  # sketches see the values in no particular order
    by_proxy = {"p1": [w for w in waits if w % 3 == 0], "p2": [w for w in waits if w % 3]}
    expected = {}
    for proxy, values in by_proxy.items():
        records = [
            event(f"{DAY}T10:00:{i * 60 // len(values):02d}", proxy=proxy, wait_ms=w)
            for i, w in enumerate(values)
        ]
        write_log(root, "part-big", records)
        expected[(f"{DAY}T10:00:00", proxy)] = values
    expected[(f"{DAY}T10:00:00", "_fleet")] = waits
    # The next window: exactly k waits of one proxy, the most a sketch holds exactly.
    small = [(i * 7919) % 100_000 for i in range(KLL_K)]
    write_log(root, "part-small", [event(f"{DAY}T10:01:30", proxy="p3", wait_ms=w) for w in small])
    expected[(f"{DAY}T10:01:00", "p3")] = small
    expected[(f"{DAY}T10:01:00", "_fleet")] = small
    return expected


def test_quantiles_exact_up_to_k_and_within_the_rank_error_beyond(spark, tmp_path):
    expected = known_log(tmp_path / "events")
    out = str(tmp_path / "out")
    summary = run_batch(spark, JobOptions(events=str(tmp_path / "events"), out=out))
    assert summary.records == BIG + KLL_K

    rows = {(r["window_start"], r["proxy"]): r for r in stored_rows(spark, out)}
    assert set(rows) == set(expected)
    for key, values in expected.items():
        row, ordered, n = rows[key], sorted(values), len(values)
        assert row["requests"] == row["sketch_n"] == n, key
        for q, column in WAIT_COLUMNS.items():
            got, exact_rank = row[column], math.ceil(float(q) * n)
            if n <= KLL_K:
                assert got == ordered[exact_rank - 1], (key, q)
                continue
            # The ranks the returned value holds among the exact waits: the closest one
            # to the exact rank is at most RANK_ERROR * n away.
            low, high = bisect_left(ordered, got) + 1, bisect_right(ordered, got)
            assert low <= high, (key, q, got)  # a value that was seen
            distance = max(low - exact_rank, exact_rank - high, 0)
            assert distance <= RANK_ERROR * n, (key, q, got, exact_rank, distance)
