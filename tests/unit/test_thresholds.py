"""The per-(group, topic) thresholds file: parsing, and reloading real files (good, bad,
removed) with the watcher's own check and with its timer task."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from proxy.receive.adaptive import Thresholds
from proxy.receive.thresholds import Table, ThresholdsError, ThresholdsFile, parse
from testkit.waits import wait_until


def doc(*entries: tuple[str, str, float, float]) -> str:
    return json.dumps(
        {
            "thresholds": [
                {"group": g, "topic": t, "high_rate": h, "low_rate": lo} for g, t, h, lo in entries
            ]
        }
    )


def write(path: Path, text: str) -> None:
    """Write as a deployment does: a new file renamed over the old (new inode, new mtime)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_parse_json_and_toml() -> None:
    assert parse(doc(("g", "t", 40, 20)).encode()) == {("g", "t"): Thresholds(40.0, 20.0)}
    toml = b'[[thresholds]]\ngroup = "g"\ntopic = "t"\nhigh_rate = 8.5\nlow_rate = 4\n'
    assert parse(toml, toml=True) == {("g", "t"): Thresholds(8.5, 4.0)}
    assert parse(b'{"thresholds": []}') == {}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "does not parse"),
        ('{"other": []}', '"thresholds" list'),
        ('{"thresholds": [{"group": "g", "topic": "t", "high_rate": 1}]}', "needs exactly"),
        (doc(("g", "t", 10, 20)), "low_rate <= high_rate"),
        (doc(("g", "t", 0, 0)), "high_rate > 0"),
        (doc(("g", "t", -5, -10)), "low_rate <= high_rate"),
        (doc(("", "t", 10, 5)), "non-empty strings"),
        (doc(("g", "t", 10, 5), ("g", "t", 20, 5)), "listed twice"),
        (
            '{"thresholds": [{"group": "g", "topic": "t", "high_rate": "50", "low_rate": 1}]}',
            "finite numbers",
        ),
        (
            '{"thresholds": [{"group": "g", "topic": "t", "high_rate": true, "low_rate": 1}]}',
            "finite numbers",
        ),
    ],
)
def test_parse_refuses_a_bad_file_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ThresholdsError, match=reason):
        parse(text.encode())


class Applied:
    def __init__(self) -> None:
        self.tables: list[Table] = []

    def __call__(self, table: Table) -> None:
        self.tables.append(table)


async def test_good_bad_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "thresholds.json"
    applied = Applied()
    watcher = ThresholdsFile(str(path), 5.0, applied)
    caplog.set_level(logging.INFO, "proxy.receive.thresholds")

    await watcher.check()  # no file: the defaults, nothing applied
    assert applied.tables == [] and watcher.loaded is None

    write(path, doc(("g", "t", 40, 20), ("h", "t", 5, 1)))
    await watcher.check()
    assert applied.tables[-1] == {("g", "t"): Thresholds(40, 20), ("h", "t"): Thresholds(5, 1)}
    assert watcher.loaded == 2

    await watcher.check()  # unchanged: not read again
    assert len(applied.tables) == 1

    caplog.clear()
    write(path, doc(("g", "t", 10, 20)))
    await watcher.check()
    assert len(applied.tables) == 1  # refused: the previous table stays
    assert watcher.refused == 1
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert str(path) in record.getMessage()
    assert "low_rate <= high_rate" in record.getMessage()
    assert "keeping the 2 loaded before" in record.getMessage()
    await watcher.check()  # the same bad version: refused once, not logged again
    assert watcher.refused == 1

    write(path, doc(("g", "t", 30, 15)))
    await watcher.check()
    assert applied.tables[-1] == {("g", "t"): Thresholds(30, 15)}

    path.unlink()
    await watcher.check()
    assert applied.tables[-1] == {} and watcher.loaded is None  # the defaults again
    assert "removed" in caplog.records[-1].getMessage()


async def test_the_timer_task_reloads_and_stops_on_close(tmp_path: Path) -> None:
    path = tmp_path / "thresholds.toml"
    write(path, '[[thresholds]]\ngroup = "g"\ntopic = "t"\nhigh_rate = 9\nlow_rate = 3\n')
    applied = Applied()
    watcher = ThresholdsFile(str(path), 0.05, applied)
    await watcher.check()
    watcher.start()
    try:
        write(path, '[[thresholds]]\ngroup = "g"\ntopic = "t"\nhigh_rate = 7\nlow_rate = 2\n')
        await wait_until(
            lambda: applied.tables[-1] == {("g", "t"): Thresholds(7, 2)},
            timeout=5,
            step=0.02,
            what="the rewritten file applied",
        )
        task = watcher._task
        assert task is not None and not task.done()
    finally:
        await watcher.close()
    assert task.cancelled()
