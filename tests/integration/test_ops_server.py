"""OpsServer over real HTTP on a free loopback port."""

from __future__ import annotations

import aiohttp
import pytest

from proxy.observability.metrics import ProxyMetrics
from proxy.observability.ops import OpsServer
from testkit.metrics_text import samples


class State:
    """What the proxy would report: a readiness flag and a status dict."""

    def __init__(self) -> None:
        self.ready = True
        self.status = {"proxy": "p1", "long_polls": 3, "brokers": ["broker-a", "broker-b"]}


@pytest.fixture
async def served():
    metrics = ProxyMetrics(version="1.0.0")
    state = State()
    server = OpsServer(metrics, lambda: state.status, lambda: state.ready)
    port = await server.start()
    assert port > 0
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        yield metrics, state, http
    await server.stop()


async def test_healthz(served):
    _, _, http = served
    async with http.get("/healthz") as resp:
        assert resp.status == 200
        assert await resp.text() == "ok"


async def test_readyz_follows_ready(served):
    _, state, http = served
    async with http.get("/readyz") as resp:
        assert (resp.status, await resp.text()) == (200, "ready")
    state.ready = False
    async with http.get("/readyz") as resp:
        assert (resp.status, await resp.text()) == (503, "not ready")
    state.ready = True
    async with http.get("/readyz") as resp:
        assert resp.status == 200


async def test_status_is_json(served):
    _, state, http = served
    async with http.get("/v1/status") as resp:
        assert resp.status == 200
        assert resp.content_type == "application/json"
        assert await resp.json() == state.status


async def test_metrics(served):
    metrics, state, http = served
    metrics.receive_done("G", "T", "notify", True, False, "found", 0.2)
    state.ready = False
    async with http.get("/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await resp.text()
    assert "rocketmq_proxy_receive_total{" in text
    receives = samples(text, "rocketmq_proxy_receive_total")
    labels = {"group": "G", "is_long_polling": "true", "is_short_polling_hit": "false",
              "mode": "notify", "result": "found", "topic": "T"}  # fmt: skip
    assert receives == [(labels, 1.0)]
    assert samples(text, "rocketmq_proxy_ready") == [({}, 0.0)]  # in step with /readyz
    assert samples(text, "rocketmq_proxy_build_info") == [({"version": "1.0.0"}, 1.0)]

    # Prometheus asks for OpenMetrics and gets it.
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    async with http.get("/metrics", headers=headers) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert (await resp.text()).endswith("# EOF\n")


async def test_stop_releases_the_port():
    server = OpsServer(ProxyMetrics(), dict, lambda: True)
    port = await server.start()
    await server.stop()
    await server.stop()  # idempotent
    again = OpsServer(ProxyMetrics(), dict, lambda: True)
    assert await again.start(port=port) == port
    await again.stop()
