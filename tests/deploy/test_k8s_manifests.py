"""deploy/k8s validated offline: the built-in kinds against the Kubernetes JSON schemas that
the PyPI package kubernetes-validate carries (strict: unknown fields refused), the
ServiceMonitor against the validators that the npm package
@kubernetes-models/prometheus-operator generates from the Prometheus Operator's API types;
then what the schemas cannot see (ports, selectors, probes, grace period) checked across
the manifests and against a real proxy."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path

import aiohttp
import kubernetes_validate
import pytest
import yaml

from proxy.api.connections import Connections
from proxy.app import ProxyApp
from proxy.config import load
from tests.deploy._packaging import declared_scripts

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
SCHEMA_DIR = K8S / "schema"
OPERATOR_API = "monitoring.coreos.com/v1"
# The oldest Kubernetes release the manifests promise to work on, and the newest the
# validator knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())


def manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs[doc["kind"]] = doc
    return docs


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    found = manifests()
    kinds = {"ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"}
    assert set(found) == kinds | {"PodDisruptionBudget", "ServiceMonitor"}
    return found


def core_errors(doc: dict) -> list[str]:
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {'.'.join(map(str, exc.path))}: {exc.message}")
    return errors


@pytest.fixture(scope="module")
def operator_validator():
    """Runs deploy/k8s/schema/validate.mjs with its npm packages (`make test` installs
    them from the committed lock file)."""
    node = shutil.which("node")
    assert node, "Node.js 20 is needed (see README)"
    assert (SCHEMA_DIR / "node_modules").is_dir(), f"run `make deploy-node-deps` ({SCHEMA_DIR})"

    def validate(resources: list[dict]) -> list[dict]:
        done = subprocess.run(
            [node, str(SCHEMA_DIR / "validate.mjs")],
            input=json.dumps(resources), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        results = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(results) == len(resources), done.stderr
        assert done.returncode == (0 if all(r["ok"] for r in results) else 1)
        return results

    return validate


def test_built_in_kinds_validate_against_the_kubernetes_schemas(docs):
    for kind, doc in docs.items():
        if doc["apiVersion"] != OPERATOR_API:
            assert core_errors(doc) == [], kind


def test_servicemonitor_validates_against_the_operator_types(docs, operator_validator):
    (result,) = operator_validator([docs["ServiceMonitor"]])
    assert result == {"kind": "ServiceMonitor", "name": "rmq-proxy", "ok": True, "error": None}


def _broken(doc: dict, path: str, value) -> dict:
    """A copy of ``doc`` with ``value`` at the dotted ``path`` (list indexes as numbers)."""
    broken = copy.deepcopy(doc)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = broken
    for part in parents:
        node = node[part]
    node[last] = value
    return broken


POD = "spec.template.spec"
BROKEN_CORE = [
    ("Deployment", f"{POD}.containers.0.readinessProbe.httpGet.port", True),
    ("Deployment", f"{POD}.containers.0.readinessProbes", {"httpGet": {"path": "/readyz"}}),
    ("Deployment", f"{POD}.terminationGracePeriodSeconds", "50s"),
    ("Deployment", f"{POD}.containers.0.lifecycle.preStop.exec.command", "sleep 5"),
    ("Service", "spec.ports.0.port", "8081"),
    ("HorizontalPodAutoscaler", "spec.minReplicas", "two"),
    ("HorizontalPodAutoscaler", "spec.metrics.0.resource.target.type", None),
    ("PodDisruptionBudget", "spec.maxUnavailabel", 1),
    ("ConfigMap", "data.proxy\\.toml", 1),
]


@pytest.mark.parametrize(("kind", "path", "value"), BROKEN_CORE)
def test_a_broken_manifest_is_refused(docs, kind, path, value):
    if "\\." in path:  # a key with a dot in it
        broken = copy.deepcopy(docs[kind])
        broken["data"]["proxy.toml"] = value
    else:
        broken = _broken(docs[kind], path, value)
    assert core_errors(broken), f"{kind} with {path}={value!r} passed"


def test_a_broken_servicemonitor_is_refused(docs, operator_validator):
    sm = docs["ServiceMonitor"]
    broken = [
        _broken(sm, "spec.endpoints.0.port", 8082),
        _broken(sm, "spec.endpoints.0.interval", "15 seconds"),
        _broken(sm, "spec.endpoints", {"port": "ops"}),
        {k: v for k, v in sm.items() if k != "spec"} | {"spec": {"endpoints": []}},
    ]
    results = operator_validator(broken)
    assert [r["ok"] for r in results] == [False] * len(broken), results


def _container(docs: dict) -> dict:
    (container,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    return container


def _proxy_config(docs: dict, tmp_path: Path):
    path = tmp_path / "proxy.toml"
    path.write_text(docs["ConfigMap"]["data"]["proxy.toml"])
    return load(str(path), env={"RMQ_PROXY_PROXY_ID": "rmq-proxy-0"})


def test_ports_selectors_and_probes_agree(docs, tmp_path):
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]
    container = _container(docs)
    config = _proxy_config(docs, tmp_path)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": config.grpc_port, "ops": config.http_port, "fleet": config.fleet.port}
    assert config.grpc_host == config.http_host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}

    labels = pod["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports) - {"fleet"}
    monitor = docs["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["endpoints"]} == {"ops"}
    assert {p["name"] for p in service["spec"]["ports"]} >= {"ops"}
    assert monitor["endpoints"][0]["path"] == "/metrics"

    pdb, hpa = docs["PodDisruptionBudget"]["spec"], docs["HorizontalPodAutoscaler"]["spec"]
    assert pdb["selector"] == deployment["spec"]["selector"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    # A drain never takes the last proxy, and CPU utilisation needs a CPU request.
    assert hpa["minReplicas"] > pdb["maxUnavailable"]
    assert "cpu" in container["resources"]["requests"]

    # The ConfigMap is mounted where --config points.
    config_path = Path(container["args"][container["args"].index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert config_path.name in docs["ConfigMap"]["data"]
    # RMQ_PROXY_* service-link variables would land in the proxy's settings.
    assert pod["spec"]["enableServiceLinks"] is False


def test_image_user_and_command_match_the_dockerfile(docs):
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    user = next(line.split()[1] for line in final_stage.splitlines() if line.startswith("USER"))
    security = docs["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    assert security["runAsNonRoot"] is True
    assert str(security["runAsUser"]) == user.split(":")[0]
    scripts = declared_scripts()
    assert _container(docs)["command"][0] in scripts


def test_grace_period_outlasts_prestop_the_longest_poll_and_the_drain(docs, tmp_path):
    """Derived from the ConfigMap's own settings and proxy/app.py's drain bound."""
    spec = docs["Deployment"]["spec"]["template"]["spec"]
    config = _proxy_config(docs, tmp_path)
    pre_stop = _container(docs)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # Drain._let_clients_move, then grpc_server.stop(grace=...)
    move_s = Connections(config.grpc_max_connection_age_s).lifetime_s
    drain_s = min(config.shutdown_grace_s, 10.0)
    longest_poll_s = config.receive.max_polling_ms / 1000
    needed = float(pre_stop[1]) + move_s + longest_poll_s + drain_s
    assert spec["terminationGracePeriodSeconds"] > needed


async def test_probe_paths_answer_on_a_proxy_run_with_the_configmap(docs, tmp_path, cluster):
    """The ConfigMap's settings run a real proxy (on loopback and free ports here), and the
    Deployment's probes get 200 from it; readiness turns 503 once it stops."""
    config = _proxy_config(docs, tmp_path)
    config.grpc_host = config.http_host = "127.0.0.1"
    config.grpc_port = config.http_port = 0
    config.namesrv_addrs = [cluster.namesrv_address]
    app = ProxyApp(config)
    await app.start()
    container = _container(docs)
    base = f"http://127.0.0.1:{app.http_port}"
    try:
        async with aiohttp.ClientSession() as http:
            for probe in ("readinessProbe", "livenessProbe"):
                async with http.get(base + container[probe]["httpGet"]["path"]) as r:
                    assert r.status == 200, probe
            app.ready = False  # the first thing SIGTERM does
            async with http.get(base + container["readinessProbe"]["httpGet"]["path"]) as r:
                assert r.status == 503
    finally:
        await app.stop()


def test_the_fleet_service_lists_every_pod_on_the_fleet_port(docs, tmp_path):
    """deploy/k8s/fleet/service.yaml: headless (its DNS name resolves to the pods), on the
    container's fleet port; with ``peers`` set to its name, the ConfigMap loads, and each
    pod advertises its IP on that port."""
    (fleet,) = [d for d in yaml.safe_load_all((K8S / "fleet" / "service.yaml").read_text()) if d]
    assert core_errors(fleet) == []
    spec = fleet["spec"]
    assert spec["clusterIP"] == "None"
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    container = _container(docs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    ((port,),) = [(p["port"],) for p in spec["ports"] if p["targetPort"] == "fleet"]
    assert port == ports["fleet"]
    text = docs["ConfigMap"]["data"]["proxy.toml"].replace(
        "peers = []", f'peers = ["dns:{fleet["metadata"]["name"]}:{port}"]'
    )
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    env = {e["name"]: e.get("value") for e in container["env"]}
    config = load(str(path), env={"RMQ_PROXY_FLEET_ADVERTISE": "10.0.0.7:8083"})
    assert config.fleet.enabled and config.fleet.port == port
    assert config.fleet.advertise == "10.0.0.7:8083"
    assert env["RMQ_PROXY_FLEET_ADVERTISE"] == f"$(POD_IP):{port}"
