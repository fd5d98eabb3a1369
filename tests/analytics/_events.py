"""Writing crafted event logs in the proxy's layout (<dir>/proxy=<id>/date=<day>/part-*), in
either of its formats."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from proxy.config import EventLogFormat
from proxy.observability.eventlog_parquet import parquet_writer, record_batch
from proxy.observability.receive_event import ReceiveEvent


def ms(text: str) -> int:
    """Epoch ms of an ISO UTC time such as ``2024-05-01T10:00:05``."""
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def event(ts: str, proxy: str = "p1", group: str = "g", topic: str = "t", **fields) -> dict:
    """A record with the contract's fields (via the proxy's own ReceiveEvent)."""
    defaults: dict[str, Any] = dict(
        mode="notify",
        is_long_polling=True,
        is_short_polling_hit=False,
        polling_ms=20000,
        wait_ms=10,
        messages=0,
        result="empty",
        pops=1,
        notifications=0,
        broker=None,
    )
    defaults.update(fields)
    return asdict(ReceiveEvent(ts=ms(ts), proxy=proxy, group=group, topic=topic, **defaults))


def write_log(
    root: Path, name: str, events: list[dict], extra_lines: Sequence[str] = (),
    fmt: EventLogFormat = EventLogFormat.JSONL,
) -> Path:  # fmt: skip
    """Write ``events`` (all of one proxy and UTC date) as one part file in ``fmt``, then
    raw lines. A Parquet file cannot hold a malformed line: the raw lines go to a JSON-lines
    file beside it (``<name>-raw.jsonl``), as in a fleet that writes both formats."""
    first = events[0] if events else None
    proxy = first["proxy"] if first else "p1"
    day = datetime.fromtimestamp(first["ts"] / 1000, UTC).date().isoformat() if first else None
    assert all(e["proxy"] == proxy for e in events)
    directory = root / f"proxy={proxy}" / f"date={day}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}{fmt.suffix}"
    if fmt is EventLogFormat.JSONL:
        lines = [json.dumps(e) for e in events] + list(extra_lines)
        path.write_text("".join(line + "\n" for line in lines))
        return path
    with path.open("xb") as fh:
        writer = parquet_writer(fh)
        writer.write_batch(record_batch([ReceiveEvent(**e) for e in events]))
        writer.close()
    if extra_lines:
        raw = directory / f"{name}-raw.jsonl"
        raw.write_text("".join(line + "\n" for line in extra_lines))
    return path
