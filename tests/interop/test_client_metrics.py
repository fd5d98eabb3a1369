"""The official clients' own metrics through a running proxy (``client_metrics.mode =
proxy``) into a real Prometheus: rocketmq-python-client 5.1.2 and rocketmq-client-java 5.2.0,
unchanged and in their default configuration (Python plaintext, Java TLS), send and consume
with PushConsumers (the Python client measures delivery latency in push consumers only),
and export their histograms to the proxy's gRPC port; Prometheus (Debian's package, the
deployment's own configuration and rules, scraping every second) returns their
``rocketmq_delivery_latency`` and ``rocketmq_send_cost_time`` by group and by language.

How long the clients live: each driver run exits once its work is done, in seconds. The
clients export every 60 s, and also once when their meter stops: the Java client's
``close()`` shuts its meter provider down, which exports what it holds; the Python client
never stops its meter, but the OpenTelemetry SDK's MeterProvider does at interpreter exit
(its atexit hook), with the same last export. So a short run exports once, as it exits;
the test still waits on a condition, bounded by ``EXPORT_WAIT_S`` (one export interval and
a half), in case a client only exports on its 60 s tick.

The proxy runs with its default number of workers (one per core: two on the development
machine), so the exports land on whichever worker a connection reached and the supervisor's
/metrics adds them up.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as otlp_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)

from rocketmq_local import admin
from testkit.official.harness import run_client, start_proxy

pytestmark = [pytest.mark.interop, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
LANGS = ("python", "java")
MESSAGES = 4
EXPORT_WAIT_S = 90.0
RUN_TIMEOUT = 90.0


def start_prometheus(run: Path, proxy_ops: str) -> tuple[subprocess.Popen, str]:
    """The deployment's Prometheus configuration and rules, scraping the proxy every
    second (the pushgateway target left empty)."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is missing: `make system-deps` installs it"
    config_dir = run / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, config_dir, ignore=shutil.ignore_patterns("targets", "tests"))
    (config_dir / "targets").mkdir()
    (config_dir / "targets" / "proxies.json").write_text(json.dumps([{"targets": [proxy_ops]}]))
    (config_dir / "targets" / "pushgateway.json").write_text("[]")
    config = config_dir / "prometheus.yml"
    doc = yaml.safe_load(config.read_text())
    doc["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    from tests.support.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    log = (run / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--web.listen-address={address}",
            f"--storage.tsdb.path={run / 'prometheus-data'}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc, f"http://{address}"


def query(url: str, expr: str) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=5) as answer:
            body = json.loads(answer.read())
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


def by(result: list[dict], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in result}


def test_official_clients_metrics_reach_prometheus_through_the_proxy(tmp_path):
    config = tmp_path / "proxy.toml"
    config.write_text('[client_metrics]\nmode = "proxy"\n')
    proxy = start_proxy(tmp_path / "proxy", (), brokers=2, extra_args=("--config", str(config)))
    prometheus: subprocess.Popen | None = None
    try:
        prometheus, prom = start_prometheus(tmp_path, proxy.http)
        topics = {lang: f"metrics-{lang}-{uuid.uuid4().hex[:8]}" for lang in LANGS}
        groups = {lang: f"metrics-{lang}-{uuid.uuid4().hex[:8]}" for lang in LANGS}
        for lang in LANGS:
            admin.create_topic(proxy.namesrv, topics[lang])
            admin.create_group(proxy.namesrv, groups[lang])

        def send_then_consume(lang: str) -> dict:
            home = tmp_path / f"home-{lang}"
            common = ("--endpoint", proxy.grpc, "--topic", topics[lang])
            sent = run_client(
                lang, "produce", *common, "--count", MESSAGES,
                timeout=RUN_TIMEOUT, home=home / "produce",
            )  # fmt: skip
            assert len(sent["ids"]) == MESSAGES, sent
            return run_client(
                lang, "push", *common, "--group", groups[lang], "--expect", MESSAGES,
                timeout=RUN_TIMEOUT, home=home / "push",
            )  # fmt: skip

        with ThreadPoolExecutor(len(LANGS)) as pool:
            consumed = dict(zip(LANGS, pool.map(send_then_consume, LANGS), strict=True))
        for lang, out in consumed.items():
            assert {m["result"] for m in out["messages"]} == {"SUCCESS"}, (lang, out)
        ended = time.monotonic()

        expected_groups = {(groups["python"], "PYTHON"), (groups["java"], "JAVA")}
        expected_sends = {(topics["python"], "PYTHON"), (topics["java"], "JAVA")}
        deadline = ended + EXPORT_WAIT_S
        delivered: dict[tuple[str, ...], float] = {}
        sends: dict[tuple[str, ...], float] = {}
        while time.monotonic() < deadline:
            delivered = by(
                query(prom, "sum by (group, client_language) (rocketmq_delivery_latency_count)"),
                "group",
                "client_language",
            )
            sends = by(
                query(prom, "sum by (topic, client_language) (rocketmq_send_cost_time_count)"),
                "topic",
                "client_language",
            )
            # The clients export cumulative counts now and then: an export may hold some of
            # the sends only, so wait for all of them, not just for the series.
            if (
                expected_groups <= set(delivered)
                and expected_sends <= set(sends)
                and all(sends[key] >= MESSAGES for key in expected_sends)
            ):
                break
            time.sleep(1.0)
        assert expected_groups <= set(delivered), (delivered, proxy.logs())
        assert expected_sends <= set(sends), (sends, proxy.logs())
        # Every message sent and delivered was measured: a send each, a receive per batch.
        for lang in LANGS:
            assert sends[(topics[lang], lang.upper())] == MESSAGES, sends
            assert 1 <= delivered[(groups[lang], lang.upper())] <= MESSAGES, delivered
        # The histograms' buckets answer the dashboard's quantiles, by group.
        p99 = by(
            query(
                prom,
                "histogram_quantile(0.99, sum by (group, le) (rocketmq_delivery_latency_bucket))",
            ),
            "group",
        )
        assert {(g,) for g, _ in expected_groups} <= set(p99), p99
        # A number, not the NaN histogram_quantile answers for a histogram with no sample.
        assert all(math.isfinite(p99[(g,)]) and p99[(g,)] >= 0 for g, _ in expected_groups), p99
        # Never the client id: bounded cardinality.
        ids = query(prom, 'count(rocketmq_delivery_latency_count{client_id!=""})')
        assert ids == [], ids
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(20)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait(10)
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


class _Collector(otlp_grpc.MetricsServiceServicer):
    """An OTLP collector that keeps what it is sent, and who sent it."""

    def __init__(self) -> None:
        self.exports: list[tuple[str, set[str]]] = []  # (x-mq-language, metric names)

    def Export(self, request, context):
        language = dict(context.invocation_metadata()).get("x-mq-language", "")
        names = {
            m.name for r in request.resource_metrics for s in r.scope_metrics for m in s.metrics
        }
        self.exports.append((language, names))
        return ExportMetricsServiceResponse()


def test_collector_mode_sends_the_python_clients_metrics_to_the_collector(tmp_path):
    """The Python client exports where the settings say, in plaintext (its exporter has no
    TLS). The Java client would use TLS there by default (its own TLS setting): a collector
    for both must take both, as docs/client-metrics.md says."""
    collector = _Collector()
    server = grpc.server(ThreadPoolExecutor(2))
    otlp_grpc.add_MetricsServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    config = tmp_path / "proxy.toml"
    config.write_text(f'[client_metrics]\nmode = "collector"\ncollector = "127.0.0.1:{port}"\n')
    proxy = start_proxy(tmp_path / "proxy", (), brokers=1, extra_args=("--config", str(config)))
    try:
        topic = f"metrics-collector-{uuid.uuid4().hex[:8]}"
        admin.create_topic(proxy.namesrv, topic)
        out = run_client(
            "python", "produce", "--endpoint", proxy.grpc, "--topic", topic, "--count", 2,
            timeout=RUN_TIMEOUT, home=tmp_path / "home",
        )  # fmt: skip
        assert len(out["ids"]) == 2
        deadline = time.monotonic() + EXPORT_WAIT_S
        while time.monotonic() < deadline and not collector.exports:
            time.sleep(0.5)
        assert ("PYTHON", {"rocketmq_send_cost_time"}) in collector.exports, collector.exports
    finally:
        complaint = proxy.stop()
        server.stop(None)
    assert complaint is None, f"{complaint}\n{proxy.logs()}"
