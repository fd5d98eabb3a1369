"""The exporters' soak (``make soak-exporters``), small: 100 exporters over a two-worker
proxy whose connections age out between rounds; every histogram ends exact."""

from __future__ import annotations

import pytest

from bench.export_soak import run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
async def test_a_short_exporters_soak_counts_every_observation_once():
    report = await run(exporters=100, rounds=3)
    assert report["exports"] == 300, report
    assert all(n > 0 for n in report["exports_per_worker"]), report  # both workers took some
    assert report["on_metrics"] == report["recorded"], report
