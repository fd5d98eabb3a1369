"""The official Python client (rocketmq-python-client 5.1.2, its own process) against a proxy
process with TLS and users on. The client trusts a throw-away CA through gRPC's
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH and signs with the credentials it is given.

With the right credentials everything works over TLS; with none, wrong or expired ones, or
on a topic the user may not use, the client fails and the proxy counts the refusal under
its reason; a good client keeps being served in between.
"""

from __future__ import annotations

import urllib.request

import pytest

from testkit.official.harness import run_client, run_driver, start_proxy
from tests.support.tls_ca import make_ca

pytestmark = [pytest.mark.interop, pytest.mark.timeout(300)]

TOPICS = ("sec-orders", "sec-hidden")
USERS = """
[[users]]
access_key = "app"
secret_key = "app-secret"
publish = ["sec-orders"]
subscribe = [{ group = "sec-billing", topic = "sec-orders" }]
"""


@pytest.fixture
def secure(tmp_path):
    ca = make_ca(tmp_path / "ca")
    cert, key = ca.issue("server")
    users = tmp_path / "users.toml"
    users.write_text(USERS)
    config = tmp_path / "proxy.toml"
    config.write_text(
        f'[security]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n'
        f'users_file = "{users}"\nclock_skew_s = 300.0\n'
    )
    proxy = start_proxy(tmp_path / "proxy", TOPICS, extra_args=("--config", str(config)))
    try:
        yield proxy, ca
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


def _env(ca, access_key: str = "", secret_key: str = "") -> dict[str, str]:
    return {
        "RMQ_INTEROP_TLS": "1",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca.ca_cert),
        "RMQ_INTEROP_ACCESS_KEY": access_key,
        "RMQ_INTEROP_SECRET_KEY": secret_key,
    }


def _denied(proxy, reason: str) -> float:
    with urllib.request.urlopen(f"http://{proxy.http}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rocketmq_proxy_auth_denied_total{") and f'reason="{reason}"' in line
    )


def _produce(proxy, ca, home, topic="sec-orders", **credentials):
    args = ["produce", "--endpoint", proxy.grpc, "--topic", topic, "--count", "2",
            "--deadline-seconds", "40"]  # fmt: skip
    return run_driver("python", args, timeout=60, home=home, env=_env(ca, **credentials))


def test_python_client_over_tls_with_credentials(secure, tmp_path):
    proxy, ca = secure
    sent = run_client("python", "produce", "--endpoint", proxy.grpc, "--topic", "sec-orders",
                      "--count", "3", timeout=90, home=tmp_path / "p",
                      env=_env(ca, "app", "app-secret"))  # fmt: skip
    assert len(sent["ids"]) == 3
    got = run_client("python", "consume", "--endpoint", proxy.grpc, "--group", "sec-billing",
                     "--topic", "sec-orders", "--await-seconds", "5", "--expect", "3", "--ack",
                     timeout=120, home=tmp_path / "c",
                     env=_env(ca, "app", "app-secret"))  # fmt: skip
    assert sorted(m["id"] for m in got["messages"]) == sorted(sent["ids"]), got
    assert got["errors"] == []


def test_python_client_refusals_each_counted_and_others_served(secure, tmp_path):
    proxy, ca = secure
    cases = [
        ("missing", {}),
        ("bad_signature", {"access_key": "app", "secret_key": "wrong"}),
        ("unknown_user", {"access_key": "mallory", "secret_key": "x"}),
    ]
    for i, (reason, credentials) in enumerate(cases):
        before = _denied(proxy, reason)
        done = _produce(proxy, ca, tmp_path / f"bad{i}", **credentials)
        assert done.returncode != 0, f"{reason}: the client was served:\n{done.stdout}"
        assert _denied(proxy, reason) > before, f"{reason} not counted\n{done.stderr[-2000:]}"
        good = _produce(proxy, ca, tmp_path / f"good{i}", access_key="app", secret_key="app-secret")
        assert good.returncode == 0, good.stderr[-3000:]
    # A topic the user may not use: forbidden.
    before = _denied(proxy, "forbidden")
    done = _produce(proxy, ca, tmp_path / "forbidden", topic="sec-hidden",
                    access_key="app", secret_key="app-secret")  # fmt: skip
    assert done.returncode != 0
    assert _denied(proxy, "forbidden") > before
