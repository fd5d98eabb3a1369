"""Fixtures shared by the deploy tests: the repository's ops files and a runnable copy of
deploy/prometheus with its targets written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
GRAFANA_DIR = REPO / "grafana"


@pytest.fixture(scope="session")
def make_prometheus_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``make(proxies, pushgateway)``: copy deploy/prometheus (without its tests) into a new
    temporary directory, write targets/*.json as a deployment does, and return the path of
    the copied prometheus.yml."""

    def make(proxies: list[str], pushgateway: str) -> Path:
        target = tmp_path_factory.mktemp("prometheus-config") / "prometheus"
        shutil.copytree(PROMETHEUS_DIR, target, ignore=shutil.ignore_patterns("targets", "tests"))
        (target / "targets").mkdir()
        (target / "targets" / "proxies.json").write_text(json.dumps([{"targets": proxies}]))
        (target / "targets" / "pushgateway.json").write_text(
            json.dumps([{"targets": [pushgateway]}])
        )
        return target / "prometheus.yml"

    return make
