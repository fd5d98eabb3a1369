"""Per-(group, topic) adaptive thresholds from a file, reloaded while the proxy runs.

The file (``receive.adaptive_thresholds_file``; JSON, or TOML when it ends in ``.toml``)
is what ``rmq-polling-report --thresholds-out`` writes::

    {"thresholds": [{"group": "g", "topic": "t", "high_rate": 40.0, "low_rate": 20.0}]}

A (group, topic) not listed keeps ``adaptive_high_rate`` / ``adaptive_low_rate``. Every
``adaptive_thresholds_check_s`` the watcher stats the file in a worker thread and, when its
mtime, size or inode changed, reads and parses it there too; the event loop only swaps the
table in. A file that does not parse or holds a bad entry is refused with one log line and
the thresholds in force stay; a removed file brings back the defaults.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.background import start_background, stop_background
from proxy.receive.adaptive import Thresholds

log = logging.getLogger(__name__)

MAX_BYTES = 16 * 1024 * 1024
MAX_ENTRIES = 100_000
_ENTRY_KEYS = {"group", "topic", "high_rate", "low_rate"}

Table = Mapping[tuple[str, str], Thresholds]
Signature = tuple[int, int, int]  # mtime_ns, size, inode


class ThresholdsError(ValueError):
    """The file is not a valid thresholds file; the message says why."""


def parse(data: bytes, toml: bool = False) -> dict[tuple[str, str], Thresholds]:
    """The table a thresholds file holds; ThresholdsError if anything in it is wrong."""
    try:
        doc: Any = tomllib.loads(data.decode()) if toml else json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:  # JSON and TOML errors are ValueErrors
        raise ThresholdsError(f"does not parse: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("thresholds"), list):
        raise ThresholdsError('needs a "thresholds" list at the top')
    entries: list[Any] = doc["thresholds"]
    if len(entries) > MAX_ENTRIES:
        raise ThresholdsError(f"{len(entries)} entries, more than {MAX_ENTRIES}")
    table: dict[tuple[str, str], Thresholds] = {}
    for i, entry in enumerate(entries):
        where = f"thresholds[{i}]"
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            raise ThresholdsError(f"{where}: needs exactly {sorted(_ENTRY_KEYS)}")
        group, topic = entry["group"], entry["topic"]
        if not (isinstance(group, str) and group and isinstance(topic, str) and topic):
            raise ThresholdsError(f"{where}: group and topic must be non-empty strings")
        high, low = _rate(entry["high_rate"], where), _rate(entry["low_rate"], where)
        if not 0 <= low <= high or high <= 0:
            raise ThresholdsError(f"{where}: needs 0 <= low_rate <= high_rate, high_rate > 0")
        if (group, topic) in table:
            raise ThresholdsError(f"{where}: {group}/{topic} listed twice")
        table[(group, topic)] = Thresholds(high, low)
    return table


def _rate(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ThresholdsError(f"{where}: rates must be finite numbers, not {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class _Check:
    """What one look at the file found: nothing new, gone, a table, or a refusal."""

    signature: Signature | None  # None: the file is gone
    table: dict[tuple[str, str], Thresholds] | None = None
    error: str | None = None


def _look(path: Path, seen: Signature | None) -> _Check | None:
    """Runs in a worker thread. None when the file did not change since ``seen``."""
    try:
        st = os.stat(path)  # follows symlinks: a ConfigMap swaps its ..data link
    except FileNotFoundError:
        return None if seen is None else _Check(None)
    signature = (st.st_mtime_ns, st.st_size, st.st_ino)
    if signature == seen:
        return None
    if st.st_size > MAX_BYTES:
        return _Check(signature, error=f"{st.st_size} bytes, more than {MAX_BYTES}")
    try:
        data = path.read_bytes()
        return _Check(signature, table=parse(data, toml=path.suffix == ".toml"))
    except FileNotFoundError:
        return _Check(None)
    except (OSError, ThresholdsError) as exc:
        return _Check(signature, error=str(exc))


class ThresholdsFile:
    """Watches one thresholds file and hands each good version to ``apply``; the defaults
    are an empty table. ``start`` once the loop runs, ``close`` on stop."""

    def __init__(self, path: str, check_s: float, apply: Callable[[Table], None]) -> None:
        self.path = Path(path)
        self.check_s = check_s
        self.apply = apply
        self.loaded: int | None = None  # entries in force from the file; None: defaults
        self.refused = 0  # versions refused
        self._seen: Signature | None = None  # the version last looked at, good or bad
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Look at the file once (in a thread) and apply what changed."""
        found = await asyncio.to_thread(_look, self.path, self._seen)
        if found is None:
            return
        self._seen = found.signature
        if found.signature is None:
            log.warning("adaptive thresholds file %s removed: back to the defaults", self.path)
            self.loaded = None
            self.apply({})
        elif found.error is not None:
            self.refused += 1
            kept = "the defaults" if self.loaded is None else f"the {self.loaded} loaded before"
            log.error(
                "adaptive thresholds file %s refused (%s); keeping %s", self.path, found.error, kept
            )
        else:
            assert found.table is not None
            self.loaded = len(found.table)
            self.apply(found.table)
            log.info("adaptive thresholds: %d (group, topic) from %s", self.loaded, self.path)

    def start(self) -> None:
        self._task = start_background(self._run(), name=f"thresholds-reload {self.path}", log=log)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            try:
                await self.check()
            except Exception:  # the next check tries again
                log.exception("checking adaptive thresholds file %s failed", self.path)

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_background(task)

    def status(self) -> dict[str, object]:
        return {"path": str(self.path), "loaded": self.loaded, "refused": self.refused}
