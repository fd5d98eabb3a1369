"""Gauges whose label sets come and go (a group's consumer lag, while it has consumers
here), right with ``rmq-proxy --workers N`` too.

prometheus-client's multiprocess mode keeps every sample a worker ever set in that
worker's memory-mapped file: ``Gauge.remove`` forgets the label set in the process only
(it warns that removal is not implemented in multiprocess mode), and the ``live*`` modes
drop a file's samples only once its process is dead (``mark_process_dead``). A group whose
consumers all left would stay on the supervisor's /metrics with its last lag for as long
as the worker lives, and an alert on it would keep firing. So these gauges are not kept in
those files at all:

- each process holds its current label sets in memory (``LiveGauges``, a collector on the
  process's own registry: a single process's /metrics, and a worker's own, read it);
- a worker of a group also publishes the whole set, after each change of it
  (``publish``), to a file of its own in the multiprocess directory,
  ``live-gauges_<pid>.json``, written under a temporary name and renamed over the last
  one, so a reader sees one whole set or the one before;
- the supervisor's ``GroupLiveGauges`` merges the files of the live workers at each
  scrape. A label set two workers publish takes the larger value: each worker with a
  consumer of the group reads the same figure from the brokers. A dead worker's file is
  removed when the supervisor reaps it (``forget``) and skipped before that, so its label
  sets leave /metrics with it.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

FILE_PREFIX = "live-gauges_"
FILE_SUFFIX = ".json"  # not .db: prometheus-client's multiprocess collector reads those
TMP_SUFFIX = ".tmp"
# Every file of these gauges in a directory, temporary ones included (a start clears them).
FILES_GLOB = f"{FILE_PREFIX}*{FILE_SUFFIX}*"

Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GaugeSpec:
    """One gauge: what both a worker and the supervisor need to render it."""

    name: str
    documentation: str
    labelnames: tuple[str, ...]


def file_of(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{pid}{FILE_SUFFIX}")


def _families(
    specs: Iterable[GaugeSpec], values: dict[str, dict[Labels, float]]
) -> Iterator[Metric]:
    for spec in specs:
        family = GaugeMetricFamily(spec.name, spec.documentation, labels=spec.labelnames)
        for labels, value in sorted(values.get(spec.name, {}).items()):
            family.add_metric(list(labels), value)
        yield family


class LiveGauges:
    """This process's gauges of ``specs``: set and removed in memory, rendered by its own
    registry, and published to ``directory`` (a worker's multiprocess directory; None in a
    single process) by ``publish``."""

    def __init__(self, specs: Sequence[GaugeSpec], directory: str | None = None) -> None:
        self.specs = tuple(specs)
        self._values: dict[str, dict[Labels, float]] = {spec.name: {} for spec in specs}
        self._lock = threading.Lock()  # a scrape renders in a thread of its own
        self._path = file_of(directory, os.getpid()) if directory else None
        self._changed = False

    def set(self, name: str, labels: Labels, value: float) -> None:
        with self._lock:
            series = self._values[name]
            if series.get(labels) != value:
                series[labels] = value
                self._changed = True

    def remove(self, name: str, labels: Labels) -> None:
        with self._lock:
            if self._values[name].pop(labels, None) is not None:
                self._changed = True

    def publish(self) -> None:
        """Write the current set for the supervisor, if it changed since the last write
        (nothing to do in a single process). A failure is logged: the supervisor shows the
        last set until the next publish succeeds."""
        if self._path is None or not self._changed:
            return
        with self._lock:
            body = json.dumps({name: list(series.items()) for name, series in self._values.items()})
            self._changed = False
        tmp = self._path + TMP_SUFFIX
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(body)
            os.replace(tmp, self._path)  # atomic: a reader sees the old set or the new one
        except OSError as exc:
            self._changed = True  # try again at the next publish
            log.warning("live gauges: publishing %s failed: %s", self._path, exc)

    def describe(self) -> Iterator[Metric]:
        return _families(self.specs, {})

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            values = {name: dict(series) for name, series in self._values.items()}
        return _families(self.specs, values)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user has this pid: not ours, but there
        return True
    return True


class GroupLiveGauges:
    """The supervisor's view of the gauges of ``specs``: each live worker's last published
    set, merged (the maximum for a label set more than one publishes) at each scrape."""

    def __init__(
        self,
        specs: Sequence[GaugeSpec],
        directory: str,
        alive: Callable[[int], bool] = _alive,
    ) -> None:
        self.specs = tuple(specs)
        self.directory = directory
        self._alive = alive

    def forget(self, pid: int) -> None:
        """Drop an exited worker's set (and a temporary file its death cut off)."""
        path = file_of(self.directory, pid)
        for name in (path, path + TMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)

    def describe(self) -> Iterator[Metric]:
        return _families(self.specs, {})

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, dict[Labels, float]] = {spec.name: {} for spec in self.specs}
        for path in glob.glob(os.path.join(self.directory, f"{FILE_PREFIX}*{FILE_SUFFIX}")):
            pid = os.path.basename(path)[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
            if not pid.isdigit() or not self._alive(int(pid)):
                continue  # a dead worker's set, not reaped yet: it left with its worker
            try:
                with open(path, encoding="utf-8") as fh:
                    published = json.load(fh)
            except FileNotFoundError:
                continue  # reaped since the glob
            except (OSError, ValueError) as exc:
                log.warning("live gauges: reading %s failed: %s", path, exc)
                continue
            for name, series in published.items():
                into = merged.get(name)
                if into is None:
                    continue  # a gauge this supervisor does not know
                for labels, value in series:
                    key = tuple(labels)
                    into[key] = max(value, into.get(key, value))
        return _families(self.specs, merged)
