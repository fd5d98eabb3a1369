"""Every benchmark entry point the Makefile runs starts: its module imports and parses its
arguments (``--help``). A benchmark is run by hand, rarely; a broken import must show
here, not the day someone runs ``make bench``."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def makefile_modules() -> list[str]:
    text = (REPO / "Makefile").read_text()
    return sorted(set(re.findall(r"python -m (bench(?:\.\w+)+)", text)))


def test_the_makefile_runs_the_benchmarks_as_modules():
    assert {"bench.peer", "bench.cold", "bench.bench_proxy", "bench.sim.simulate"} <= set(
        makefile_modules()
    )


@pytest.mark.parametrize("module", makefile_modules())
def test_a_benchmark_entry_point_starts(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0 and "the bench extra" in done.stderr:
        # A chart tool without matplotlib (make bench-* installs the bench extra): it says
        # so and exits non-zero, which is what this checks.
        assert importlib.util.find_spec("matplotlib") is None, done.stderr[-2000:]
        return
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
