"""docs/configuration.md is what ``make config-doc`` writes from the configuration
dataclasses, and says what every setting does."""

from __future__ import annotations

from pathlib import Path

from proxy.config_doc import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_is_current():
    assert DOC.read_text() == render(), "docs/configuration.md is stale: run make config-doc"


def test_every_setting_says_what_it_does():
    rows = [line for line in render().splitlines() if line.startswith("| `")]
    assert len(rows) > 60
    blank = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert not blank, f"settings without a comment in the code: {blank}"
