"""Reading the proxy's event log back, in either format: for tests and tools that check
what a proxy wrote."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from proxy.observability.eventlog_parquet import EVENT_SCHEMA


def part_files(root: Path) -> list[Path]:
    """The visible (complete) part files under ``root``, in write order: by day, then by
    name (the stamp and sequence number). Hidden in-progress files are left out."""
    return sorted(root.rglob("part-*.*"), key=lambda p: (p.parent.name, p.name))


def read_records(files: Iterable[Path]) -> list[dict[str, Any]]:
    """The records of ``files``, each a Parquet file of the proxy's schema or whole JSON
    lines (a file that is neither fails with ValueError)."""
    out: list[dict[str, Any]] = []
    for f in files:
        if f.suffix == ".parquet":
            table = pq.read_table(f)
            if not table.schema.equals(EVENT_SCHEMA):
                raise ValueError(f"{f}: not the event log's schema: {table.schema}")
            out.extend(table.to_pylist())
        elif f.suffix == ".jsonl":
            data = f.read_bytes()
            if data and not data.endswith(b"\n"):
                raise ValueError(f"{f}: a torn last line")
            out.extend(orjson.loads(line) for line in data.splitlines())
        else:
            raise ValueError(f"{f}: not an event-log part file")
    return out


def record_count(path: Path) -> int:
    """How many records ``path`` holds, without reading them all."""
    if path.suffix == ".parquet":
        return pq.ParquetFile(path).metadata.num_rows
    return path.read_bytes().count(b"\n")
