"""The proxy with security on, in front of broker stubs: TLS (with reload and client
certificates), authentication and authorization of every RPC, what is counted and what is
never shown."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
from pathlib import Path

import aiohttp
import grpc
import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.security.config import SecurityConfig, TlsMode
from testkit.event_log import part_files, read_records
from testkit.lean_client import TelemetryStream, consumer_settings
from testkit.waits import wait_until
from tests.support.secure_client import SecureLeanClient
from tests.support.tls_ca import make_ca

SECRET = "alice-secret-value"
USERS = f"""
[[users]]
access_key = "alice"
secret_key = "{SECRET}"
publish = ["orders"]
subscribe = [{{ group = "billing", topic = "orders" }}]

[[users]]
access_key = "bob"
secret_key = "bob-secret"
publish = ["audit-*"]
subscribe = [{{ group = "audit-readers", topic = "audit-*" }}]
"""


@pytest.fixture
def ca(tmp_path):
    return make_ca(tmp_path / "ca")


@pytest.fixture
async def secure_proxy(tmp_path, ca, start_proxy):
    """A proxy with TLS and users in front of one broker stub; ``secure_proxy(**security)``."""

    async def start(**security):
        cert, key = ca.issue("server")
        users = tmp_path / "users.toml"
        users.write_text(USERS)
        settings = {"tls_cert_file": str(cert), "tls_key_file": str(key),
                    "users_file": str(users), **security}  # fmt: skip
        return await start_proxy(
            mode="notify",
            brokers=1,
            topics=("orders", "audit-eu", "hidden"),
            event_log_dir=str(tmp_path / "events"),
            security=SecurityConfig(**settings),
        )

    yield start


@pytest.fixture
async def clients():
    made: list[SecureLeanClient] = []

    def connect(proxy, ca, **kw):
        client = SecureLeanClient(f"127.0.0.1:{proxy.grpc_port}", ca=ca.ca_cert, **kw)
        made.append(client)
        return client

    yield connect
    for client in made:
        await client.close()


async def _metrics(proxy, ssl_context=None) -> str:
    scheme = "https" if ssl_context else "http"
    async with aiohttp.ClientSession() as session:
        url = f"{scheme}://127.0.0.1:{proxy.http_port}/metrics"
        async with session.get(url, ssl=ssl_context or False) as response:
            return await response.text()


def _denied(text: str, rpc: str, reason: str) -> float:
    for line in text.splitlines():
        if line.startswith("rocketmq_proxy_auth_denied_total{") and (
            f'rpc="{rpc}"' in line and f'reason="{reason}"' in line
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_right_credentials_over_tls_send_receive_ack(secure_proxy, clients, ca):
    proxy = await secure_proxy()
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    assert (await alice.query_route("orders")).status.code == pb.Code.OK
    sent = await alice.send("orders", b"hello")
    assert sent.status.code == pb.Code.OK, sent.status.message
    got = await alice.receive("billing", "orders", await_ms=2_000)
    assert got.status == pb.Code.OK and [m.body for m in got.messages] == [b"hello"]
    assert (await alice.ack("billing", "orders", got.messages)).status.code == pb.Code.OK


@pytest.mark.parametrize(
    ("mode", "takes"),
    [
        ("permissive", {"tls", "plaintext"}),
        ("enforcing", {"tls"}),
        ("disabled", {"plaintext"}),
    ],
)
async def test_each_tls_mode_takes_the_clients_it_names(secure_proxy, ca, caplog, mode, takes):
    proxy = await secure_proxy(tls_mode=mode)
    for kind in ("tls", "plaintext"):
        client = SecureLeanClient(
            f"127.0.0.1:{proxy.grpc_port}",
            ca=ca.ca_cert if kind == "tls" else None,
            access_key="alice",
            secret_key=SECRET,
        )
        try:
            if kind in takes:
                assert (await client.query_route("orders")).status.code == pb.Code.OK
                continue
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.stub.QueryRoute(
                    api.QueryRouteRequest(topic=pb.Resource(name="orders")),
                    metadata=client.metadata,
                    timeout=3,
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await client.close()
    if mode == "disabled":  # the front names the refused client and why
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert refused and "tls client ipv4:127.0.0.1:" in refused[0], refused
        assert "security.tls_mode is disabled" in refused[0]


async def test_each_bad_credential_gets_unauthorized_and_others_keep_working(
    secure_proxy, clients, ca
):
    proxy = await secure_proxy()
    bad = {
        "missing": clients(proxy, ca),
        "bad_signature": clients(proxy, ca, access_key="alice", secret_key="wrong"),
        "unknown_user": clients(proxy, ca, access_key="mallory", secret_key="x"),
        "stale": clients(
            proxy, ca, access_key="alice", secret_key=SECRET, date_time="20200101T000000Z"
        ),
    }
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    for reason, client in bad.items():
        sent = await client.send("orders", b"nope")
        assert sent.status.code == pb.Code.UNAUTHORIZED, (reason, sent.status.message)
        got = await client.receive("billing", "orders", await_ms=1_000)
        assert got.status == pb.Code.UNAUTHORIZED, reason
        assert got.stream == ["status"]
        # A refused client does not disturb a good one.
        assert (await alice.send("orders", reason.encode())).status.code == pb.Code.OK
    text = await _metrics(proxy)
    for reason in bad:
        assert _denied(text, "send_message", reason) == 1.0, reason
        assert _denied(text, "receive_message", reason) == 1.0, reason
    got = await alice.receive("billing", "orders", await_ms=2_000)
    assert sorted(m.body for m in got.messages) == sorted(r.encode() for r in bad)


async def test_authorization_forbids_and_route_does_not_leak(secure_proxy, clients, ca):
    proxy = await secure_proxy()
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    bob = clients(proxy, ca, access_key="bob", secret_key="bob-secret")
    assert (await alice.send("audit-eu", b"x")).status.code == pb.Code.FORBIDDEN
    assert (await bob.send("audit-eu", b"x")).status.code == pb.Code.OK
    assert (await bob.receive("billing", "orders", await_ms=500)).status == pb.Code.FORBIDDEN
    assert (await alice.receive("audit-readers", "audit-eu", await_ms=500)).status == (
        pb.Code.FORBIDDEN
    )
    # A topic the user may not see: the same answer whether it exists or not.
    hidden = await alice.query_route("hidden")
    missing = await alice.query_route("no-such-topic")
    assert hidden.status.code == missing.status.code == pb.Code.FORBIDDEN
    assert not hidden.message_queues
    assert "hidden" in hidden.status.message and "exist" not in hidden.status.message
    text = await _metrics(proxy)
    assert _denied(text, "send_message", "forbidden") == 1.0
    assert _denied(text, "query_route", "forbidden") == 2.0


async def test_telemetry_settings_register_only_what_the_user_may(secure_proxy, clients, ca):
    """A Telemetry stream's start needs a signature only, but each Settings it carries is
    authorized: one naming a group or topic the user may not use is answered FORBIDDEN (as
    the Apache proxy answers a refused command), counted, and registers nothing with the
    brokers and relays no transaction check; the stream goes on, and its allowed Settings
    register as they say."""
    proxy = await secure_proxy()
    registrations = proxy.registrations
    assert registrations is not None
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    signed = tuple(h for h in alice.metadata if h[0] != "x-mq-client-id")
    consumer = TelemetryStream(alice, "alice-consumer", signed)
    producer = TelemetryStream(alice, "alice-producer", signed)

    def consumer_of(group: str, topic: str) -> pb.Settings:
        return consumer_settings(pb.ClientType.PUSH_CONSUMER, group, topic, 1000)

    def producer_of(topic: str) -> pb.Settings:
        publishing = pb.Publishing(topics=[pb.Resource(name=topic)])
        return pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=publishing)

    try:
        for settings in (consumer_of("billing", "hidden"), consumer_of("audit-readers", "orders")):
            refused = await consumer.settle(settings)
            assert refused.status.code == pb.Code.FORBIDDEN and not refused.HasField("settings")
        assert registrations.status()["clients"] == 0
        allowed = await consumer.settle(consumer_of("billing", "orders"))
        assert allowed.status.code == pb.Code.OK and allowed.HasField("settings")
        assert registrations.consumed() == {("billing", "orders")}
        # A later Settings on the open stream is authorized as the first was: refused, the
        # registration stays as the allowed one made it.
        later = await consumer.settle(consumer_of("billing", "hidden"))
        assert later.status.code == pb.Code.FORBIDDEN
        assert registrations.consumed() == {("billing", "orders")}
        refused = await producer.settle(producer_of("hidden"))
        assert refused.status.code == pb.Code.FORBIDDEN
        assert registrations.status()["clients"] == 1
        assert "hidden" not in proxy.transactions._sinks  # no check of it relayed here
        assert (await producer.settle(producer_of("orders"))).status.code == pb.Code.OK
        await wait_until(lambda: registrations.status()["clients"] == 2, timeout=5)
        assert "orders" in proxy.transactions._sinks
        assert proxy.session.status()["settings_refused"] == 4
        assert _denied(await _metrics(proxy), "telemetry", "forbidden") == 4.0
    finally:
        consumer.close()
        producer.close()


async def test_secrets_never_in_status_metrics_or_event_log(secure_proxy, clients, ca, tmp_path):
    proxy = await secure_proxy(broker_access_key="proxy", broker_secret_key="broker-secret-xyz")
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    intruder = clients(proxy, ca, access_key="alice", secret_key="guess-" + SECRET)
    await alice.send("orders", b"m")
    await alice.receive("billing", "orders", await_ms=1_000)
    await intruder.receive("billing", "orders", await_ms=500)
    await proxy.stop()  # flushes the event log
    status = json.dumps(proxy.status())
    text = await asyncio.to_thread(lambda: proxy.metrics.render()[0].decode())
    # The records as a reader gets them (a Parquet file's bytes are compressed).
    records = await asyncio.to_thread(read_records, part_files(tmp_path / "events"))
    logs = json.dumps(records) if records else ""
    assert logs, "the event log recorded the receives"
    for secret in (SECRET, "bob-secret", "broker-secret-xyz"):
        assert secret not in status and secret not in text and secret not in logs
    assert '"authentication": true' in status and '"broker_signing": true' in status


async def test_certificate_reload_on_file_change(secure_proxy, clients, ca, tmp_path):
    proxy = await secure_proxy(reload_interval_s=0.1)
    tls = proxy.security.tls
    before = tls.status()["cert_sha256"]
    new_cert, new_key = ca.issue("server2")
    # Replace the files as an operator (or cert-manager) does: write, then rename over.
    for src, dst in ((new_key, tls.key_file), (new_cert, tls.cert_file)):
        os.replace(src, dst)
    await wait_until(
        lambda: tls.status()["cert_sha256"] != before, timeout=5, step=0.05, what="the new pair"
    )
    after = tls.status()["cert_sha256"]
    assert after != before and tls.status()["reloads"] >= 1
    # A new connection is served the new certificate.
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", proxy.grpc_port))
    assert hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest() == after
    alice = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    assert (await alice.query_route("orders")).status.code == pb.Code.OK
    # A broken file keeps the pair in use and says so.
    await asyncio.to_thread(Path(tls.key_file).write_text, "not a key")
    await wait_until(
        lambda: bool(tls.status()["last_error"]), timeout=5, step=0.05, what="the reload error"
    )
    assert tls.status()["last_error"] and tls.status()["cert_sha256"] == after


async def test_user_file_reload(secure_proxy, clients, ca, tmp_path):
    proxy = await secure_proxy(reload_interval_s=0.1)
    carol = clients(proxy, ca, access_key="carol", secret_key="carol-secret")
    assert (await carol.send("orders", b"x")).status.code == pb.Code.UNAUTHORIZED
    users = tmp_path / "users.toml"
    users.write_text(USERS + '\n[[users]]\naccess_key = "carol"\nsecret_key = "carol-secret"\n'
                     'publish = ["orders"]\n')  # fmt: skip
    proxy.security.reload_now()  # what SIGHUP does

    async def accepted() -> bool:
        return (await carol.send("orders", b"x")).status.code == pb.Code.OK

    await wait_until(accepted, timeout=5, step=0.05, what="the new user accepted")
    users.write_text("[[users]\nbroken")
    proxy.security.reload_now()
    await wait_until(
        lambda: bool(proxy.status()["security"]["users"]["last_error"]),
        timeout=5,
        step=0.05,
        what="the users file's error",
    )
    assert proxy.status()["security"]["users"]["last_error"]
    assert (await carol.send("orders", b"y")).status.code == pb.Code.OK  # previous users stay


async def test_client_certificates_and_ops_tls(secure_proxy, clients, ca):
    proxy = await secure_proxy(tls_client_ca_file=str(ca.ca_cert), tls_ops=True)
    no_cert = clients(proxy, ca, access_key="alice", secret_key=SECRET)
    with pytest.raises(grpc.aio.AioRpcError):
        await no_cert.stub.QueryRoute(
            api.QueryRouteRequest(topic=pb.Resource(name="orders")),
            metadata=no_cert.metadata,
            timeout=3,
        )
    client_cert = ca.issue("client", server=False, cn="alice")
    with_cert = clients(proxy, ca, access_key="alice", secret_key=SECRET, client_cert=client_cert)
    assert (await with_cert.query_route("orders")).status.code == pb.Code.OK
    context = ssl.create_default_context(cafile=str(ca.ca_cert))
    context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    text = await _metrics(proxy, context)
    assert "rocketmq_proxy_ready 1.0" in text
    with pytest.raises(aiohttp.ClientError):
        await _metrics(proxy)  # plain HTTP to the TLS ops port


async def test_by_default_no_authentication_no_signing_and_tls_beside_plaintext(start_proxy, lean):
    proxy = await start_proxy(topics=("T",))
    client = lean(proxy)
    assert (await client.send("T", b"x")).status.code == pb.Code.OK
    security = proxy.status()["security"]
    assert security["authentication"] is False and security["broker_signing"] is False
    # TLS on by default as well, with a certificate of its own (permissive: plaintext too).
    assert security["tls_mode"] == "permissive" and security["tls"]["self_signed"] is True
    assert proxy.security.guard is None


async def test_a_users_source_ips_hold_behind_a_balancer(tmp_path, start_proxy):
    """``source_ips`` limits a user to client addresses: the client's own, or, with the
    PROXY protocol on, the one the balancer's header names (198.51.100.4 here)."""
    from testkit.balancer import Balancer

    users = tmp_path / "users.toml"
    users.write_text(
        USERS.replace('publish = ["orders"]', 'publish = ["orders"]\nsource_ips = ["10.0.0.0/8"]')
        + '\n[[users]]\naccess_key = "carol"\nsecret_key = "carol-secret"\n'
        'publish = ["orders"]\nsource_ips = ["198.51.100.0/24", "::1"]\n'
    )
    proxy = await start_proxy(
        brokers=1,
        topics=("orders",),
        security=SecurityConfig(
            users_file=str(users), proxy_protocol=True, tls_mode=TlsMode.DISABLED
        ),
    )

    def header(client: tuple[str, int]) -> bytes:
        return f"PROXY TCP4 198.51.100.4 127.0.0.1 {client[1]} 8081\r\n".encode()

    balancer = Balancer([(f"127.0.0.1:{proxy.grpc_port}", None)], header=header)
    endpoint = await balancer.start()
    made = [
        SecureLeanClient(endpoint, access_key="alice", secret_key=SECRET),
        SecureLeanClient(endpoint, access_key="carol", secret_key="carol-secret"),
        SecureLeanClient(
            f"127.0.0.1:{proxy.grpc_port}", access_key="carol", secret_key="carol-secret"
        ),
        SecureLeanClient(endpoint, access_key="bob", secret_key="bob-secret"),
    ]
    alice, carol, carol_direct, bob = made
    try:
        refused = await alice.send("orders", b"x")
        assert refused.status.code == pb.Code.FORBIDDEN
        assert refused.status.message == "user 'alice' may not connect from 198.51.100.4"
        assert (await carol.send("orders", b"x")).status.code == pb.Code.OK
        # From 127.0.0.1 itself, not in carol's list.
        assert (await carol_direct.send("orders", b"x")).status.code == pb.Code.FORBIDDEN
        # No source_ips: from anywhere (bob may not publish orders, but is not refused for
        # where he is).
        answer = await bob.send("orders", b"x")
        assert "connect from" not in answer.status.message
    finally:
        for client in made:
            await client.close()
        await balancer.close()
