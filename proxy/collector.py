"""The garbage collector's schedule: every pause of Python's cyclic collector stops the event
loop, and every poll on it waits.

CPython starts a full collection whenever the objects that survived into the oldest
generation have grown by a quarter since the last one. A parked poll outlives the young
collections (it waits up to 20 s), so every poll's objects (its coroutines, tasks, futures,
grpcio's call state: about 80 tracked objects) reach the oldest generation, and with
thousands of polls renewing every 20 s that quarter fills every few seconds. Each full
collection walks every live poll: 140 ms with 2,400 idle polls, 0.5-2.5 s with 20,000
(`python -m bench.bench_proxy --scenarios fanin --fanin-polls 20000`), many times a minute.
What it finds is almost nothing: a poll's objects are freed by reference counting when it
ends (90 objects of garbage after a minute of 2,400 polls renewing every 5 s).

So while the proxy runs, the young generations are collected as usual (they catch the
short-lived cycles), automatic full collections are off, and one runs every
``gc_full_collection_s`` (default 10 minutes) to reclaim what cycles did reach the oldest
generation. Its pause is the same, but it comes once per interval instead of every few
seconds. ``rocketmq_proxy_gc_pause_seconds`` times every collection.

``settle_heap`` is the other half: objects made at start-up live as long as the process, and
are moved out of every collection's sight once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

from proxy.background import start_background, stop_background
from proxy.observability.metrics import ProxyMetrics

log = logging.getLogger(__name__)

# A full-collection threshold no count of young collections reaches: CPython collects the
# oldest generation only when its count passes the threshold.
NEVER = 2**31 - 1


def settle_heap() -> None:
    """Once started: collect, then move every object alive now (modules, protobuf
    descriptors, the config, the parts of the app) to the collector's permanent generation.
    They live as long as the process, and a full collection no longer walks them."""
    gc.collect()
    gc.freeze()


class FullCollections:
    """Owns the schedule of full collections while the proxy runs, and the flush of the
    timed pauses into the metric; restores CPython's schedule at ``close``. ``interval_s``
    0 leaves CPython's schedule alone (pauses are still timed)."""

    FLUSH_S = 1.0  # how often timed pauses reach the metric

    def __init__(self, interval_s: float, metrics: ProxyMetrics) -> None:
        self.interval_s = interval_s
        self._metrics = metrics
        self._unwatch: Callable[[], None] | None = None
        self._thresholds: tuple[int, int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._unwatch = self._metrics.watch_gc()
        if self.interval_s > 0:
            self._thresholds = gc.get_threshold()
            young, middle, _ = self._thresholds
            gc.set_threshold(young, middle, NEVER)
        self._task = start_background(self._run(), name="full-collections", log=log)

    async def close(self) -> None:
        await stop_background(self._task)
        self._task = None
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._metrics.flush_gc_pauses()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        flush_s = min(self.FLUSH_S, self.interval_s) if self.interval_s > 0 else self.FLUSH_S
        next_full = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(flush_s)
            if self.interval_s > 0 and loop.time() >= next_full:
                next_full = loop.time() + self.interval_s
                started = time.perf_counter()
                found = gc.collect()
                log.info(
                    "full collection: %d unreachable objects, %.1f ms",
                    found,
                    (time.perf_counter() - started) * 1000,
                )
            self._metrics.flush_gc_pauses()
