"""constraints.txt (``make lock``) pins every Python dependency the three pyproject files
name: a dependency added to a pyproject without ``make lock`` would install at whatever
version is newest that day, on CI and on every fresh machine."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECTS = [REPO / "pyproject.toml", REPO / "broker_stub" / "pyproject.toml",
              REPO / "analytics" / "pyproject.toml"]  # fmt: skip
# The extras of the proxy that .venv installs (constraints.in).
EXTRAS = ("dev", "bench")


def _name(requirement: str) -> str:
    """The normalized project name of a requirement string (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match[1]).lower()


def _ours() -> set[str]:
    return {_name(tomllib.loads(p.read_text())["project"]["name"]) for p in PYPROJECTS}


def _required() -> set[str]:
    names: set[str] = set()
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        names |= {_name(r) for r in project.get("dependencies", [])}
        for extra in EXTRAS:
            names |= {_name(r) for r in project.get("optional-dependencies", {}).get(extra, [])}
    return names - _ours()


def _pinned() -> dict[str, list[str]]:
    """Name -> the lines of constraints.txt that pin it (one per marker where they differ)."""
    pins: dict[str, list[str]] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            pins.setdefault(_name(line), []).append(line)
    return pins


def test_every_dependency_of_the_pyprojects_is_pinned():
    missing = _required() - set(_pinned())
    assert not missing, f"not in constraints.txt: {sorted(missing)}; run `make lock`"


def test_the_lock_pins_exact_versions_and_none_of_our_distributions():
    # pip refuses an editable or a path as a constraint, and our own distributions are
    # installed from the tree.
    pins = _pinned()
    assert not set(pins) & _ours(), sorted(set(pins) & _ours())
    for lines in pins.values():
        for line in lines:
            assert re.match(r"^[A-Za-z0-9._-]+==[^ ;]+( ; .+)?$", line), line
