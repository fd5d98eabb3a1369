"""The event log in Parquet: the record's schema, the writer's settings, and a part file.

Imported only where the format is used: pyarrow costs a process tens of megabytes.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from proxy.observability.eventlog_parts import RowsLost

if TYPE_CHECKING:
    from proxy.observability.receive_event import ReceiveEvent

# The record's columns, in ``ReceiveEvent``'s order, with their Parquet types: the schema the
# Spark job (polling_report.schema) and docs/design.md share. Every field but ``broker``
# (none when nothing was delivered) is always there.
EVENT_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.int64(), nullable=False),  # epoch ms
        pa.field("proxy", pa.string(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("is_long_polling", pa.bool_(), nullable=False),
        pa.field("is_short_polling_hit", pa.bool_(), nullable=False),
        pa.field("polling_ms", pa.int64(), nullable=False),
        pa.field("wait_ms", pa.int64(), nullable=False),
        pa.field("messages", pa.int64(), nullable=False),
        pa.field("result", pa.string(), nullable=False),
        pa.field("pops", pa.int64(), nullable=False),
        pa.field("notifications", pa.int64(), nullable=False),
        pa.field("broker", pa.string(), nullable=True),
    ]
)
# Rows per row group: large enough that each column's dictionary and compression pay off,
# small enough that the rows held in memory stay a few megabytes.
ROW_GROUP_ROWS = 65_536
# Arrival times rise within a file: stored as deltas, not through a dictionary. Every
# other column repeats a few values (names, modes, flags, small counts).
WRITE_OPTIONS: dict[str, object] = dict(
    compression="zstd",
    use_dictionary=[f.name for f in EVENT_SCHEMA if f.name != "ts"],
    column_encoding={"ts": "DELTA_BINARY_PACKED"},
    write_statistics=["ts"],
)
_GETTERS = [(operator.attrgetter(f.name), f.type) for f in EVENT_SCHEMA]


def record_batch(events: list[ReceiveEvent]) -> pa.RecordBatch:
    """``events`` as one batch of ``EVENT_SCHEMA``'s columns."""
    columns = [pa.array(list(map(get, events)), type=kind) for get, kind in _GETTERS]
    return pa.RecordBatch.from_arrays(columns, schema=EVENT_SCHEMA)


def parquet_writer(sink: BinaryIO | str) -> pq.ParquetWriter:
    """A writer of event-log Parquet with the proxy's settings (also the benchmark's)."""
    return pq.ParquetWriter(sink, EVENT_SCHEMA, **WRITE_OPTIONS)


class ParquetPart:
    """One Parquet part file: rows held until a row group is full, the footer at the end."""

    flushes = False

    def __init__(self, fh: BinaryIO, row_group_rows: int | None = None) -> None:
        self._fh = fh
        self._writer = parquet_writer(fh)
        self._row_group_rows = row_group_rows or ROW_GROUP_ROWS
        self._rows: list[ReceiveEvent] = []
        self._written = 0  # bytes of the row groups written so far
        self._row_bytes = 16.0  # per row, as the last row group came out; a guess before

    @property
    def size(self) -> int:
        return self._written + int(len(self._rows) * self._row_bytes)

    def add(self, event: ReceiveEvent) -> None:
        self._rows.append(event)
        if len(self._rows) >= self._row_group_rows:
            self._write_row_group()

    def flush(self) -> None:
        """Nothing: a file without its footer cannot be read, so rows written early would
        be lost in a crash all the same, in smaller, worse-compressed row groups."""

    def finish(self) -> None:
        try:
            self._write_row_group()
        finally:  # the rows written before a last row group that failed stay readable
            self._writer.close()  # the footer; the file object stays open
            self._fh.flush()

    def _write_row_group(self) -> None:
        rows, self._rows = self._rows, []  # dropped if they cannot be written: not retried
        if not rows:
            return
        try:
            batch = record_batch(rows)  # an event of the wrong type fails here, for all
            self._writer.write_batch(batch, row_group_size=len(rows))
        except Exception as exc:  # gone either way; a file it broke fails at its finish
            raise RowsLost(len(rows), exc) from exc
        written = self._fh.tell()
        self._row_bytes = max(1.0, (written - self._written) / len(rows))
        self._written = written


def readable(path: Path) -> bool:
    """Whether ``path`` is a whole Parquet file (its footer written)."""
    try:
        pq.read_metadata(path)
    except (pa.ArrowException, OSError):
        return False
    return True
