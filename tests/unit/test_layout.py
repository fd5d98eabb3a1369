"""What the README says of the repository's layout and its test command, held by a test:
``bench/`` and ``tests/`` share code only through ``testkit/``, and ``make test`` runs every
check ``make lint`` runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _importers(tree: str, package: str) -> list[str]:
    return sorted(
        str(path.relative_to(REPO))
        for path in (REPO / tree).rglob("*.py")
        if any(name == package or name.startswith(f"{package}.") for name in _imports(path))
    )


def test_bench_and_tests_never_import_each_other():
    assert _importers("tests", "bench") == []
    assert _importers("bench", "tests") == []


def _recipe(target: str) -> list[str]:
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert match, f"no {target} target"
    return [line.strip() for line in match[1].splitlines()]


def test_make_test_runs_every_lint_check():
    assert set(_recipe("lint")) <= set(_recipe("test"))


def test_make_test_runs_the_check_on_every_python_the_package_claims():
    """The suite runs on the lowest claimed Python (the machines' python3); make test runs
    check-pythons on every other one."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: 3."
    claimed = sorted(
        (c.removeprefix("Programming Language :: Python :: ") for c in project["classifiers"]
         if c.startswith(prefix)),
        key=lambda v: tuple(map(int, v.split("."))),
    )  # fmt: skip
    assert project["requires-python"] == f">={claimed[0]}"
    others = re.search(r"^CHECK_PYTHONS \?= (.*)$", (REPO / "Makefile").read_text(), re.M)
    assert others, "no CHECK_PYTHONS in the Makefile"
    assert others[1].split() == claimed[1:]
    assert "$(MAKE) --no-print-directory check-pythons" in _recipe("test")


def test_the_readme_stays_the_front_door():
    """The README is the front door: under 1,600 words; the rest belongs in docs/."""
    words = len((REPO / "README.md").read_text().split())
    assert words < 1600, f"README.md has {words} words"
