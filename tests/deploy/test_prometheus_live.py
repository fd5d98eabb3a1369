"""Every PromQL expression of the dashboards and the alert rules, evaluated by a real
Prometheus (Debian's package) scraping a real `rmq-proxy` process under a short workload,
returns data. The Spark job (`rmq-polling-report`) runs on that proxy's event log and pushes
to a real Pushgateway for the analytics dashboard.

Everything runs on 127.0.0.1 with free ports and is stopped by pid at the end, also when a
step fails. Prometheus scrapes and evaluates rules every second (a patched copy of
deploy/prometheus/prometheus.yml); `$__rate_interval` becomes 1m."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest
import yaml
from grpc import aio as grpc_aio
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as otlp_grpc

from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import SendMessageHeader
from testkit import otlp, waits
from testkit.lean_client import LeanClient
from tests.deploy.conftest import GRAFANA_DIR, PROMETHEUS_DIR
from tests.support.ports import free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


def installed(tool: str) -> str:
    """The tool's path. make test installs it (make system-deps): missing, the test fails,
    never skips."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is missing: `make system-deps` installs it")
    return path


@pytest.fixture(autouse=True)
def _prometheus() -> None:
    installed("prometheus")
    installed("prometheus-pushgateway")


BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
REPORT = BIN / "rmq-polling-report"
GROUP, TOPIC, PROXY_ID = "G", "T", "live-proxy"
WAIT_S = 60.0  # bound of every wait on a component
# Fast adaptive switching, and long polls from 500 ms, so a few seconds of load show all.
PROXY_ENV = {
    "RMQ_PROXY_RECEIVE_MIN_POLLING_MS": "500",
    "RMQ_PROXY_RECEIVE_ADAPTIVE_HIGH_RATE": "3",
    "RMQ_PROXY_RECEIVE_ADAPTIVE_LOW_RATE": "1",
    "RMQ_PROXY_RECEIVE_ADAPTIVE_WINDOW_S": "2",
    "RMQ_PROXY_RECEIVE_ADAPTIVE_MIN_POLLS": "4",  # first-pop hits before coupled polling
    # The Export RPC for the clients' own metrics (the dashboard's Clients row).
    "RMQ_PROXY_CLIENT_METRICS_MODE": "proxy",
    # The consumer lag of the registered consumer below, refreshed within the workload.
    "RMQ_PROXY_LAG_REFRESH_S": "1",
}
# A consumer of GROUP that registers (its Telemetry settings) and stays connected for the
# whole run: the consumer lag metric is published while a group has a consumer.
CONSUMER = """
import asyncio, sys
from testkit.lean_client import SettingsClient

async def main():
    client = SettingsClient(sys.argv[1], "live-consumer")
    await client.prepare(sys.argv[2], sys.argv[3], 500)
    print("registered", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


# -- processes ----------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM by pid, then SIGKILL if it does not exit."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def start(name: str, args: list[str], run: Path, env: dict | None = None) -> Proc:
    log = run / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    return Proc(name, popen, log)


def wait_for(what: str, check, proc: Proc | None = None, timeout: float = WAIT_S):
    """Poll ``check()`` until it returns a true value, and return that; fail with the
    process's output (``waits.wait_for`` does the polling)."""
    value = None

    def ready() -> bool:
        nonlocal value
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited while waiting for {what}:\n{proc.output()}")
        value = check()
        return bool(value)

    def said() -> str:
        return what if proc is None else f"{what} ({proc.name} printed:\n{proc.output()})"

    waits.wait_for(ready, timeout, step=0.25, what=said)
    return value


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


# -- Prometheus HTTP API ------------------------------------------------------------------


@dataclass
class Prom:
    url: str

    def api(self, path: str, **params) -> dict:
        status, body = http_get(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params, True)}")
        answer = json.loads(body or b"{}")
        assert status == 200 and answer.get("status") == "success", (path, params, answer)
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def label_values(self, selector: str, label: str, start: float, end: float) -> set[str]:
        series = self.api("series", **{"match[]": selector, "start": start, "end": end})
        return {s[label] for s in series if label in s}


# -- the workload -------------------------------------------------------------------------


async def workload(grpc: str) -> None:
    """Client calls that make every metric family of the proxy appear: sends, found and empty
    receives, short and long polls, notification probes, a switch to coupled and back, a
    nack (a coupled poll cancelled while its broker pop is parked) and a dead-letter send."""
    client = LeanClient(grpc)
    try:
        for _ in range(16):  # the proxy takes the queues in turn: both brokers', twice
            assert (await client.send(TOPIC, b"m")).status.code == pb.Code.OK
        got = await client.receive(GROUP, TOPIC, await_ms=1000, batch=1)  # short-poll hit
        assert got.messages
        received = len(got.messages)
        for _ in range(11):  # > 3 requests/s over 2 s, first-pop hits: adaptive switches to coupled
            got = await client.receive(GROUP, TOPIC, await_ms=100, batch=1)
            received += len(got.messages)
        assert got.messages
        message = got.messages[0]
        forwarded = await client.forward_to_dead_letter(GROUP, TOPIC, message, 16)
        assert forwarded.status.code == pb.Code.OK
        # Drain what is left, stopping as soon as all 16 are in: an empty answer would be a
        # first-pop miss, and misses take a key back to notify (the adaptive rule), while
        # the next step needs a coupled poll.
        for _ in range(12):
            if received >= 16:
                break
            got = await client.receive(GROUP, TOPIC, await_ms=100, batch=32)
            received += len(got.messages)
        assert received == 16
        # A coupled poll given up by its client: the parked pop's message is handed back.
        poll = asyncio.ensure_future(client.receive(GROUP, TOPIC, await_ms=3000))
        # Its pop reaches the broker and parks: neither the client nor the proxy's status
        # says when a pop is parked on a broker, so it is given the time.
        await asyncio.sleep(0.3)
        poll.cancel()
        await asyncio.gather(poll, return_exceptions=True)
        for _ in range(8):
            await client.send(TOPIC, b"n")
        await asyncio.sleep(3)  # quiet: below 1 request/s, the next poll goes back to notify
        for _ in range(10):  # drain, including the handed-back message once visible again
            got = await client.receive(GROUP, TOPIC, await_ms=1200, batch=32)
            if got.status == pb.Code.MESSAGE_NOT_FOUND:
                break
        # A notify long poll woken by a probe, and one that runs out empty.
        poll = asyncio.ensure_future(client.receive(GROUP, TOPIC, await_ms=2000))
        await asyncio.sleep(0.3)  # the message must come after the poll parked: time for it
        await client.send(TOPIC, b"late")
        assert (await poll).messages
        got = await client.receive(GROUP, TOPIC, await_ms=600)
        assert got.status == pb.Code.MESSAGE_NOT_FOUND
    finally:
        await client.close()
    await client_metrics_exports(grpc)


async def remoting_workload(address: str) -> None:
    """A 4.x client's route query and sends on the remoting port."""
    client = RemotingClient(address)
    try:
        route = await client.invoke(
            RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC}), 5
        )
        brokers = [b["brokerName"] for b in orjson.loads(route.body)["brokerDatas"]]
        for broker in brokers:
            header = SendMessageHeader(producer_group="PG", topic=TOPIC, queue_id=0).encode_v2()
            header["n"] = broker
            sent = await client.invoke(
                RemotingCommand(RequestCode.SEND_MESSAGE_V2, header, b"r"), 5
            )
            assert sent.code == 0, sent.remark
    finally:
        await client.close()


async def client_metrics_exports(grpc_address: str) -> None:
    """The four histograms of a Java client in group G on topic T, as the official clients
    export them to the proxy; then one export with a malformed point (dropped, counted)."""
    counts = [2, 1, 0, 0, 0, 0, 0, 0]
    names = ("rocketmq_delivery_latency", "rocketmq_send_cost_time",
             "rocketmq_await_time", "rocketmq_process_time")  # fmt: skip
    points = [
        (name, otlp.point(counts, name=name, topic=TOPIC, consumer_group=GROUP, client_id="c"))
        for name in names
    ]
    async with grpc_aio.insecure_channel(grpc_address) as channel:
        stub = otlp_grpc.MetricsServiceStub(channel)
        await stub.Export(otlp.export(*points), metadata=otlp.client_headers())
        broken = otlp.point([1], consumer_group=GROUP)  # 1 count for 7 bounds
        answer = await stub.Export(otlp.export(("rocketmq_delivery_latency", broken)))
        assert answer.partial_success.rejected_data_points == 1


# -- the live system ----------------------------------------------------------------------


@dataclass
class Live:
    prom: Prom
    instance: str  # the proxy's ops address, its Prometheus `instance`
    started: float
    at: float  # when every proxy series was scraped after the workload (proxy still up)
    report: subprocess.CompletedProcess | None = None
    procs: list[Proc] = field(default_factory=list)


def prometheus_config(make_prometheus_dir, proxy_ops: str, pushgateway: str) -> Path:
    config = make_prometheus_dir([proxy_ops], pushgateway)
    doc = yaml.safe_load(config.read_text())
    doc["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return config


@pytest.fixture(scope="module")
def live(make_prometheus_dir, tmp_path_factory) -> Iterator[Live]:
    run = tmp_path_factory.mktemp("live")
    procs: list[Proc] = []
    try:
        gateway_addr = f"127.0.0.1:{free_port()}"
        gateway = start(
            "pushgateway",
            [
                installed("prometheus-pushgateway"),
                f"--web.listen-address={gateway_addr}",
                "--persistence.file=",  # in memory only (Debian's default is a system path)
            ],
            run,
        )
        procs.append(gateway)
        events = run / "events"
        proxy = start(
            "proxy",
            [
                str(BIN / "rmq-proxy"), "--embedded-brokers", "2", "--topic", TOPIC,
                "--grpc-port", "0", "--http-port", "0", "--remoting-port", "0",
                "--proxy-id", PROXY_ID,
                "--mode", "adaptive", "--event-log-dir", str(events), "--log-level", "warning",
                "--workers", "1",  # the dashboards' Proxy variable is PROXY_ID, not PROXY_ID-w<k>
            ],
            run,
            env=PROXY_ENV,
        )  # fmt: skip
        procs.append(proxy)
        ready = wait_for(
            "the proxy's ready line",
            lambda: re.search(
                r"rmq-proxy ready grpc=(\S+) remoting=(\S+) http=(\S+)", proxy.output()
            ),
            proxy,
        )
        grpc, remoting, ops = ready.group(1), ready.group(2), ready.group(3)
        consumer = start(
            "consumer", [sys.executable, "-c", CONSUMER, grpc, GROUP, TOPIC], run,
            env={"PYTHONPATH": str(REPO)},
        )  # fmt: skip
        procs.append(consumer)
        wait_for("the consumer registered", lambda: "registered" in consumer.output(), consumer)
        wait_for("the pushgateway", lambda: http_get(f"http://{gateway_addr}/-/ready")[0] == 200)

        prom_addr = f"127.0.0.1:{free_port()}"
        prometheus = start(
            "prometheus",
            [
                installed("prometheus"),
                f"--config.file={prometheus_config(make_prometheus_dir, ops, gateway_addr)}",
                f"--web.listen-address={prom_addr}",
                f"--storage.tsdb.path={run / 'prometheus-data'}",
            ],
            run,
        )
        procs.append(prometheus)
        prom = Prom(f"http://{prom_addr}")
        wait_for("prometheus", lambda: http_get(f"{prom.url}/-/ready")[0] == 200, prometheus)

        def both_targets_up() -> bool:
            up = {s["metric"]["job"]: s["value"][1] for s in prom.query("up")}
            return up == {"rocketmq-proxy": "1", "pushgateway": "1"}

        wait_for("both scrape targets up", both_targets_up, prometheus)
        started = time.time()
        asyncio.run(workload(grpc))
        asyncio.run(remoting_workload(remoting))
        done = time.time()

        def scraped_after_workload() -> bool:
            # Two scrapes at least since the workload ended, and the rules evaluated after
            # the last of them: a series its last calls made (a notify poll that ran out
            # empty counts its probes as it ends) then has the two samples a rate() needs.
            # One was not always enough: a CI run on a loaded machine found the notification
            # error ratio empty.
            since = max(1, int(time.time() - done))
            scrapes = prom.query(f"count_over_time(rocketmq_proxy_ready[{since}s])")
            scraped = prom.query("timestamp(rocketmq_proxy_ready)")
            evaluated = prom.query(
                "timestamp(instance:rocketmq_proxy_long_polls_in_flight:ratio_limit)"
            )
            return (
                bool(scrapes and scraped and evaluated)
                and float(scrapes[0]["value"][1]) >= 2
                and float(scraped[0]["value"][1]) > done + 2
                and float(evaluated[0]["value"][1]) > float(scraped[0]["value"][1])
            )

        wait_for("two scrapes, then a rule evaluation, after the workload", scraped_after_workload)
        live = Live(prom, ops, started, time.time(), procs=procs)

        if REPORT.exists():
            # The event log is complete once the proxy has stopped (files are renamed on
            # close); the proxy queries above are evaluated at `live.at`, before the stop.
            proxy.stop()
            assert proxy.popen.returncode == 0, proxy.output()
            live.report = subprocess.run(
                [
                    str(REPORT), str(events), "--out", str(run / "report.parquet"),
                    "--pushgateway", f"http://{gateway_addr}", "--job", "rmq_polling_report",
                ],
                capture_output=True, text=True, timeout=400, check=False,
            )  # fmt: skip
        yield live
    finally:
        for proc in reversed(procs):
            proc.stop()


# -- what is evaluated --------------------------------------------------------------------


def dashboard(name: str) -> dict:
    return json.loads((GRAFANA_DIR / "dashboards" / f"{name}.json").read_text())


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every query, rows' nested panels included."""
    out: list[tuple[str, str]] = []
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable interpolation for one selected value per variable."""
    values = {"__rate_interval": "1m", **values}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def rules() -> list[dict]:
    found = []
    for path in sorted((PROMETHEUS_DIR / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            found.extend(group["rules"])
    return found


def alert_quantities(expr: str) -> list[str]:
    quantities = []
    for term in re.split(r"\band\b", expr):
        m = re.match(r"^(.+?)\s*(?:==|!=|>=|<=|>|<)\s*-?[0-9.]+$", term.strip(), re.S)
        assert m, f"alert term is not '<quantity> <op> <number>': {term}"
        quantities.append(m.group(1))
    return quantities


def empty_queries(prom: Prom, queries: list[tuple[str, str]], at: float | None) -> list[str]:
    return [f"{title}: {expr}" for title, expr in queries if not prom.query(expr, at)]


# -- the tests ----------------------------------------------------------------------------


def test_proxy_overview_queries_return_data(live):
    values = {"instance": live.instance, "group": GROUP, "topic": TOPIC}
    queries = [(t, substitute(e, values)) for t, e in panel_queries(dashboard("proxy-overview"))]
    assert len(queries) > 20
    assert empty_queries(live.prom, queries, live.at) == []


def test_proxy_overview_variables_list_the_live_values(live):
    board = dashboard("proxy-overview")
    expected = {"instance": live.instance, "group": GROUP, "topic": TOPIC}
    values = dict(expected)
    for variable in board["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
        assert m, variable["query"]
        selector = substitute(m.group(1), values)
        found = live.prom.label_values(selector, m.group(2), live.started - 60, live.at)
        assert expected[variable["name"]] in found, (variable["name"], found)


def test_rules_loaded_and_every_alert_quantity_returns_data(live):
    groups = live.prom.api("rules")["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    expected = rules()
    assert set(loaded) == {r.get("record") or r["alert"] for r in expected}
    assert all(r["health"] == "ok" for r in loaded.values()), loaded
    quantities = [(r["record"], r["record"]) for r in expected if "record" in r]
    for rule in expected:
        if "alert" in rule:
            quantities.extend((rule["alert"], q) for q in alert_quantities(rule["expr"]))
    assert empty_queries(live.prom, quantities, live.at) == []


def test_only_the_dead_letter_alert_fires_on_the_workload(live):
    """The workload forwarded one message to the DLQ; nothing else is wrong."""
    firing = live.prom.query('ALERTS{alertstate="firing"}', live.at)
    assert {(a["metric"]["alertname"], a["metric"].get("instance")) for a in firing} == {
        ("RocketMQProxyDeadLetterSends", live.instance)
    }


def test_polling_analytics_queries_return_data(live):
    assert REPORT.exists(), f"{REPORT} is not installed: make venv installs ./analytics"
    assert live.report is not None and live.report.returncode == 0, (
        live.report.stdout[-3000:] + live.report.stderr[-3000:]
    )
    wait_for(
        "the pushed report in Prometheus",
        lambda: live.prom.query('rocketmq_polling_report_records{job="rmq_polling_report"}'),
    )
    board = dashboard("polling-analytics")
    for proxy in (PROXY_ID, "_fleet"):
        values = {"proxy": proxy, "group": GROUP, "topic": TOPIC}
        queries = [(t, substitute(e, values)) for t, e in panel_queries(board)]
        assert empty_queries(live.prom, queries, None) == [], proxy
        for variable in board["templating"]["list"]:
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
            assert m, f"variable {variable['name']} is not label_values(...)"
            found = live.prom.label_values(
                substitute(m.group(1), values), m.group(2), live.started, time.time()
            )
            assert values[variable["name"]] in found, (variable["name"], found)


def test_the_autoscalers_query_reads_the_consumer_lag(live):
    """deploy/k8s/consumer-autoscaling: the Prometheus Adapter's query, for the registered
    consumer's group, answers the lag the proxy publishes."""
    from tests.deploy.test_consumer_autoscaling import adapter_query, adapter_rule

    query = adapter_query(adapter_rule(), f'group="{GROUP}",topic="{TOPIC}"')
    (answer,) = live.prom.query(query, live.at)
    assert answer["metric"] == {"group": GROUP, "topic": TOPIC}
    assert float(answer["value"][1]) >= 0
