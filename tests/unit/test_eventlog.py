"""EventLog: real files in a temporary directory, read back after close."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from proxy.config import EventLogFormat
from proxy.observability.eventlog import WRITER_THREAD_NAME, EventLog
from proxy.observability.eventlog_parquet import parquet_writer, record_batch
from proxy.observability.receive_event import ReceiveEvent
from testkit.event_log import part_files, read_records
from testkit.waits import wait_until

JSONL, PARQUET = EventLogFormat.JSONL, EventLogFormat.PARQUET

FIELDS = [
    "ts", "proxy", "group", "topic", "mode", "is_long_polling", "is_short_polling_hit",
    "polling_ms", "wait_ms", "messages", "result", "pops", "notifications", "broker",
]  # fmt: skip

# 2024-02-28T23:59:59Z: one second before a (leap) day change.
TS = int(datetime(2024, 2, 28, 23, 59, 59, tzinfo=UTC).timestamp() * 1000)


def event(i: int, ts: int = TS) -> ReceiveEvent:
    return ReceiveEvent(
        ts=ts + i,
        proxy="p1",
        group="G",
        topic="T",
        mode=("notify", "coupled", "slicing")[i % 3],
        is_long_polling=i % 2 == 0,
        is_short_polling_hit=i % 5 == 0,
        polling_ms=20_000,
        wait_ms=i,
        messages=i % 4,
        result="found" if i % 4 else "empty",
        pops=1 + i % 3,
        notifications=i % 7,
        broker=f"broker-{i % 2}" if i % 4 else None,
    )


def as_dict(e: ReceiveEvent) -> dict[str, object]:
    return {name: getattr(e, name) for name in FIELDS}


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


visible_parts, read_lines = part_files, read_records


async def written(tmp_path: Path, events: list[ReceiveEvent], **options) -> EventLog:
    """An event log under ``tmp_path`` that wrote ``events`` and closed."""
    log = EventLog(str(tmp_path), "p1", **options)
    log.start()
    for e in events:
        log.write(e)
    await log.close()
    return log


@pytest.fixture(params=list(EventLogFormat))
def fmt(request) -> EventLogFormat:
    return request.param


def test_to_json_is_one_line_with_the_contract_fields():
    e = event(1)
    assert e.to_json() == (
        b'{"ts":%d,"proxy":"p1","group":"G","topic":"T","mode":"coupled",'
        b'"is_long_polling":false,"is_short_polling_hit":false,"polling_ms":20000,'
        b'"wait_ms":1,"messages":1,"result":"found","pops":2,"notifications":1,'
        b'"broker":"broker-1"}' % (TS + 1)
    )
    assert list(orjson.loads(event(0).to_json())) == FIELDS
    assert orjson.loads(event(0).to_json())["broker"] is None


async def test_all_events_written_in_order_with_final_names_only(
    tmp_path: Path, fmt: EventLogFormat
):
    log = EventLog(str(tmp_path), "p1", log_format=fmt)
    log.start()
    events = [event(i) for i in range(500)]
    assert all(log.write(e) for e in events)
    await log.close()
    files = all_files(tmp_path)
    assert len(files) == 1
    f = files[0]
    assert f.parent == tmp_path / "proxy=p1" / "date=2024-02-28"
    assert f.name.startswith("part-") and f.name.endswith(fmt.suffix)
    stamp, seq = f.name[len("part-") : -len(fmt.suffix)].split("-")
    datetime.strptime(stamp, "%Y%m%dT%H%M%S")  # UTC stamp, well formed
    assert seq.isdigit()
    lines = read_lines(files)
    assert [list(line) for line in lines[:1]] == [FIELDS]
    assert lines == [as_dict(e) for e in events]
    assert (log.written, log.dropped, log.files_completed) == (500, 0, 1)
    assert log.write(event(0)) is False  # closed
    assert log.dropped == 1


async def test_rotation_by_size_makes_several_whole_files(tmp_path: Path):
    """JSON lines: a file completes once it reaches ``max_bytes``, one line over at most."""
    line_len = max(len(event(i).to_json()) + 1 for i in range(100))
    max_bytes = line_len * 10
    events = [event(i) for i in range(100)]
    log = await written(tmp_path, events, log_format=JSONL, max_bytes=max_bytes)
    files = all_files(tmp_path)
    assert files == visible_parts(tmp_path)  # nothing hidden left behind
    assert len(files) >= 9
    assert all(f.stat().st_size < max_bytes + line_len for f in files)
    assert read_lines(files) == [as_dict(e) for e in events]
    assert log.files_completed == len(files)


async def test_parquet_rotates_by_its_rows_bytes_and_writes_row_groups(tmp_path: Path, monkeypatch):
    """Parquet: rows are written a row group at a time, and a file completes once its row
    groups and the rows it holds reach ``max_bytes`` (as its last row group came out)."""
    monkeypatch.setattr("proxy.observability.eventlog_parquet.ROW_GROUP_ROWS", 50)
    events = [event(i) for i in range(1_000)]
    await written(tmp_path, events, log_format=PARQUET, max_bytes=4_000)
    files = visible_parts(tmp_path)
    assert files == all_files(tmp_path)
    assert 2 <= len(files) < 1_000 // 50
    groups = [pq.ParquetFile(f).metadata.num_row_groups for f in files]
    assert sum(groups) >= 1_000 // 50 and max(groups) > 1  # several row groups a file
    assert read_lines(files) == [as_dict(e) for e in events]


async def test_a_row_group_that_cannot_be_written_costs_only_its_rows(tmp_path: Path, monkeypatch):
    """A row group that fails to encode (here an event of the wrong type) is dropped and
    its rows counted lost, not written; the rows after it are written, and the file is
    whole."""
    monkeypatch.setattr("proxy.observability.eventlog_parquet.ROW_GROUP_ROWS", 3)
    bad = event(1)
    bad.wait_ms = "slow"  # type: ignore[assignment]
    events = [event(0), bad, event(2), event(3), event(4), event(5), event(6)]
    log = await written(tmp_path, events, log_format=PARQUET)
    assert (log.failed, log.written) == (3, 4)  # the row group of 0, bad and 2
    assert [d["wait_ms"] for d in read_lines(visible_parts(tmp_path))] == [3, 4, 5, 6]


async def test_a_last_row_group_that_cannot_be_written_costs_only_its_rows(
    tmp_path: Path, monkeypatch
):
    """The row group written as the file completes: its rows are lost and counted, the
    file still gets its footer, with the row groups before it."""
    monkeypatch.setattr("proxy.observability.eventlog_parquet.ROW_GROUP_ROWS", 3)
    bad = event(4)
    bad.wait_ms = "slow"  # type: ignore[assignment]
    events = [event(0), event(1), event(2), event(3), bad]
    log = await written(tmp_path, events, log_format=PARQUET)
    assert (log.failed, log.written, log.files_completed) == (2, 3, 1)
    assert [d["wait_ms"] for d in read_lines(visible_parts(tmp_path))] == [0, 1, 2]


async def test_a_file_that_cannot_complete_counts_all_its_rows_lost(tmp_path: Path, monkeypatch):
    def refused(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("proxy.observability.eventlog.os.fsync", refused)
    log = await written(tmp_path, [event(i) for i in range(5)], log_format=PARQUET)
    assert (log.failed, log.written, log.files_completed) == (5, 0, 0)


async def test_parquet_counts_the_rows_it_holds_towards_rotation(tmp_path: Path, monkeypatch):
    """Rows not yet in a row group count too: a file rotates before its first row group
    is due when they alone reach ``max_bytes``."""
    monkeypatch.setattr("proxy.observability.eventlog_parquet.ROW_GROUP_ROWS", 400)
    events = [event(i) for i in range(1_000)]
    await written(tmp_path, events, log_format=PARQUET, max_bytes=1_000)
    files = visible_parts(tmp_path)
    assert len(files) >= 10  # not 3 files of 400, 400 and 200 rows
    assert read_lines(files) == [as_dict(e) for e in events]


async def test_date_partition_from_ts(tmp_path: Path, fmt: EventLogFormat):
    log = EventLog(str(tmp_path), "p1", log_format=fmt)
    log.start()
    # TS + 999 is the last ms of Feb 28; TS + 1000 is midnight Feb 29 (UTC).
    for e in [event(0), event(999), event(1000), event(5000)]:
        log.write(e)
    await log.close()
    root = tmp_path / "proxy=p1"
    assert sorted(p.name for p in root.iterdir()) == ["date=2024-02-28", "date=2024-02-29"]
    assert [d["wait_ms"] for d in read_lines(visible_parts(root / "date=2024-02-28"))] == [0, 999]
    assert [d["wait_ms"] for d in read_lines(visible_parts(root / "date=2024-02-29"))] == [
        1000,
        5000,
    ]


async def test_old_date_file_completes_after_the_late_grace(tmp_path: Path, fmt: EventLogFormat):
    log = EventLog(str(tmp_path), "p1", log_format=fmt, late_grace_seconds=0.1)
    log.start()
    log.write(event(0))
    log.write(event(2000))  # next day
    log.write(event(1))  # a late answer for a request that arrived before midnight
    await wait_until(lambda: log.files_completed == 1)
    day1 = visible_parts(tmp_path / "proxy=p1" / "date=2024-02-28")
    assert [d["wait_ms"] for d in read_lines(day1)] == [0, 1]  # one file, not two
    assert visible_parts(tmp_path / "proxy=p1" / "date=2024-02-29") == []  # still open
    await log.close()
    assert log.files_completed == 2


async def test_rotation_by_age_and_flush_while_open(tmp_path: Path):
    log = EventLog(str(tmp_path), "p1", log_format=JSONL, max_age_seconds=1.0, flush_interval=0.05)
    log.start()
    log.write(event(0))
    hidden: list[Path] = []

    def flushed() -> bool:
        hidden[:] = [p for p in all_files(tmp_path) if p.name.startswith(".part-")]
        return bool(hidden) and hidden[0].stat().st_size > 0

    # Flushed to its hidden file long before rotation; a reader sees nothing yet.
    await wait_until(flushed, timeout=0.8)
    assert hidden[0].name.endswith(".jsonl.inprogress")
    assert visible_parts(tmp_path) == []
    await wait_until(lambda: log.files_completed == 1)
    assert len(visible_parts(tmp_path)) == 1
    log.write(event(1))
    await log.close()
    files = visible_parts(tmp_path)
    assert len(files) == 2 and files == all_files(tmp_path)
    assert [d["wait_ms"] for d in read_lines(files)] == [0, 1]


async def test_the_writer_wakes_only_when_something_is_due(tmp_path: Path):
    """Idle, the writer waits for the next event. With a JSON-lines file open it wakes
    for the flush; with a Parquet file, which has nothing to flush, only for its rotation."""
    for fmt, due in ((JSONL, 1.0), (PARQUET, 100.0)):
        log = EventLog(str(tmp_path / fmt), "p1", log_format=fmt, max_age_seconds=100.0)
        assert log._next_wakeup() is None
        log._append(event(0))  # as the writer thread would: it is not started here
        wake = log._next_wakeup()
        assert wake is not None and due - 0.5 < wake <= due, (fmt, wake)
        for f in list(log._files.values()):  # the writer thread's work, on this one
            log._complete(f)
        await log.close()
        assert [d["wait_ms"] for d in read_lines(visible_parts(tmp_path / fmt))] == [0]


async def test_full_queue_drops_and_counts(tmp_path: Path, fmt: EventLogFormat):
    log = EventLog(
        str(tmp_path), "p1", log_format=fmt, queue_size=3
    )  # not started: nothing drains yet
    results = [log.write(event(i)) for i in range(5)]
    assert results == [True, True, True, False, False]
    assert log.dropped == 2
    assert log.stats()["pending"] == 3
    await log.close()  # starts the writer to drain what was queued
    assert [d["wait_ms"] for d in read_lines(visible_parts(tmp_path))] == [0, 1, 2]
    assert (log.written, log.dropped) == (3, 2)


# --- file I/O happens on the writer thread only ----------------------------------------------


# Audit hooks cannot be removed; this one is inert unless a test has set a root to watch.
@dataclass
class _Watch:
    """What the audit hook (installed once per process) records: file events under root."""

    root: str | None = None
    seen: list[tuple[str, str]] = field(default_factory=list)


_watch = _Watch()
_hook_installed = False
_FS_EVENTS = {"open", "os.rename", "os.mkdir", "os.truncate", "os.remove"}


def _audit(name: str, args: tuple) -> None:
    root = _watch.root
    if root is None or name not in _FS_EVENTS or not args:
        return
    path = args[0]
    if isinstance(path, str | bytes | os.PathLike) and os.fsdecode(path).startswith(root):
        _watch.seen.append((name, threading.current_thread().name))


async def test_file_io_happens_on_the_writer_thread(tmp_path: Path, fmt: EventLogFormat):
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True
    seen: list[tuple[str, str]] = []
    _watch.root, _watch.seen = str(tmp_path), seen
    try:
        log = EventLog(str(tmp_path), "p1", log_format=fmt, max_bytes=len(event(0).to_json()) * 3)
        log.start()
        for i in range(20):
            assert log.write(event(i))
            # write() returned, on the loop thread, without touching a file.
            assert all(thread == WRITER_THREAD_NAME for _, thread in seen)
        await log.close()
    finally:
        _watch.root, _watch.seen = None, []
    names = {name for name, _ in seen}
    assert {"open", "os.rename", "os.mkdir"} <= names
    assert {thread for _, thread in seen} == {WRITER_THREAD_NAME}


async def test_crashed_run_leftovers_are_recovered_whole(tmp_path: Path):
    day = tmp_path / "proxy=p1" / "date=2024-02-28"
    day.mkdir(parents=True)
    good = event(0).to_json() + b"\n" + event(1).to_json() + b"\n"
    (day / ".part-20240228T235959-00001.jsonl.inprogress").write_bytes(good + b'{"ts":17')
    (day / ".part-20240228T235959-00002.jsonl.inprogress").write_bytes(b'{"ts":1')  # no line
    log = EventLog(str(tmp_path), "p1", log_format=JSONL)
    log.start()
    log.write(event(2))
    await log.close()
    assert (log.files_recovered, log.files_discarded) == (1, 1)
    files = all_files(tmp_path)
    assert files == visible_parts(tmp_path)
    assert files[0].name == "part-20240228T235959-00001.jsonl"
    assert files[0].read_bytes() == good
    assert [d["wait_ms"] for d in read_lines(files)] == [0, 1, 2]


async def test_a_crashed_runs_parquet_is_kept_whole_or_removed(tmp_path: Path):
    """A Parquet file is readable only with its footer: one a crash left complete (between
    its footer and its rename) is published; one cut off before is removed, counted, and
    breaks no reader. Either format's leftovers are found, whatever this run writes."""
    day = tmp_path / "proxy=p1" / "date=2024-02-28"
    day.mkdir(parents=True)
    whole = day / ".part-20240228T235959-00001.parquet.inprogress"
    with whole.open("xb") as fh:
        writer = parquet_writer(fh)
        writer.write_batch(record_batch([event(0), event(1)]))
        writer.close()
    footless = day / ".part-20240228T235959-00002.parquet.inprogress"
    footless.write_bytes(whole.read_bytes()[:-20])
    torn = day / ".part-20240228T235959-00003.jsonl.inprogress"
    torn.write_bytes(event(2).to_json() + b"\n" + b'{"ts":1')
    log = EventLog(str(tmp_path), "p1", log_format=PARQUET)
    log.start()
    log.write(event(3))
    await log.close()
    assert (log.files_recovered, log.files_discarded) == (2, 1)
    files = all_files(tmp_path)
    assert files == visible_parts(tmp_path)  # nothing hidden left
    assert [f.name for f in files[:2]] == [
        "part-20240228T235959-00001.parquet",
        "part-20240228T235959-00003.jsonl",
    ]
    assert sorted(d["wait_ms"] for d in read_lines(files)) == [0, 1, 2, 3]


async def test_concurrent_closes_all_wait_for_the_files(tmp_path: Path, fmt: EventLogFormat):
    log = EventLog(str(tmp_path), "p1", log_format=fmt)
    log.start()
    for i in range(100):
        log.write(event(i))
    await asyncio.gather(log.close(), log.close())
    assert log.files_completed == 1
    await log.close()  # and later ones return at once
    assert len(read_lines(visible_parts(tmp_path))) == 100
