"""The repository's three distributions and the console scripts they declare."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The proxy (the root), the broker stub, the polling report job.
PROJECTS = (REPO, REPO / "broker_stub", REPO / "analytics")


def declared_scripts() -> dict[str, str]:
    """Every console script of every distribution: name -> entry point."""
    scripts: dict[str, str] = {}
    for project in PROJECTS:
        data = tomllib.loads((project / "pyproject.toml").read_text())
        scripts.update(data["project"]["scripts"])
    return scripts
