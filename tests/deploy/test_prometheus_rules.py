"""deploy/prometheus with Debian's promtool: the config and rules check, the rule unit tests
pass, and they are strict enough that every alert has a case that fires and one that must not
(an alert made never to fire, or stripped of its threshold, fails them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import PROMETHEUS_DIR

PROMTOOL = shutil.which("promtool")
RULES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
# One term of an alert expression: "<quantity> <comparison> <number>".
TERM = re.compile(r"^(?P<quantity>.+?)\s*(?P<op>==|!=|>=|<=|>|<)\s*(?P<threshold>-?[0-9.]+)$", re.S)


@pytest.fixture(autouse=True)
def _promtool() -> None:
    """make test installs it (make system-deps): missing, the tests fail, never skip."""
    if PROMTOOL is None:
        pytest.fail("promtool is missing: `make system-deps` installs Debian's prometheus")


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None  # the autouse fixture has failed the test otherwise
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def load_rules() -> list[dict]:
    rules = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def alert_terms(expr: str) -> list[re.Match]:
    """The "<quantity> <op> <threshold>" terms of an alert joined by `and`; the contract
    rules/ keeps so that tests can read each quantity on a live proxy."""
    terms = []
    for term in re.split(r"\band\b", expr):
        match = TERM.match(term.strip())
        assert match, f"not <quantity> <op> <number>: {term.strip()!r}"
        terms.append(match)
    return terms


def test_check_config_with_targets_written(make_prometheus_dir):
    config = make_prometheus_dir(["127.0.0.1:8082"], "127.0.0.1:9091")
    result = promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    # The targets the deployment wrote were found (no "does not exist" warning) and the
    # rule files were loaded through the relative glob.
    assert "does not exist" not in result.stdout + result.stderr
    assert f"SUCCESS: {len(RULES)} rule files found" in result.stdout


def test_config_contract():
    """What the deployments rely on (deploy/local, deploy/docker): job names, file_sd paths
    relative to the config file, honor_labels for the Pushgateway, rules/*.yml."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"rocketmq-proxy", "pushgateway"}
    assert jobs["rocketmq-proxy"]["file_sd_configs"][0]["files"] == ["targets/proxies.json"]
    assert jobs["rocketmq-proxy"].get("metrics_path", "/metrics") == "/metrics"
    assert jobs["pushgateway"]["file_sd_configs"][0]["files"] == ["targets/pushgateway.json"]
    assert jobs["pushgateway"]["honor_labels"] is True
    assert config["rule_files"] == ["rules/*.yml"]


def test_check_rules():
    result = promtool("check", "rules", *map(str, RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert RULES, "no rule files in deploy/prometheus/rules"


def test_rule_unit_tests_pass():
    assert UNIT_TESTS, "no promtool unit tests in deploy/prometheus/tests"
    result = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_are_quantity_against_threshold():
    alerts = [r for r in load_rules() if "alert" in r]
    names = {r["alert"] for r in alerts}
    # The list: down or not ready, notification errors, in-flight polls near the
    # limit, mode flapping, empty-answer ratio rising, DLQ sends.
    assert names == {
        "RocketMQProxyDown",
        "RocketMQProxyNotReady",
        "RocketMQProxyNotificationErrors",
        "RocketMQProxyLongPollsNearLimit",
        "RocketMQProxyModeFlapping",
        "RocketMQProxyEmptyAnswersRising",
        "RocketMQProxyDeadLetterSends",
        "RocketMQClientDeliveryLatencyHigh",  # the clients' own metrics (issue 42)
        "RocketMQConsumerLagHigh",  # a group behind its topic (issue 49)
    }
    for rule in alerts:
        terms = alert_terms(rule["expr"])
        assert all(terms), f"{rule['alert']}: not '<quantity> <op> <number>': {rule['expr']}"
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def _mutated_unit_test_fails(tmp_path: Path, alert: str, new_expr: str) -> str:
    """Run the unit tests against a copy of the rules with ``alert``'s expression replaced;
    return promtool's output, asserting it failed."""
    copy = tmp_path / "prometheus"
    shutil.copytree(PROMETHEUS_DIR, copy)
    for path in (copy / "rules").glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == alert:
                    rule["expr"] = new_expr
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    tests = [str(p) for p in sorted((copy / "tests").glob("*.yml"))]
    result = promtool("test", "rules", *tests)
    assert result.returncode != 0, f"{alert}: the unit tests pass with expr {new_expr!r}"
    return result.stdout + result.stderr


@pytest.mark.parametrize("alert", [r["alert"] for r in load_rules() if "alert" in r])
def test_each_alert_has_a_firing_and_a_quiet_case(tmp_path, alert):
    rule = next(r for r in load_rules() if r.get("alert") == alert)
    # Never fires: some unit test expects it to.
    out = _mutated_unit_test_fails(tmp_path / "never", alert, "vector(1) < 0")
    assert alert in out
    # No threshold (fires wherever the quantity exists): some unit test expects quiet.
    quantities = " and ".join(f"({t['quantity']})" for t in alert_terms(rule["expr"]))
    out = _mutated_unit_test_fails(tmp_path / "always", alert, quantities)
    assert alert in out
