"""deploy/docker/docker-compose.yml as Debian's docker-compose (1.29) parses it, with no
engine: the services, mounts, targets and health checks the system relies on. No engine runs
here, so containers are not started; the health-check commands are run against real
processes instead."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxy.config import ProxyConfig, ReceiveConfig, load
from tests.deploy._packaging import declared_scripts
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "deploy" / "docker" / "docker-compose.yml"
OURS = {"namesrv", "broker-a", "broker-b", "broker-c", "proxy-1", "proxy-2"}
BROKERS = ("broker-a", "broker-b", "broker-c")
PROXIES = ("proxy-1", "proxy-2")


@pytest.fixture(autouse=True)
def _docker_compose() -> None:
    """make test installs it (make system-deps): missing, the tests fail, never skip."""
    if shutil.which("docker-compose") is None:
        pytest.fail("docker-compose is missing: run `make system-deps`")


def compose_config(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker-compose", "-f", str(path), *extra, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        # The project name comes from the directory; keep the user's COMPOSE_* out of it.
        env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)},
    )


@pytest.fixture(scope="module")
def config() -> dict:
    done = compose_config(COMPOSE, "--profile", "analytics")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def _mounts(service: dict) -> dict[str, str]:
    """container path -> host path of the bind mounts (named volumes left out)."""
    out = {}
    for spec in service.get("volumes", []):
        source, target = spec.split(":")[:2]
        if source.startswith("/"):
            out[target] = source
    return out


def test_every_service_is_there_and_analytics_only_by_profile(config):
    names = set(config["services"])
    assert names == OURS | {"prometheus", "pushgateway", "grafana", "analytics"}
    assert config["services"]["analytics"]["profiles"] == ["analytics"]
    done = compose_config(COMPOSE)
    assert done.returncode == 0, done.stderr
    scripts = declared_scripts()
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    for name in OURS:
        service = config["services"][name]
        # Our services run a console script the package declares, from a stage that exists.
        assert service["command"][0] in scripts, name
        assert f" AS {service['build']['target']}\n" in dockerfile
        assert service["build"]["context"] == str(REPO)


def test_analytics_job_runs_the_report_cli_on_the_event_volume(config):
    service = config["services"]["analytics"]
    command = service["command"]
    # The CLI of the contract: rmq-polling-report EVENTS_PATH --out PATH --pushgateway URL.
    assert command[:2] == ["rmq-polling-report", "/var/lib/rmq-proxy/events"]
    assert _flag(command, "--pushgateway") == "http://pushgateway:9091"
    assert "events:/var/lib/rmq-proxy/events:ro" in service["volumes"]
    assert service["depends_on"]["pushgateway"]["condition"] == "service_healthy"
    scripts = declared_scripts()
    assert scripts["rmq-polling-report"] == "polling_report.cli:entry"
    # The flags the service passes exist in the real CLI.
    bin_dir = Path(sys.executable).parent
    done = subprocess.run(
        [str(bin_dir / "rmq-polling-report"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--out" in done.stdout and "--pushgateway" in done.stdout


def test_brokers_advertise_an_address_the_proxies_can_reach(config):
    services = config["services"]
    namesrv_port = _flag(services["namesrv"]["command"], "--port")
    assert _flag(services["namesrv"]["command"], "--host") == "0.0.0.0"
    for name in BROKERS:
        command = services[name]["command"]
        # Routes carry the advertised host: the service name, resolvable on the network.
        assert _flag(command, "--advertise-host") == name
        assert _flag(command, "--host") == "0.0.0.0"
        assert _flag(command, "--namesrv") == f"namesrv:{namesrv_port}"
        assert services[name]["depends_on"]["namesrv"]["condition"] == "service_healthy"
    for name in PROXIES:
        service = services[name]
        env = service["environment"]
        # Every RMQ_PROXY_* key is a real setting, and the proxy reads them as intended.
        fields = {f"RMQ_PROXY_{f.upper()}" for f in ProxyConfig.__dataclass_fields__}
        fields |= {f"RMQ_PROXY_RECEIVE_{f.upper()}" for f in ReceiveConfig.__dataclass_fields__}
        assert set(env) <= fields, set(env) - fields
        loaded = load(env=env)
        assert loaded.namesrv_addrs == [f"namesrv:{namesrv_port}"]
        assert {b: {"condition": "service_healthy"} for b in BROKERS} == service["depends_on"]
        # Host clients dial the advertised address: it must be the published gRPC port.
        published = {p["target"]: p["published"] for p in service["ports"]}
        assert loaded.advertise_address == f"localhost:{published[loaded.grpc_port]}"
        # The event log goes to the shared volume the analytics job reads.
        assert f"events:{loaded.event_log_dir}:rw" in service["volumes"]
        # No override: the image's HEALTHCHECK (/readyz) applies.
        assert "healthcheck" not in service


def test_prometheus_and_grafana_mounts_follow_the_contracts(config):
    services = config["services"]
    prom = _mounts(services["prometheus"])
    assert prom["/etc/prometheus/prometheus.yml"] == str(REPO / "deploy/prometheus/prometheus.yml")
    assert prom["/etc/prometheus/rules"] == str(REPO / "deploy/prometheus/rules")
    targets = Path(prom["/etc/prometheus/targets"])
    assert all(Path(p).exists() for p in prom.values())
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    # The file_sd targets are the proxies' ops ports and the Pushgateway, by service name.
    proxies = json.loads((targets / "proxies.json").read_text())
    ops = {f"{name}:{load(env=services[name]['environment']).http_port}" for name in PROXIES}
    assert {t for group in proxies for t in group["targets"]} == ops
    for name in PROXIES:
        assert load().http_port in {p["target"] for p in services[name]["ports"]}
    gateway = json.loads((targets / "pushgateway.json").read_text())
    assert [t for group in gateway for t in group["targets"]] == ["pushgateway:9091"]
    assert 9091 in {p["target"] for p in services["pushgateway"]["ports"]}
    # The Prometheus config reads exactly those two files.
    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    files = {f for job in scrape["scrape_configs"] for sd in job["file_sd_configs"]
             for f in sd["files"]}  # fmt: skip
    assert files == {"targets/proxies.json", "targets/pushgateway.json"}

    grafana = services["grafana"]
    mounts = _mounts(grafana)
    assert mounts["/etc/grafana/provisioning"] == str(REPO / "grafana/provisioning")
    assert mounts["/var/lib/grafana/dashboards"] == str(REPO / "grafana/dashboards")
    assert (REPO / "grafana/provisioning/datasources").is_dir()
    assert list((REPO / "grafana/dashboards").glob("*.json"))
    assert grafana["environment"]["PROMETHEUS_URL"] == "http://prometheus:9090"
    assert grafana["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_every_service_has_a_health_check(config):
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    for name, service in config["services"].items():
        if name in PROXIES:
            assert "HEALTHCHECK" in dockerfile  # the image's own, checked in test_compose_image
        elif name != "analytics":  # a batch job, not a server
            assert service["healthcheck"]["test"][0] == "CMD", name


async def test_remoting_health_checks_pass_on_a_live_server_only(config, cluster):
    """Run the name server's and a broker's health-check command for real: against a
    listening stub (its port put in place of the container's) it passes; against a closed
    port it fails."""
    services = config["services"]
    probes = {
        "namesrv": (services["namesrv"], cluster.namesrv_address),
        "broker-a": (services["broker-a"], cluster.brokers[0].address),
    }
    for name, (service, live) in probes.items():
        command = service["healthcheck"]["test"][1:]
        assert command[0] == "python"
        port = _flag(service["command"], "--port")
        assert f", {port})" in command[2], command
        closed = free_port()
        for address, ok in ((live, True), (f"127.0.0.1:{closed}", False)):
            code = command[2].replace(f", {port})", f", {address.rsplit(':', 1)[1]})")
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
            assert (await asyncio.wait_for(proc.wait(), 15) == 0) is ok, (name, address)


def test_a_broken_compose_file_is_refused(tmp_path):
    """The check has teeth: the same file with a dangling dependency, or a misspelt key,
    does not parse."""
    original = yaml.safe_load(COMPOSE.read_text())
    for breakage in ("none", "dangling", "misspelt"):
        broken = json.loads(json.dumps(original))
        if breakage == "dangling":
            broken["services"]["proxy-1"]["depends_on"]["broker-z"] = {
                "condition": "service_healthy"
            }
        elif breakage == "misspelt":
            broken["services"]["grafana"]["enviroment"] = {"A": "b"}
        path = tmp_path / "deploy" / "docker" / f"{breakage}.yml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(broken))
        done = compose_config(path)
        # The unbroken copy, written the same way, is the control: it parses.
        assert (done.returncode == 0) is (breakage == "none"), (breakage, done.stderr)
