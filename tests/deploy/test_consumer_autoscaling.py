"""deploy/k8s/consumer-autoscaling: an HPA that scales a consumer Deployment on its group's
lag, through the Prometheus Adapter's external metric. The manifests validate against the
Kubernetes schemas (strict); the HPA asks for the metric the adapter's rule serves, with
labels the proxy's gauge has; the rule's query is PromQL promtool accepts. (Against a live
Prometheus scraping a proxy: tests/deploy/test_prometheus_live.py.)"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from proxy.observability.metrics import ProxyMetrics
from tests.deploy.test_k8s_manifests import K8S, core_errors

AUTOSCALING = K8S / "consumer-autoscaling"


def manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(AUTOSCALING.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    assert set(docs) == {"HorizontalPodAutoscaler", "ConfigMap"}
    return docs


def adapter_rule() -> dict:
    config = yaml.safe_load(manifests()["ConfigMap"]["data"]["config.yaml"])
    (rule,) = config["externalRules"]
    return rule


def adapter_query(rule: dict, matchers: str, group_by: str = "group, topic") -> str:
    """The rule's metricsQuery as the adapter runs it for one HPA's selector."""
    series = re.match(r"(\w+)", rule["seriesQuery"])
    assert series
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series[1])
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", group_by)
    )


def test_the_manifests_validate_against_the_kubernetes_schemas():
    for kind, doc in manifests().items():
        assert core_errors(doc) == [], kind


def test_a_broken_autoscaler_is_refused():
    hpa = copy.deepcopy(manifests()["HorizontalPodAutoscaler"])
    del hpa["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert core_errors(hpa)
    hpa = copy.deepcopy(manifests()["HorizontalPodAutoscaler"])
    hpa["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]["group"] = 1
    assert core_errors(hpa)


def test_the_autoscaler_asks_for_what_the_adapter_serves():
    rule = adapter_rule()
    (metric,) = manifests()["HorizontalPodAutoscaler"]["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    selector = metric["external"]["metric"]["selector"]["matchLabels"]
    series = re.match(r"(\w+)", rule["seriesQuery"])
    assert series and series[1] == "rocketmq_proxy_consumer_lag_messages"
    gauge = next(m for m in ProxyMetrics(version="test").registry.collect() if m.name == series[1])
    assert gauge.type == "gauge"
    metrics = ProxyMetrics(version="test")
    metrics.set_consumer_lag("G", "T", 1, 0.5)
    (sample,) = [s for m in metrics.registry.collect() if m.name == series[1] for s in m.samples]
    assert set(selector) <= set(sample.labels) == {"group", "topic"}


def test_the_adapter_query_is_promql(tmp_path: Path):
    promtool = "promtool"
    query = adapter_query(adapter_rule(), 'group="orders-consumer",topic="orders"')
    rules = tmp_path / "rules.yml"
    record = {"record": "adapter:rocketmq_consumer_lag:max", "expr": query}
    rules.write_text(yaml.safe_dump({"groups": [{"name": "adapter", "rules": [record]}]}))
    try:
        done = subprocess.run(
            [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
        )
    except FileNotFoundError:
        pytest.fail("promtool is missing: make system-deps installs it", pytrace=False)
    assert done.returncode == 0, done.stdout + done.stderr
