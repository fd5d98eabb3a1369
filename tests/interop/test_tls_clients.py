"""Each official client in its default TLS configuration, and in the one a user switches
to, through one proxy port in the default TLS mode (permissive): the Java client with TLS
on (its default, trusting any certificate) and off, the Python client with TLS off (its
default) and on (trusting the proxy's self-signed certificate, the file /v1/status names),
the Node client with its default (off). All at once, on stubs and on real brokers. Then a
proxy with TLS disabled: the Java client's default cannot start there, and the proxy's log
says why."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.official import scenarios as scenario
from testkit.official.harness import run_driver, start_proxy
from tests.interop.conftest import DEFAULT_MODE, targets

pytestmark = [pytest.mark.interop, pytest.mark.timeout(240)]

# (client, RMQ_INTEROP_TLS: None leaves the client's own default)
CONFIGURATIONS = [("java", None), ("java", "0"), ("python", None), ("python", "1"), ("node", None)]


def _status(proxy) -> dict:
    with urllib.request.urlopen(f"http://{proxy.http}/v1/status", timeout=5) as response:
        return json.load(response)


def _worker_security(status: dict) -> list[dict]:
    """Each serving process's security status (one proxy, or every worker of a group)."""
    if "workers" in status:
        return [w["status"]["security"] for w in status["workers"] if w["status"]]
    return [status["security"]]


@pytest.mark.parametrize("target", targets((DEFAULT_MODE,)), indirect=True)
def test_every_client_in_every_tls_configuration_on_one_port(target, proxy, run_client):
    security = _worker_security(_status(proxy))
    assert security and all(s["tls_mode"] == "permissive" for s in security), security
    cert_file = security[0]["tls"]["cert_file"]  # one certificate, made for every worker

    def one(lang: str, tls: str | None) -> None:
        env = {} if tls is None else {"RMQ_INTEROP_TLS": tls}
        if tls == "1" and lang == "python":
            env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = cert_file  # it checks certificates

        def run(*args, **kw):
            return run_client(*args, env=env, **kw)

        topic = target.new_topic(f"tls-{lang}")
        ids, prefix = scenario.produce(run, lang, proxy, topic, 5)
        group = scenario.unique(f"tls-{lang}")
        out = scenario.consume(run, lang, proxy, topic, group, "--expect", 5, "--ack")
        scenario.assert_delivered_once(out, ids, prefix, topic)

    with ThreadPoolExecutor(len(CONFIGURATIONS), thread_name_prefix="tls") as pool:
        futures = {f"{lang} TLS={tls or 'default'}": pool.submit(one, lang, tls)
                   for lang, tls in CONFIGURATIONS}  # fmt: skip
    failures = [f"{name}: {f.exception()}" for name, f in futures.items() if f.exception()]
    assert not failures, "\n\n".join(failures)
    # Both kinds of connection came through the one port.
    accepted = [s["front"]["accepted"] for s in _worker_security(_status(proxy))]
    assert sum(a["tls"] for a in accepted) > 0 and sum(a["plaintext"] for a in accepted) > 0


def test_a_proxy_with_tls_disabled_refuses_the_java_default_and_says_why(tmp_path):
    config = tmp_path / "proxy.toml"
    config.write_text('[security]\ntls_mode = "disabled"\n')
    proxy = start_proxy(tmp_path / "proxy", ("tls-off",), brokers=1,
                        extra_args=("--config", str(config), "--workers", "1"))  # fmt: skip
    try:
        done = run_driver("java", ["produce", "--endpoint", proxy.grpc, "--topic", "tls-off",
                                   "--count", "1", "--deadline-seconds", "60"],
                          timeout=90, home=tmp_path / "java")  # fmt: skip
        assert done.returncode != 0, done.stdout
        # Logged when the client connected, before it gave up.
        line = next((li for li in proxy.logs().splitlines() if "refused" in li), proxy.logs())
        assert "tls client ipv4:127.0.0.1:" in line and "tls_mode is disabled" in line, line
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"
