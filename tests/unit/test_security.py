"""proxy.security without a server: signatures, the user file, permissions, the guard."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from prometheus_client import CollectorRegistry

from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import load
from proxy.remoting.bodies import reading
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.security import signing
from proxy.security.config import TlsMode
from proxy.security.guard import RESOURCES, DenialKind, Denied, Guard
from proxy.security.users import Pattern, Permissions, UserFileError, UserStore

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z
DT = "20231114T221320Z"

USERS = """
[[users]]
access_key = "alice"
secret_key = "alice-secret"
publish = ["orders", "orders-*"]
deny_publish = ["orders-internal"]
subscribe = [{ group = "billing", topic = "orders" }, { group = "audit-*", topic = "*" }]
deny_subscribe = [{ group = "*", topic = "secret" }]

[[users]]
access_key = "root"
secret_key_env = "ROOT_SECRET"
super_user = true
deny_publish = ["frozen"]
"""


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text(USERS)
    return UserStore.load(path, env={"ROOT_SECRET": "root-secret"})


def metadata(ak="alice", sk="alice-secret", dt=DT):
    return [
        ("x-mq-client-id", "c"),
        ("x-mq-date-time", dt),
        ("authorization", signing.authorization_header(ak, sk, dt)),
    ]


def test_client_signature_is_hmac_sha1_of_the_date_time_in_hex():
    header = signing.authorization_header("ak", "sk", DT)
    expected = hmac.new(b"sk", DT.encode(), hashlib.sha1).hexdigest()
    assert (
        header
        == f"MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature={expected}"
    )


def test_parse_accepts_upper_case_hex_and_credential_scope():
    sig_hex = hmac.new(b"sk", DT.encode(), hashlib.sha1).hexdigest().upper()  # Node client
    header = (
        f"MQv2-HMAC-SHA1 Credential=ak/extra, SignedHeaders=x-mq-date-time, Signature={sig_hex}"
    )
    sig = signing.parse(header, DT)
    assert sig.access_key == "ak"
    assert signing.verify(sig, "sk")
    assert not signing.verify(sig, "other")


@pytest.mark.parametrize(
    ("header", "date_time", "reason"),
    [
        (None, DT, "missing"),
        ("", DT, "missing"),
        # The Python client without credentials: an empty access key.
        ("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=ab", DT, "missing"),
        ("Basic dXNlcjpwYXNz", DT, "malformed"),
        ("MQv2-HMAC-SHA1 Credential=ak, Signature=zz", DT, "malformed"),
        ("MQv2-HMAC-SHA1 Credential=ak", DT, "malformed"),
        ("MQv2-HMAC-SHA1 Credential=ak, junk, Signature=ab", DT, "malformed"),
        ("MQv2-HMAC-SHA1 Credential=ak, Signature=abcd", None, "malformed"),
    ],
)
def test_parse_refuses(header, date_time, reason):
    with pytest.raises(signing.SignatureError) as err:
        signing.parse(header, date_time)
    assert err.value.reason == reason


def test_freshness_window():
    signing.check_fresh(DT, NOW + 899, 900)
    signing.check_fresh(DT, NOW - 899, 900)
    for now in (NOW + 901, NOW - 901):
        with pytest.raises(signing.SignatureError) as err:
            signing.check_fresh(DT, now, 900)
        assert err.value.reason == "stale"
    with pytest.raises(signing.SignatureError) as err:
        signing.check_fresh("2023-11-14 22:13:20", NOW, 900)
    assert err.value.reason == "malformed"


def test_remoting_signature_covers_sorted_field_values_and_body():
    cmd = RemotingCommand(10, {"topic": "T", "b": "2", "a": "1"}, b"BODY")
    signing.RemotingSigner("proxy", "sk")(cmd)
    assert cmd.fields["AccessKey"] == "proxy"
    # Values in the order of their names (AccessKey, a, b, topic), then the body.
    content = b"proxy" + b"1" + b"2" + b"T" + b"BODY"
    expected = base64.b64encode(hmac.new(b"sk", content, hashlib.sha1).digest()).decode()
    assert cmd.fields["Signature"] == expected
    # Signing again (a retried command) replaces the signature instead of signing it.
    signing.RemotingSigner("proxy", "sk")(cmd)
    assert cmd.fields["Signature"] == expected
    assert "sk" not in repr(signing.RemotingSigner("proxy", "sk"))


def test_patterns():
    assert Pattern("orders").matches("orders") and not Pattern("orders").matches("orders2")
    assert Pattern("orders-*").matches("orders-eu") and not Pattern("orders-*").matches("order")
    assert Pattern("*").matches("anything")
    for bad in ("", "or*ders", "*orders"):
        with pytest.raises(UserFileError):
            Pattern(bad)


def test_permissions_deny_wins(store):
    alice = store.get("alice").permissions
    assert alice.may_publish("orders") and alice.may_publish("orders-eu")
    assert not alice.may_publish("orders-internal")  # denied though orders-* allows
    assert not alice.may_publish("payments")
    assert alice.may_subscribe("billing", "orders")
    assert not alice.may_subscribe("billing", "orders-eu")
    assert alice.may_subscribe("audit-x", "payments")
    assert not alice.may_subscribe("audit-x", "secret")  # denied for every group
    assert alice.may_see("orders-eu") and alice.may_see("payments")
    assert not alice.may_see("secret")
    root = store.get("root").permissions
    assert root.may_publish("anything") and root.may_subscribe("g", "t")
    assert not root.may_publish("frozen")


def test_user_file_errors_never_echo_secrets(tmp_path):
    bad = tmp_path / "users.toml"
    bad.write_text('[[users]]\naccess_key = "a"\nsecret_key = "s3cr3t-value\n')  # broken TOML
    with pytest.raises(UserFileError) as err:
        UserStore.load(bad)
    assert "s3cr3t" not in str(err.value)
    twice = '[[users]]\naccess_key = "a"\nsecret_key = "x"\n'
    bad.write_text(twice + twice)
    with pytest.raises(UserFileError, match="twice"):
        UserStore.load(bad)
    bad.write_text('[[users]]\naccess_key = "a"\nsecret_key_env = "NOPE"\n')
    with pytest.raises(UserFileError, match="NOPE"):
        UserStore.load(bad, env={})
    as_json = tmp_path / "users.json"
    as_json.write_text('{"users": [{"access_key": "j", "secret_key": "k", "publish": ["*"]}]}')
    user = UserStore.load(as_json).get("j")
    assert user is not None and isinstance(user.permissions, Permissions)
    assert user.permissions.may_publish("x")
    assert "secret_key" not in repr(UserStore.load(as_json).get("j"))


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("10.2.3.4:5000", True),
        ("[::ffff:10.2.3.4]:5000", True),  # an IPv4 client of an IPv6 socket
        ("2001:db8::7:4567", True),  # a PROXY header's IPv6 host:port, no brackets
        ("[2001:db8::7]:4567", True),
        ("192.168.0.1:5000", False),
        ("not an address", False),
        (None, False),
    ],
)
def test_source_ips_take_networks_and_single_addresses(tmp_path, address, allowed):
    users = tmp_path / "users.toml"
    users.write_text(
        '[[users]]\naccess_key = "a"\nsecret_key = "x"\n'
        'source_ips = ["10.0.0.0/8", "2001:db8::7"]\n'
    )
    user = UserStore.load(users).get("a")
    assert user is not None
    assert user.permissions.may_connect_from(address) is allowed
    users.write_text('[[users]]\naccess_key = "a"\nsecret_key = "x"\nsource_ips = ["10.0.0"]\n')
    with pytest.raises(UserFileError, match="source_ips"):
        UserStore.load(users)


def _guard(store, **kw):
    return Guard(store, CollectorRegistry(), clock=lambda: NOW, **kw)


def _denied(guard, rpc, request, md):
    with pytest.raises(Denied) as err:
        guard.check(rpc, request, md)
    return err.value


def test_guard_authentication_reasons(store):
    guard = _guard(store)
    req = api.HeartbeatRequest()
    assert guard.check("Heartbeat", req, metadata()).access_key == "alice"
    cases = {
        "missing": [("x-mq-client-id", "c")],
        "bad_signature": metadata(sk="wrong"),
        "unknown_user": metadata(ak="mallory"),
        "stale": metadata(dt="20231114T200000Z"),
        "malformed": [("x-mq-date-time", DT), ("authorization", "MQv2-HMAC-SHA1 nonsense")],
    }
    for reason, md in cases.items():
        denied = _denied(guard, "Heartbeat", req, md)
        assert (denied.kind, denied.reason) == (DenialKind.UNAUTHENTICATED, reason)
    # Unknown user and wrong secret read the same to the client.
    assert _denied(guard, "Heartbeat", req, metadata(ak="x")).message == "invalid credentials"
    assert _denied(guard, "Heartbeat", req, metadata(sk="x")).message == "invalid credentials"


def test_guard_authorization_per_rpc(store):
    guard = _guard(store)
    topic = pb.Resource(name="orders")
    send = api.SendMessageRequest(
        messages=[pb.Message(topic=topic), pb.Message(topic=pb.Resource(name="payments"))]
    )
    denied = _denied(guard, "SendMessage", send, metadata())
    assert (denied.kind, denied.reason) == (DenialKind.FORBIDDEN, "forbidden")
    assert "payments" in denied.message
    ok = api.SendMessageRequest(messages=[pb.Message(topic=topic)])
    guard.check("SendMessage", ok, metadata())
    receive = api.ReceiveMessageRequest(
        group=pb.Resource(name="billing"), message_queue=pb.MessageQueue(topic=topic)
    )
    guard.check("ReceiveMessage", receive, metadata())
    receive.group.name = "other"
    assert _denied(guard, "ReceiveMessage", receive, metadata()).kind is DenialKind.FORBIDDEN
    ack = api.AckMessageRequest(group=pb.Resource(name="other"), topic=topic)
    assert _denied(guard, "AckMessage", ack, metadata()).kind is DenialKind.FORBIDDEN
    route = api.QueryRouteRequest(topic=pb.Resource(name="secret"))
    assert _denied(guard, "QueryRoute", route, metadata()).kind is DenialKind.FORBIDDEN
    # An RPC the guard does not know is refused, not waved through.
    assert _denied(guard, "SomethingNew", None, metadata()).kind is DenialKind.FORBIDDEN
    # Authentication only: the same send passes.
    _guard(store, authorization=False).check("SendMessage", send, metadata())


def _settings_denied(guard, user, settings, source=None) -> Denied:
    with pytest.raises(Denied) as err:
        guard.authorize("Telemetry", user, settings, source)
    return err.value


def test_telemetry_settings_are_authorized_for_the_streams_user(store):
    """A stream's start needs a signature only; each Settings it carries is what the proxy
    would register and relay in the user's name: a consumer subscribes its group to each
    topic, a producer publishes to each topic (the Apache proxy's Settings contexts)."""
    registry = CollectorRegistry()
    guard = Guard(store, registry, clock=lambda: NOW)
    alice = guard.check("Telemetry", None, metadata())  # the stream's start: no resource

    def consumer(group: str, *topics: str) -> pb.Settings:
        entries = [pb.SubscriptionEntry(topic=pb.Resource(name=t)) for t in topics]
        sub = pb.Subscription(group=pb.Resource(name=group), subscriptions=entries)
        return pb.Settings(client_type=pb.ClientType.PUSH_CONSUMER, subscription=sub)

    def producer(*topics: str) -> pb.Settings:
        publishing = pb.Publishing(topics=[pb.Resource(name=t) for t in topics])
        return pb.Settings(client_type=pb.ClientType.PRODUCER, publishing=publishing)

    guard.authorize("Telemetry", alice, consumer("billing", "orders"))
    guard.authorize("Telemetry", alice, consumer("audit-eu", "anything", "else"))
    guard.authorize("Telemetry", alice, consumer("billing"))  # no topic: the group's own
    guard.authorize("Telemetry", alice, producer("orders", "orders-eu"))
    guard.authorize("Telemetry", alice, pb.Settings())  # neither: nothing to allow
    for settings, what in [
        (consumer("billing", "orders", "payments"), "'payments' as group 'billing'"),
        (consumer("audit-eu", "secret"), "'secret'"),  # denied to every group
        (consumer("anyone"), "group 'anyone'"),
        (producer("orders", "orders-internal"), "publish to 'orders-internal'"),
    ]:
        denied = _settings_denied(guard, alice, settings)
        assert (denied.kind, denied.reason) == (DenialKind.FORBIDDEN, "forbidden")
        assert what in denied.message, denied.message
    counted = registry.get_sample_value(
        "rocketmq_proxy_auth_denied_total", {"rpc": "telemetry", "reason": "forbidden"}
    )
    assert counted == 4
    # The user as the user file says now: a reload that drops it refuses its streams' next
    # Settings; authentication only lets every Settings of a known user through.
    guard.users = UserStore([])
    denied = _settings_denied(guard, alice, consumer("billing", "orders"))
    assert (denied.kind, denied.reason) == (DenialKind.UNAUTHENTICATED, "unknown_user")
    open_guard = _guard(store, authorization=False)
    open_guard.authorize("Telemetry", alice, producer("orders-internal"))


def test_every_served_rpc_has_resources():
    """Every RPC of the v2 API the proxy serves is in the guard's table: one missing is
    refused to every user of a users file (EndTransaction was, so no producer of a users
    file could end a transaction)."""
    from proxy.api.v2.service_pb2_grpc import MessagingServiceServicer

    rpcs = {name for name in vars(MessagingServiceServicer) if name[:1].isupper()}
    not_served = {"UpdateOffset", "GetOffset", "QueryOffset", "PullMessage"}  # NOT_IMPLEMENTED
    assert rpcs - not_served == set(RESOURCES)


def test_security_config_from_toml_and_environment(tmp_path):
    path = tmp_path / "proxy.toml"
    path.write_text('[security]\nusers_file = "/etc/users.toml"\nclock_skew_s = 60.0\n')
    config = load(str(path), env={"RMQ_PROXY_SECURITY_BROKER_ACCESS_KEY": "p",
                                   "RMQ_PROXY_SECURITY_BROKER_SECRET_KEY": "hidden"})  # fmt: skip
    assert config.security.users_file == "/etc/users.toml"
    assert config.security.clock_skew_s == 60.0
    assert config.security.broker_secret_key == "hidden"
    assert "hidden" not in repr(config)
    assert load(env={}).security.tls is False
    with pytest.raises(ValueError, match="go together"):
        load(env={"RMQ_PROXY_SECURITY_TLS_CERT_FILE": "/x.pem"})
    path.write_text("[security]\nnope = 1\n")
    with pytest.raises(ValueError, match="unknown setting"):
        load(str(path), env={})


def test_the_tls_mode_and_its_certificate():
    default = load(env={}).security
    assert default.tls_mode is TlsMode.PERMISSIVE and default.serves_tls  # self-signed
    enforcing = load(env={"RMQ_PROXY_SECURITY_TLS_MODE": "enforcing"}).security
    assert enforcing.tls_mode is TlsMode.ENFORCING and enforcing.serves_tls
    assert not load(env={"RMQ_PROXY_SECURITY_TLS_MODE": "disabled"}).security.serves_tls
    no_cert = {"RMQ_PROXY_SECURITY_TLS_SELF_SIGNED": "false"}
    assert not load(env=no_cert).security.serves_tls  # permissive: plaintext only
    with pytest.raises(ValueError, match="enforcing needs tls_cert_file"):
        load(env=no_cert | {"RMQ_PROXY_SECURITY_TLS_MODE": "enforcing"})
    with pytest.raises(ValueError, match="must be one of permissive, enforcing, disabled"):
        load(env={"RMQ_PROXY_SECURITY_TLS_MODE": "strict"})


def test_the_example_files_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "deploy" / "security"
    names = ("ORDERS_SERVICE_SECRET", "BILLING_SECRET", "AUDITOR_SECRET", "OPS_ADMIN_SECRET")
    secrets = dict.fromkeys(names, "s")
    users = UserStore.load(root / "users.example.toml", env=secrets)
    billing, auditor = users.get("billing"), users.get("auditor")
    assert billing is not None and auditor is not None
    assert isinstance(billing.permissions, Permissions)
    assert isinstance(auditor.permissions, Permissions)
    assert billing.permissions.may_subscribe("billing-eu", "orders-eu")
    assert not auditor.permissions.may_subscribe("audit", "payroll")
    config = load(str(root / "proxy-secure.example.toml"),
                  env={"RMQ_PROXY_SECURITY_BROKER_SECRET_KEY": "s"})  # fmt: skip
    assert config.security.tls and config.security.authentication


def test_source_ips_hold_with_authentication_only(tmp_path):
    """``authorization = false`` turns off what a user may do, not where it may connect
    from: a rule the operator wrote in the user file is never dropped without a word."""
    users = tmp_path / "users.toml"
    users.write_text(
        '[[users]]\naccess_key = "alice"\nsecret_key = "alice-secret"\n'
        'source_ips = ["10.0.0.0/8"]\n'
    )
    guard = _guard(UserStore.load(users), authorization=False)
    send = api.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="anything"))])
    assert guard.check("SendMessage", send, metadata(), "10.1.2.3:5000").access_key == "alice"
    with pytest.raises(Denied) as err:
        guard.check("SendMessage", send, metadata(), "192.0.2.9:5000")
    assert (err.value.kind, err.value.reason) == (DenialKind.FORBIDDEN, "forbidden")
    assert err.value.message == "user 'alice' may not connect from 192.0.2.9"
    # The remoting port's requests alike.
    cmd = RemotingCommand(RequestCode.HEART_BEAT, {signing.ACCESS_KEY_FIELD: "alice"}, b"{}")
    cmd.fields[signing.SIGNATURE_FIELD] = signing.remoting_signature(
        cmd.fields, cmd.body, "alice-secret"
    )
    body = reading(cmd)
    assert guard.check_remoting(cmd, body, "10.1.2.3:5000").access_key == "alice"
    with pytest.raises(Denied):
        guard.check_remoting(cmd, body, "192.0.2.9:5000")
