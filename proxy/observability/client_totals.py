"""Where the clients' exports are added up: one SQLite database that every worker shares.

A client's cumulative series must be turned into increments against the totals last added
for that series, wherever they were added. With ``--workers N`` a client's exports land on
whichever worker its connection reached, and connection aging moves it between them; if
each worker kept its own last totals, a client moving A -> B -> A would have its time on B
counted by both. So the last totals live in one place: a database in the group's
multiprocess directory (``STORE_FILE``), or in memory for a single process. Each export is
one transaction (``BEGIN IMMEDIATE``: one writer at a time across the processes), so any
interleaving of exports over workers, and any worker restart, adds each increment once.

The histograms themselves live in the same database, one row per label set, and reach
``/metrics`` through ``ClientHistograms`` (a prometheus-client collector): the
supervisor's and a single process's scrape read the same rows.

What is kept, and for how long:

- **series**: a client's histogram per attribute set, with its last start, time and
  totals. At most ``max_client_series`` in all and ``max_series_per_client`` per client;
  a new series past either is refused (``series_limit``) and nothing of it is stored, so
  that once admitted it counts whole when its client is known. Nothing is evicted to make
  room: an evicted series that came back would be counted twice.
- **clients**: when each was last seen. A client silent for ``FORGET_AFTER_S`` is forgotten
  with all its series, together, so a known client always has every series it was
  counted for.
- **histograms**: one row per label set, at most ``max_label_sets``; a label set no export
  has named for ``FORGET_AFTER_S`` is removed (from ``/metrics`` too) and frees its place.

A series this store has no row for counts whole when its client is known (a new topic or
group of a client counted here before) or when it is young (its start less than
``FIRST_EXPORT_S`` before its time: a client's first export); else its first export is the
baseline and adds nothing: a client that outlived a proxy restart, or was forgotten, never
counts its history twice. An export older than the one last added (a retry, or one
overtaken by the next) adds nothing.
"""

from __future__ import annotations

import bisect
import enum
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.observability.metrics import CLIENT_HISTOGRAMS, CLIENT_LABELS

STORE_FILE = "client-metrics.sqlite"  # not *.db: the multiprocess collector reads those
# A client's first export comes one interval (60 s) after its series began, or at its
# shutdown before that; a series first seen here older than this is a baseline.
FIRST_EXPORT_S = 90.0
# Clients and label sets not named for this long are forgotten (clients export every 60 s).
FORGET_AFTER_S = 600.0
FORGET_EVERY_S = 60.0
# How long an export waits for another process's transaction before it fails.
BUSY_TIMEOUT_S = 10.0


class Outcome(enum.Enum):
    """What became of one data point."""

    ADDED = "added"  # its increment is in the histograms (possibly nothing: a repeat)
    STALE = "stale"  # older than what was added for its series: nothing added
    LABEL_LIMIT = "label_limit"  # a new label set past max_label_sets
    SERIES_LIMIT = "series_limit"  # a new series past max_client_series or per client
    MALFORMED = "malformed"  # cumulative counts that went down within one series


@dataclass(frozen=True)
class SeriesPoint:
    """One cumulative data point of a client's series, checked and labelled."""

    key: str  # the series: its histogram, bounds and attributes (the client apart)
    name: str  # a key of CLIENT_HISTOGRAMS
    labels: tuple[str, ...]  # as CLIENT_LABELS
    bounds: tuple[float, ...]  # the client's bucket bounds
    start: int  # ns, the client's clock
    time: int  # ns, the client's clock
    counts: tuple[int, ...]  # per bucket, the last one +Inf
    total: float
    cumulative: bool = True  # else a delta: added as it is

    @property
    def young(self) -> bool:
        age_s = (self.time - self.start) / 1e9
        return self.start > 0 and 0 <= age_s <= FIRST_EXPORT_S


@dataclass(frozen=True)
class Limits:
    max_label_sets: int
    max_client_series: int
    max_series_per_client: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (client TEXT PRIMARY KEY, seen REAL NOT NULL);
CREATE INDEX IF NOT EXISTS clients_seen ON clients (seen);
CREATE TABLE IF NOT EXISTS series (
    client TEXT NOT NULL, key TEXT NOT NULL, start INTEGER NOT NULL, time INTEGER NOT NULL,
    counts TEXT NOT NULL, total REAL NOT NULL, PRIMARY KEY (client, key));
CREATE TABLE IF NOT EXISTS histograms (
    name TEXT NOT NULL, labels TEXT NOT NULL, counts TEXT NOT NULL, total REAL NOT NULL,
    named REAL NOT NULL, PRIMARY KEY (name, labels));
CREATE INDEX IF NOT EXISTS histograms_named ON histograms (named);
"""
_SEP = "\x1f"  # between label values in a row (a control character no label keeps)


class ClientTotals:
    """The series' last totals and the histograms, for every process of the group.

    ``add`` runs in a worker thread (an export takes milliseconds to add); a lock keeps
    this process's one connection to itself, and SQLite's file lock the processes apart.
    """

    def __init__(
        self,
        directory: str | None,
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._clock = clock  # CLOCK_MONOTONIC: one clock for every process of the host
        self._lock = threading.Lock()
        self._db = _connect(os.path.join(directory, STORE_FILE) if directory else ":memory:")
        with self._lock:
            self._db.executescript(_SCHEMA)
        self._forgot_at = float("-inf")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, client: str, points: Sequence[SeriesPoint]) -> list[Outcome]:
        """Add one export of ``client``: each point's outcome, in order."""
        with self._lock:
            db = self._db
            now = self._clock()
            db.execute("BEGIN IMMEDIATE")
            try:
                self._forget(now)
                known = db.execute("SELECT 1 FROM clients WHERE client = ?", (client,))
                known_client = known.fetchone() is not None
                db.execute("INSERT OR REPLACE INTO clients VALUES (?, ?)", (client, now))
                outcomes = [self._point(client, known_client, p, now) for p in points]
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return outcomes

    def _point(self, client: str, known_client: bool, p: SeriesPoint, now: float) -> Outcome:
        if not p.cumulative:
            kept = self._add_to_histogram(p, list(p.counts), p.total, now)
            return Outcome.ADDED if kept else Outcome.LABEL_LIMIT
        db = self._db
        row = db.execute(
            "SELECT start, time, counts, total FROM series WHERE client = ? AND key = ?",
            (client, p.key),
        ).fetchone()
        if row is not None:
            start, at, before, before_total = row
            if p.start < start or (p.start == start and p.time <= at):
                return Outcome.STALE
            if p.start == start:
                previous = _ints(before)
                if len(previous) != len(p.counts) or any(
                    n < b for n, b in zip(p.counts, previous, strict=True)
                ):
                    return Outcome.MALFORMED
                added = [n - b for n, b in zip(p.counts, previous, strict=True)]
                added_total = max(p.total - before_total, 0.0)
            else:  # the series restarted
                added, added_total = list(p.counts), p.total
        else:
            if self._series_full(client):
                return Outcome.SERIES_LIMIT
            if known_client or p.young:
                added, added_total = list(p.counts), p.total
            else:  # the baseline of a client this store does not know
                added, added_total = [0] * len(p.counts), 0.0
        if not self._add_to_histogram(p, added, added_total, now):
            return Outcome.LABEL_LIMIT
        db.execute(
            "INSERT OR REPLACE INTO series VALUES (?, ?, ?, ?, ?, ?)",
            (client, p.key, p.start, p.time, _text(p.counts), p.total),
        )
        return Outcome.ADDED

    def _series_full(self, client: str) -> bool:
        db = self._db
        (mine,) = db.execute("SELECT COUNT(*) FROM series WHERE client = ?", (client,)).fetchone()
        if mine >= self.limits.max_series_per_client:
            return True
        (everyone,) = db.execute("SELECT COUNT(*) FROM series").fetchone()
        return bool(everyone >= self.limits.max_client_series)

    def _add_to_histogram(
        self, p: SeriesPoint, added: list[int], added_total: float, now: float
    ) -> bool:
        db = self._db
        labels = _SEP.join(p.labels)
        row = db.execute(
            "SELECT counts, total FROM histograms WHERE name = ? AND labels = ?", (p.name, labels)
        ).fetchone()
        ours = _rebucket(p.name, p.bounds, added)
        if row is None:
            (sets,) = db.execute("SELECT COUNT(*) FROM histograms").fetchone()
            if sets >= self.limits.max_label_sets:
                return False
            counts, total = ours, added_total
        else:
            counts = [a + b for a, b in zip(_ints(row[0]), ours, strict=True)]
            total = row[1] + added_total
        db.execute(
            "INSERT OR REPLACE INTO histograms VALUES (?, ?, ?, ?, ?)",
            (p.name, labels, _text(counts), total, now),
        )
        return True

    def _forget(self, now: float) -> None:
        """Drop clients (with their series) and label sets nobody named for a while; at
        most once a minute per process."""
        if now - self._forgot_at < FORGET_EVERY_S:
            return
        self._forgot_at = now
        stale = now - FORGET_AFTER_S
        db = self._db
        db.execute(
            "DELETE FROM series WHERE client IN (SELECT client FROM clients WHERE seen < ?)",
            (stale,),
        )
        db.execute("DELETE FROM clients WHERE seen < ?", (stale,))
        db.execute("DELETE FROM histograms WHERE named < ?", (stale,))

    def histograms(self) -> list[tuple[str, tuple[str, ...], list[int], float]]:
        """Every label set's histogram: name, labels, counts per proxy bucket, sum."""
        with self._lock:
            return _histograms(self._db)

    def sizes(self) -> dict[str, int]:
        """Rows per table (for tests and the status page)."""
        with self._lock:
            return {
                table: self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("clients", "series", "histograms")
            }


class ClientHistograms:
    """A prometheus-client collector of the four client histograms, read at each scrape
    from a ``ClientTotals`` (one process) or from the group's database file (the
    supervisor, which adds nothing itself)."""

    def __init__(self, read: Callable[[], list[tuple[str, tuple[str, ...], list[int], float]]]):
        self._read = read

    @classmethod
    def of_group(cls, directory: str) -> ClientHistograms:
        path = os.path.join(directory, STORE_FILE)

        def read() -> list[tuple[str, tuple[str, ...], list[int], float]]:
            if not os.path.exists(path):
                return []  # no worker has taken an export yet
            db = _connect(path)
            try:
                return _histograms(db)
            finally:
                db.close()

        return cls(read)

    def describe(self) -> list[Metric]:
        return [
            HistogramMetricFamily(name, text, labels=CLIENT_LABELS)
            for name, (text, _) in CLIENT_HISTOGRAMS.items()
        ]

    def collect(self) -> Iterator[Metric]:
        families = {
            name: HistogramMetricFamily(name, text, labels=CLIENT_LABELS)
            for name, (text, _) in CLIENT_HISTOGRAMS.items()
        }
        for name, labels, counts, total in self._read():
            bounds = CLIENT_HISTOGRAMS[name][1]
            running, buckets = 0, []
            for bound, n in zip((*bounds, float("inf")), counts, strict=True):
                running += n
                buckets.append((_le(bound), running))
            families[name].add_metric(list(labels), buckets, total)
        yield from families.values()


def _connect(path: str) -> sqlite3.Connection:
    # isolation_level=None: transactions are the explicit BEGIN/COMMIT of ``add``.
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    if path != ":memory:":
        db.execute("PRAGMA journal_mode = WAL")  # scrapes read while a worker writes
        db.execute("PRAGMA synchronous = OFF")  # the directory lives as long as the group
    return db


def _histograms(db: sqlite3.Connection) -> list[tuple[str, tuple[str, ...], list[int], float]]:
    rows = db.execute("SELECT name, labels, counts, total FROM histograms ORDER BY name, labels")
    return [(name, tuple(labels.split(_SEP)), _ints(c), t) for name, labels, c, t in rows]


def _rebucket(name: str, bounds: tuple[float, ...], counts: Sequence[int]) -> list[int]:
    """A client's bucket counts in the proxy's buckets of ``name``: each of the client's
    buckets goes to the proxy's first bucket whose bound is at least its own (exact for
    the official clients' bounds, which are the proxy's; never below the true value)."""
    ours = CLIENT_HISTOGRAMS[name][1]
    if bounds == ours:
        return list(counts)
    out = [0] * (len(ours) + 1)
    for i, n in enumerate(counts):
        j = bisect.bisect_left(ours, bounds[i]) if i < len(bounds) else len(ours)
        out[j] += n
    return out


def _le(bound: float) -> str:
    """A bucket's ``le`` as prometheus-client writes it ("1.0", "+Inf")."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


def _text(counts: Sequence[int]) -> str:
    return ",".join(map(str, counts))


def _ints(text: str) -> list[int]:
    return [int(n) for n in text.split(",")]
