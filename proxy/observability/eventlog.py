"""The receive event log: one record per client ReceiveMessage, the Spark job's input.

Layout (docs/design.md, "The event log")::

    <dir>/proxy=<proxy_id>/date=<YYYY-MM-DD>/part-<yyyymmddTHHMMSS>-<seq>.<parquet|jsonl>

The date is the UTC date of the event's ``ts``; the file stamp is the UTC time the file was
opened. A file is written under a hidden name in the same directory
(``.part-....parquet.inprogress``, which Spark and Hadoop readers skip because of the
leading dot) and renamed to its final name once complete, so a reader only ever sees whole
files. The formats, and what a crash costs in each: ``eventlog_parts``.

Threading: the event loop only puts events on a bounded queue (``write`` never blocks and
never touches a file). One writer thread encodes, writes, flushes, rotates and renames.
When the queue is full the event is dropped and counted: losing analytics records is
better than stalling client answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from proxy.config import EventLogFormat
from proxy.observability.eventlog_parts import PartWriter, RowsLost, open_part, prepare, salvage
from proxy.observability.log_every import LogEvery
from proxy.observability.receive_event import ReceiveEvent

log = logging.getLogger(__name__)

WRITER_THREAD_NAME = "eventlog-writer"
TMP_PREFIX = "."
TMP_SUFFIX = ".inprogress"
_MS_PER_DAY = 86_400_000
_BUFFER_BYTES = 256 * 1024
# At most this many queued events are written between housekeeping checks, so a steady
# stream cannot postpone the once-a-second flush or an age rotation.
_BATCH = 1000
# After an event wakes the writer, it waits this long for more before it writes: one wake-up
# (and one taking of the GIL from the event loop) for a batch, not for each event. At the
# queue's default 10,000 places this drops nothing below 200,000 events a second.
_LINGER_S = 0.05
LOSS_LOG_EVERY_S = 60.0


@dataclass(slots=True)
class _OpenFile:
    """A part file being written under its hidden name."""

    date: str
    directory: Path
    stem: str  # "part-<stamp>-<seq>"
    suffix: str  # ".parquet" or ".jsonl"
    fh: BinaryIO
    part: PartWriter
    opened: float  # monotonic, like the other times
    last_write: float
    dirty_since: float | None = None  # first write not yet flushed
    rows: int = 0  # events taken and not lost: counted in ``written``

    @property
    def tmp_path(self) -> Path:
        return self.directory / f"{TMP_PREFIX}{self.stem}{self.suffix}{TMP_SUFFIX}"


_STOP = object()


class EventLog:
    """Writes ``ReceiveEvent`` records to rotated part files from one background thread."""

    def __init__(
        self,
        directory: str,
        proxy_id: str,
        *,
        log_format: EventLogFormat = EventLogFormat.PARQUET,
        max_bytes: int = 64 * 1024 * 1024,
        max_age_seconds: float = 300.0,
        queue_size: int = 10_000,
        flush_interval: float = 1.0,
        late_grace_seconds: float = 2.0,
    ) -> None:
        """``late_grace_seconds``: after the event date moves on, the previous date's file
        stays open until it has had no event for this long. Requests that arrived before
        midnight are answered (and logged) after it, interleaved with new-day events;
        closing at the first new-day event would cut a tiny file per interleaving."""
        self.root = Path(directory) / f"proxy={proxy_id}"
        self.proxy_id = proxy_id
        self.format = EventLogFormat(log_format)
        prepare(self.format)
        self.max_bytes = max_bytes
        self.max_age_seconds = max_age_seconds
        self.flush_interval = flush_interval
        self.late_grace_seconds = late_grace_seconds
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        # Counters for the status page. Each is updated by one thread only (``dropped`` by
        # the writers' thread, the rest by the writer thread), so plain ints are enough.
        self.written = 0
        self.dropped = 0
        self.files_completed = 0
        self.files_recovered = 0
        self.files_discarded = 0  # left by a crash with nothing readable
        # Events lost: not in a file (an I/O error, an event that does not encode, the
        # rows of a Parquet row group that failed with it, a file that did not complete).
        # ``written`` counts the events taken into a file (a Parquet file's rows held for
        # its next row group among them), less those lost since.
        self.failed = 0
        self.cpu_s = 0.0  # the writer thread's CPU time
        self._losses = LogEvery(log, LOSS_LOG_EVERY_S)  # the writer thread's only
        self._losses_logged = False
        # Writer-thread state.
        self._files: dict[str, _OpenFile] = {}  # by date
        self._newest_date = ""
        self._seq = 0
        self._day_cache: tuple[int, str] = (-1, "")

    # -- event-loop side ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=WRITER_THREAD_NAME, daemon=True)
        self._thread.start()

    def write(self, event: ReceiveEvent) -> bool:
        """Queue ``event``; False (and counted in ``dropped``) if full or closed.

        The event is serialised later on the writer thread: do not change it after this.
        """
        if self._closed:
            self.dropped += 1
            return False
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    async def close(self) -> None:
        """Write everything queued, complete the open files and stop the thread."""
        if self._closing is None:
            self._closed = True
            if self._thread is None:
                # Never started: still write what was queued rather than lose it.
                self.start()
            # The put may wait for room and the join for the last write: both off the loop.
            self._closing = asyncio.ensure_future(asyncio.to_thread(self._stop_and_join))
        # Shielded: a cancelled caller must not stop the shutdown of the others.
        await asyncio.shield(self._closing)

    def _stop_and_join(self) -> None:
        thread = self._thread
        assert thread is not None
        # Wait for room for the stop marker, unless the writer is gone (then nobody would
        # ever make room).
        while thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                continue
        thread.join()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def stats(self) -> dict[str, int]:
        """Counters for the status page."""
        return {
            "written": self.written,
            "dropped": self.dropped,
            "pending": self.pending,
            "open_files": len(self._files),
            "files_completed": self.files_completed,
            "files_recovered": self.files_recovered,
            "files_discarded": self.files_discarded,
            "failed": self.failed,
            "cpu_ms": round(self.cpu_s * 1000),
        }

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._recover()
        except OSError:
            log.exception("event log: recovering earlier part files under %s failed", self.root)
        stopping = False
        while not stopping:
            try:
                item = self._queue.get(timeout=self._next_wakeup())
            except queue.Empty:
                item = None
            if item is not None and item is not _STOP and self._queue.qsize() < _BATCH:
                time.sleep(_LINGER_S)
            n = 0
            while item is not None:
                if item is _STOP:
                    stopping = True
                    break
                self._append(item)  # type: ignore[arg-type]  # an event once it is not _STOP
                n += 1
                if n >= _BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = None
            self._housekeeping(time.monotonic())
            self.cpu_s = time.thread_time()
        for f in list(self._files.values()):
            self._complete(f)
        self.cpu_s = time.thread_time()

    def _next_wakeup(self) -> float | None:
        """Seconds until the next flush, age rotation or late-day close is due; None when
        nothing is open (the next event, or the stop, wakes the writer)."""
        if not self._files:
            return None
        now = time.monotonic()
        due = now + self.max_age_seconds
        for f in self._files.values():
            due = min(due, f.opened + self.max_age_seconds)
            if f.dirty_since is not None:
                due = min(due, f.dirty_since + self.flush_interval)
            if f.date < self._newest_date:
                due = min(due, f.last_write + self.late_grace_seconds)
        return max(0.0, due - now)

    def _date_of(self, ts_ms: int) -> str:
        day = ts_ms // _MS_PER_DAY
        cached_day, text = self._day_cache
        if day != cached_day:
            text = datetime.fromtimestamp(day * 86_400, tz=UTC).strftime("%Y-%m-%d")
            self._day_cache = (day, text)
        return text

    def _append(self, event: ReceiveEvent) -> None:
        try:
            date = self._date_of(event.ts)
            f = self._files.get(date)
            if f is not None and f.part.size >= self.max_bytes:
                self._complete(f)
                f = None
            if f is None:
                f = self._open(date)
        except Exception as exc:  # I/O, a malformed event: lose the record, never the thread
            self._lost(None, 1, exc)
            return
        f.rows += 1
        self.written += 1
        try:
            f.part.add(event)
        except RowsLost as exc:  # a row group, this event's
            self._lost(f, exc.rows, exc)
            return
        except Exception as exc:  # this event
            self._lost(f, 1, exc)
            return
        now = time.monotonic()
        f.last_write = now
        if f.dirty_since is None and f.part.flushes:
            f.dirty_since = now
        if date > self._newest_date:
            self._newest_date = date

    def _lost(self, f: _OpenFile | None, rows: int, exc: BaseException) -> None:
        """``rows`` events lost, counted in ``failed``, and no longer in ``written`` if they
        were taken into ``f``. A full disk fails every event: the first loss is logged with
        its traceback, then a line at most every ``LOSS_LOG_EVERY_S``."""
        if f is not None:
            f.rows -= rows
            self.written -= rows
        self.failed += rows
        if self._losses_logged:
            self._losses.warning(
                "event log: %d events lost (%d so far): %r", rows, self.failed, exc
            )
            return
        self._losses_logged = True
        log.error("event log: %d events lost (%d so far)", rows, self.failed, exc_info=exc)

    def _housekeeping(self, now: float) -> None:
        for f in list(self._files.values()):
            try:
                if now - f.opened >= self.max_age_seconds or (
                    f.date < self._newest_date and now - f.last_write >= self.late_grace_seconds
                ):
                    self._complete(f)
                elif f.dirty_since is not None and now - f.dirty_since >= self.flush_interval:
                    # Batch writes in the buffer, but push them to the OS within a flush
                    # interval, so a crash of the process loses at most that much.
                    f.part.flush()
                    f.dirty_since = None
            except OSError:
                log.exception("event log: flushing %s failed", f.tmp_path)

    def _open(self, date: str) -> _OpenFile:
        directory = self.root / f"date={date}"
        directory.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        suffix = self.format.suffix
        while True:
            self._seq += 1
            stem = f"part-{stamp}-{self._seq:05d}"
            tmp = directory / f"{TMP_PREFIX}{stem}{suffix}{TMP_SUFFIX}"
            if (directory / f"{stem}{suffix}").exists():
                continue  # left by an earlier run in the same second
            try:
                fh = open(tmp, "xb", buffering=_BUFFER_BYTES)  # noqa: SIM115 (kept open)
            except FileExistsError:
                continue
            try:
                part = open_part(self.format, fh)
            except Exception:
                fh.close()
                tmp.unlink()
                raise
            now = time.monotonic()
            f = _OpenFile(date, directory, stem, suffix, fh, part, opened=now, last_write=now)
            self._files[date] = f
            return f

    def _complete(self, f: _OpenFile) -> None:
        """Finish, fsync and rename ``f`` to its final, visible name."""
        if self._files.get(f.date) is f:
            del self._files[f.date]
        try:
            try:
                f.part.finish()
            except RowsLost as exc:  # its last row group: the rest of the file is whole
                self._lost(f, exc.rows, exc)
            # fsync before the rename: a file that is visible must be whole, even after
            # a power loss.
            os.fsync(f.fh.fileno())
            f.fh.close()
            self._publish(f.tmp_path, f.directory, f.stem, f.suffix)
        except Exception:  # I/O, or an encoding error: lose this file, never the thread
            log.exception("event log: completing %s failed", f.tmp_path)
            with contextlib.suppress(OSError):
                f.fh.close()
            # Its rows are not published (a later start may still recover the hidden
            # file: then they are on disk after all, and counted lost here).
            self._lost(f, f.rows, RuntimeError(f"{f.tmp_path} did not complete"))
            return
        self.files_completed += 1

    @staticmethod
    def _publish(tmp: Path, directory: Path, stem: str, suffix: str) -> None:
        final = directory / f"{stem}{suffix}"
        n = 0
        while final.exists():  # never overwrite a finished file
            n += 1
            final = directory / f"{stem}-{n}{suffix}"
        os.rename(tmp, final)

    def _recover(self) -> None:
        """Publish what part files a crashed earlier run of this proxy id left hidden, in
        either format, can keep (``eventlog_parts.salvage``); remove the rest. Assumes one
        live process per proxy id."""
        if not self.root.is_dir():
            return
        for log_format in EventLogFormat:
            suffix = log_format.suffix
            pattern = f"date=*/{TMP_PREFIX}part-*{suffix}{TMP_SUFFIX}"
            for tmp in sorted(self.root.glob(pattern)):
                size = tmp.stat().st_size
                if not salvage(log_format, tmp):
                    tmp.unlink()
                    if size:
                        self.files_discarded += 1
                        log.warning("event log: %s left by a crash is not readable (%d bytes):"
                                    " removed", tmp, size)  # fmt: skip
                    continue
                stem = tmp.name[len(TMP_PREFIX) : -len(suffix + TMP_SUFFIX)]
                self._publish(tmp, tmp.parent, stem, suffix)
                self.files_recovered += 1
                log.warning("event log: recovered %s", tmp)
