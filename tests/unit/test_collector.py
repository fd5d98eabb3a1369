"""The garbage collector's schedule while the proxy runs: no automatic full collections, one
every ``gc_full_collection_s``, CPython's own schedule back at close."""

from __future__ import annotations

import gc

import pytest

from proxy.collector import NEVER, FullCollections
from proxy.observability.metrics import ProxyMetrics
from testkit.waits import wait_until


def full_collections_timed(m: ProxyMetrics) -> float:
    body, _ = m.render()
    for line in body.decode().splitlines():
        if line.startswith('rocketmq_proxy_gc_pause_seconds_count{generation="2"}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.asyncio
async def test_full_collections_run_on_the_interval_only_and_the_schedule_is_restored():
    before = gc.get_threshold()
    metrics = ProxyMetrics()
    collections = FullCollections(0.05, metrics)
    collections.start()
    try:
        young, middle, oldest = gc.get_threshold()
        assert (young, middle, oldest) == (before[0], before[1], NEVER)
        # A full collection of this test process can itself take a good part of a second
        # on a loaded machine: wait (bounded) for two, not for a count after a fixed sleep.
        await wait_until(
            lambda: full_collections_timed(metrics) >= 2, timeout=10, step=0.05, what="two runs"
        )
        ran = full_collections_timed(metrics)
        assert ran >= 2
    finally:
        await collections.close()
    assert gc.get_threshold() == before
    assert collections._task is None
    closed_at = full_collections_timed(metrics)
    gc.collect()
    assert full_collections_timed(metrics) == closed_at  # no longer timed once closed


@pytest.mark.asyncio
async def test_interval_zero_keeps_cpythons_schedule_and_still_times_pauses():
    before = gc.get_threshold()
    metrics = ProxyMetrics()
    collections = FullCollections(0, metrics)
    collections.start()
    try:
        assert gc.get_threshold() == before
        gc.collect()
        metrics.flush_gc_pauses()
        assert full_collections_timed(metrics) >= 1
    finally:
        await collections.close()
    assert gc.get_threshold() == before
