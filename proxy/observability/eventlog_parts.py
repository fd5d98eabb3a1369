"""The two formats of an event-log part file: Parquet (the default) and JSON lines.

Both write the same ``ReceiveEvent`` fields, in its order, under the same layout; the
writer thread of ``eventlog.EventLog`` owns a part from its hidden open to its rename.

- **Parquet** (``eventlog_parquet``): columnar, dictionary-encoded and zstd-compressed;
  the Spark job reads only the columns it needs and converts no text. Rows are held in
  memory and written a row group at a time; the footer that makes the file readable is
  written when it completes. A file a crash left without its footer cannot be read, so
  its rows are lost: at most one rotation's worth (``event_log_max_age_s``) per crash.
- **JSON lines**: one object per line, for people who read the log with their own tools.
  Lines reach the OS within a flush interval, and a crash loses at most that much: the
  next start publishes the file's whole lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from proxy.config import EventLogFormat

if TYPE_CHECKING:
    from proxy.observability.receive_event import ReceiveEvent


class RowsLost(Exception):
    """Rows a part took and could not write (a row group that did not encode or write):
    ``rows`` of them, the event being added among them. The file goes on: if the failure
    broke it, its ``finish`` fails, and its other rows are lost then."""

    def __init__(self, rows: int, cause: BaseException) -> None:
        super().__init__(f"{rows} rows lost: {type(cause).__name__}: {cause}")
        self.rows = rows


class PartWriter(Protocol):
    """The content of one open part file, in one format. ``add`` and ``finish`` raise
    ``RowsLost`` for the rows they dropped; any other exception from ``add`` loses the
    event being added, from ``finish`` the file."""

    # Whether ``flush`` does anything: the writer wakes within a flush interval of a write
    # only for a format that does.
    flushes: bool

    @property
    def size(self) -> int:
        """Bytes the file has, or will have for rows not written yet: rotation's measure."""
        ...

    def add(self, event: ReceiveEvent) -> None: ...

    def flush(self) -> None:
        """Push what is buffered towards the OS, where the format gains by it."""
        ...

    def finish(self) -> None:
        """Write the rest and whatever makes the file whole; the caller fsyncs and closes."""
        ...


class JsonLinesPart:
    """One JSON-lines part file: each event a line, buffered until a flush."""

    flushes = True

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self.size = 0

    def add(self, event: ReceiveEvent) -> None:
        line = event.to_json() + b"\n"
        self._fh.write(line)
        self.size += len(line)

    def flush(self) -> None:
        self._fh.flush()

    def finish(self) -> None:
        self._fh.flush()


def prepare(log_format: EventLogFormat) -> None:
    """Load what ``log_format`` needs (pyarrow: over 100 ms of CPU), at the proxy's start
    rather than at its first event."""
    if log_format is EventLogFormat.PARQUET:
        import proxy.observability.eventlog_parquet  # noqa: F401


def open_part(log_format: EventLogFormat, fh: BinaryIO) -> PartWriter:
    if log_format is EventLogFormat.PARQUET:
        # Imported here: pyarrow costs a process tens of megabytes, paid only when used.
        from proxy.observability.eventlog_parquet import ParquetPart

        return ParquetPart(fh)
    return JsonLinesPart(fh)


def salvage(log_format: EventLogFormat, path: Path) -> bool:
    """Make the part file a crash left at ``path`` whole, if any of it can be kept: True
    when it is ready to publish, False when nothing of it can be read (then remove it).

    JSON lines: the lines up to the last newline are kept, a torn last line cut off.
    Parquet: kept only if its footer was written (the crash came between completing the
    file and renaming it); without it the file cannot be read at all.
    """
    if log_format is EventLogFormat.PARQUET:
        from proxy.observability.eventlog_parquet import readable

        return readable(path)
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep == 0:
        return False
    if keep < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(keep)
    return True
