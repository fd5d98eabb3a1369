"""grafana/: every dashboard validates against Grafana's own dashboard schema, which a node
script generates from the TypeScript types of the npm package @grafana/schema
(tests/deploy/node, installed by `make deploy-node-deps`); the schema rejects broken
dashboards; the queries name only metrics that exist; provisioning matches the deployments.

The PromQL itself is evaluated against a live Prometheus in test_prometheus_live.py."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from proxy.observability.client_totals import ClientHistograms
from proxy.observability.metrics import ProxyMetrics
from tests.deploy.conftest import GRAFANA_DIR, REPO

NODE_DIR = REPO / "tests" / "deploy" / "node"
SCHEMA_SCRIPT = NODE_DIR / "dashboard-schema.mjs"
DASHBOARDS = sorted((GRAFANA_DIR / "dashboards").glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
# The gauges the Spark job pushes (the contract between analytics/polling_report and the dashboard).
REPORT_GAUGES = {
    "rocketmq_polling_report_requests",
    "rocketmq_polling_report_request_rate",
    "rocketmq_polling_report_long_poll_share",
    "rocketmq_polling_report_short_poll_hit_ratio",
    "rocketmq_polling_report_found_ratio",
    "rocketmq_polling_report_broker_requests_per_message",
    "rocketmq_polling_report_wait_seconds",
    "rocketmq_polling_report_recommended_threshold_rps",
    "rocketmq_polling_report_window_end_timestamp_seconds",
    "rocketmq_polling_report_malformed_lines",
    "rocketmq_polling_report_records",
}
# The proxy's own metrics, the Spark job's, and the clients' histograms the proxy exports
# (client_metrics.mode = proxy).
CLIENT_HISTOGRAMS = "send_cost_time|delivery_latency|await_time|process_time"
METRIC = re.compile(
    rf"\b(rocketmq_(?:proxy_[a-z_]+|polling_report_[a-z_]+|(?:{CLIENT_HISTOGRAMS})_[a-z]+))\b"
)


def load(name: str) -> dict:
    return json.loads((GRAFANA_DIR / "dashboards" / f"{name}.json").read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels included, rows themselves left out."""
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p["targets"]]


@pytest.fixture(scope="module")
def dashboard_schema() -> dict:
    node = shutil.which("node")
    if node is None:
        raise AssertionError("node is not on PATH (Node.js 20 generates the dashboard schema)")
    if not (NODE_DIR / "node_modules" / "@grafana" / "schema").exists():
        raise AssertionError(f"{NODE_DIR}/node_modules is missing: run `make deploy-node-deps`")
    result = subprocess.run(
        [node, str(SCHEMA_SCRIPT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def errors(schema: dict, dashboard: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(dashboard)
    ]


def test_there_are_the_two_dashboards():
    assert {p.stem for p in DASHBOARDS} == {"proxy-overview", "polling-analytics"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_validates_against_grafana_schema(dashboard_schema, path):
    assert errors(dashboard_schema, json.loads(path.read_text())) == []


def _set(d: dict, path: list, value) -> None:
    for key in path[:-1]:
        d = d[key]
    d[path[-1]] = value


def _del(d: dict, path: list) -> None:
    for key in path[:-1]:
        d = d[key]
    del d[path[-1]]


# Each a broken dashboard Grafana would refuse or misread.
MUTATIONS = {
    "unknown panel field": lambda d: _set(d, ["panels", 1, "titel"], "typo"),
    "schemaVersion missing": lambda d: _del(d, ["schemaVersion"]),
    "gridPos width as text": lambda d: _set(d, ["panels", 1, "gridPos", "w"], "12"),
    "panel without type": lambda d: _del(d, ["panels", 1, "type"]),
    "unknown variable type": lambda d: _set(d, ["templating", "list", 0, "type"], "dropdown"),
    "row without its panels list": lambda d: _del(d, ["panels", 0, "panels"]),
    "threshold mode misspelt": lambda d: _set(
        d, ["panels", 1, "fieldConfig", "defaults", "thresholds", "mode"], "absolut"
    ),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=str)
def test_schema_rejects_a_broken_dashboard(dashboard_schema, mutation):
    dashboard = load("proxy-overview")
    assert dashboard["panels"][0]["type"] == "row"  # the mutations address these panels
    assert "thresholds" in dashboard["panels"][1]["fieldConfig"]["defaults"]
    broken = copy.deepcopy(dashboard)
    MUTATIONS[mutation](broken)
    assert errors(dashboard_schema, broken), f"schema accepted: {mutation}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_are_well_formed(path):
    """What the schema leaves open (targets are free-form records): every query is PromQL
    on the provisioned datasource, ids and refIds are unique, panels sit on the grid."""
    dashboard = json.loads(path.read_text())
    ids = [p["id"] for p in dashboard["panels"]] + [
        p["id"] for row in dashboard["panels"] if row["type"] == "row" for p in row["panels"]
    ]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert target["expr"].strip()
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == DATASOURCE


def test_overview_uses_every_proxy_metric_and_only_those():
    """Every family the proxy exports has a panel, and no query names a metric the proxy
    does not export (a renamed metric would leave a panel empty)."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
    metrics = ProxyMetrics(version="test")
    # The clients' histograms, registered by the OTLP service in client_metrics.mode proxy.
    metrics.registry.register(ClientHistograms(lambda: []))
    families = {m.name: m.type for m in metrics.registry.collect()}
    exported = {f + s for f, kind in families.items() for s in suffixes.get(kind, [""])}
    used = {m for e in exprs(load("proxy-overview")) for m in METRIC.findall(e)}
    assert used - exported == set()
    assert {re.sub(r"_(total|bucket|count|sum)$", "", u) for u in used} == set(families)
    assert any(re.search(r'\bup\{job="rocketmq-proxy"', e) for e in exprs(load("proxy-overview")))


def test_analytics_uses_every_report_gauge_and_only_those():
    dashboard = load("polling-analytics")
    queries = exprs(dashboard) + [v["query"]["query"] for v in dashboard["templating"]["list"]]
    used = {m for e in queries for m in METRIC.findall(e)}
    assert used == REPORT_GAUGES


@pytest.mark.parametrize(
    ("name", "variables"),
    [
        ("proxy-overview", ["instance", "group", "topic"]),
        ("polling-analytics", ["proxy", "group", "topic"]),
    ],
)
def test_variables_filter_the_queries(name, variables):
    dashboard = load(name)
    assert [v["name"] for v in dashboard["templating"]["list"]] == variables
    for expr in exprs(dashboard):
        # every query of the live metrics follows the proxy selection
        if "rocketmq_proxy_" in expr or "up{" in expr:
            assert 'instance=~"$instance"' in expr, expr
    used = " ".join(exprs(dashboard))
    for variable in variables:
        assert f'=~"${variable}"' in used


def test_provisioning_matches_the_deployments():
    datasources = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert [(d["uid"], d["type"], d["url"]) for d in datasources] == [
        ("prometheus", "prometheus", "${PROMETHEUS_URL}")
    ]
    providers = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "dashboards" / "dashboards.yml").read_text()
    )["providers"]
    assert [(p["type"], p["options"]["path"]) for p in providers] == [
        ("file", "/var/lib/grafana/dashboards")
    ]
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)
