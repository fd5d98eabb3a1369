"""The proxy in front of real RocketMQ 5.5.0 brokers with ACL 2.0 on (authentication and
authorization): it signs its remoting requests with its own credentials (the brokers'
``innerClientAuthenticationCredentials``, a super user), and the same requests unsigned or
signed with a wrong secret are refused by the brokers.

A small cluster of its own (one name server, one broker), started once for this module and
stopped by process id: the session's shared ``real_cluster`` runs without ACL.
"""

from __future__ import annotations

import json

import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.config import ProxyConfig, ReceiveConfig, ReceiveMode
from proxy.remoting.answers import BrokerError
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import CreateTopicHeader, TopicHeader
from proxy.security.config import AuthSource, SecurityConfig
from proxy.security.signing import RemotingSigner
from testkit.waits import wait_for, wait_until
from tests.conftest import ProxyOnStubs
from tests.support.secure_client import SecureLeanClient

pytestmark = [pytest.mark.real, pytest.mark.timeout(240)]

PROXY_AK = "rmq-proxy"
PROXY_SK = "proxy-secret-1234"
TOPIC = "acl-orders"
GROUP = "acl-billing"

ACL_CONF = {
    "authenticationEnabled": "true",
    "authorizationEnabled": "true",
    "authenticationProvider":
        "org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider",
    "authenticationMetadataProvider":
        "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider",
    "authorizationProvider":
        "org.apache.rocketmq.auth.authorization.provider.DefaultAuthorizationProvider",
    "authorizationMetadataProvider":
        "org.apache.rocketmq.auth.authorization.provider.LocalAuthorizationMetadataProvider",
    # The super user the proxy signs as (created by the broker at start).
    "innerClientAuthenticationCredentials": json.dumps(
        {"accessKey": PROXY_AK, "secretKey": PROXY_SK}, separators=(",", ":")
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def acl_cluster():
    from rocketmq_local.admin import admin_call
    from rocketmq_local.launcher import LauncherError, RealCluster

    try:
        cluster = RealCluster.start(1, broker_conf=ACL_CONF)
    except LauncherError as exc:
        pytest.fail(f"real RocketMQ cluster with ACL did not start: {exc}", pytrace=False)
    try:
        signer = RemotingSigner(PROXY_AK, PROXY_SK)
        for broker in cluster.brokers:
            create = RemotingCommand(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                CreateTopicHeader(TOPIC, read_queue_nums=2, write_queue_nums=2).encode(),
            )
            signer(create)
            answer = admin_call(broker.address, create)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
        get_route = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, TopicHeader(TOPIC).encode())
        wait_for(
            lambda: admin_call(cluster.namesrv_address, get_route).code == ResponseCode.SUCCESS,
            timeout=15,
            step=0.1,
            what="the topic's route",
        )
        yield cluster
    finally:
        cluster.stop()


async def _proxy(namesrv: str, security: SecurityConfig) -> ProxyOnStubs:
    config = ProxyConfig(
        grpc_port=0,
        http_port=0,
        namesrv_addrs=[namesrv],
        receive=ReceiveConfig(mode=ReceiveMode.NOTIFY, min_polling_ms=200),
        security=security,
    )
    proxy = ProxyOnStubs(config, None)
    await proxy.start()
    return proxy


async def test_unsigned_and_wrongly_signed_requests_are_refused_by_the_broker(acl_cluster):
    """The brokers really enforce ACL: without the proxy's signature, or with a signature
    made with the wrong secret, a send is refused."""
    broker = acl_cluster.brokers[0]
    for signer in (None, RemotingSigner(PROXY_AK, "not-the-secret")):
        client = BrokerClient(broker.name, broker.address, request_hook=signer)
        try:
            with pytest.raises(BrokerError) as refused:
                await client.send(TOPIC, b"unsigned")
        finally:
            await client.close()
        assert refused.value.code != ResponseCode.SUCCESS
    signed = BrokerClient(
        broker.name, broker.address, request_hook=RemotingSigner(PROXY_AK, PROXY_SK)
    )
    try:
        result = await signed.send(TOPIC, b"signed")
    finally:
        await signed.close()
    assert result.msg_id


async def test_proxy_signs_its_requests_to_acl_brokers(acl_cluster, tmp_path):
    """Send, receive and ack through the proxy, which authenticates its client and signs
    every request to the broker (pop, ack, notification, send)."""
    users = tmp_path / "users.toml"
    users.write_text(
        '[[users]]\naccess_key = "app"\nsecret_key = "app-secret"\n'
        f'publish = ["{TOPIC}"]\nsubscribe = [{{ group = "{GROUP}", topic = "{TOPIC}" }}]\n'
    )
    security = SecurityConfig(
        users_file=str(users), broker_access_key=PROXY_AK, broker_secret_key=PROXY_SK
    )
    proxy = await _proxy(acl_cluster.namesrv_address, security)
    client = SecureLeanClient(
        f"127.0.0.1:{proxy.grpc_port}", access_key="app", secret_key="app-secret"
    )
    try:
        route = await client.query_route(TOPIC)
        assert route.status.code == pb.Code.OK, route.status.message
        sent = await client.send(TOPIC, b"through-the-proxy")
        assert sent.status.code == pb.Code.OK, sent.status.message
        # The topic may also hold the message the test above sent straight to the broker,
        # possibly answered first: receive until ours has come too.
        bodies: list[bytes] = []
        for _ in range(5):
            got = await client.receive(GROUP, TOPIC, await_ms=5_000)
            assert got.status == pb.Code.OK, got.message
            bodies += [m.body for m in got.messages]
            acked = await client.ack(GROUP, TOPIC, got.messages)
            assert acked.status.code == pb.Code.OK, acked.status.message
            if b"through-the-proxy" in bodies:
                break
        assert b"through-the-proxy" in bodies
        status = proxy.status()["security"]
        assert isinstance(status, dict) and status["broker_signing"] is True
        assert PROXY_SK not in json.dumps(proxy.status())
    finally:
        await client.close()
        await proxy.stop()


async def test_proxy_without_broker_credentials_cannot_send(acl_cluster):
    """The same proxy without its credentials: the broker refuses, the client is told."""
    proxy = await _proxy(acl_cluster.namesrv_address, SecurityConfig())
    client = SecureLeanClient(f"127.0.0.1:{proxy.grpc_port}")
    try:
        route = await client.query_route(TOPIC)  # the name server does not check ACL
        assert route.status.code == pb.Code.OK, route.status.message
        sent = await client.send(TOPIC, b"unsigned-through-the-proxy")
        assert sent.status.code != pb.Code.OK
    finally:
        await client.close()
        await proxy.stop()


def _admin(cluster, code: int, fields: dict[str, str], body: dict | None = None) -> None:
    """An ACL 2.0 admin request to every broker, signed as the super user: the request
    ``mqadmin createUser`` / ``createAcl`` / ``updateAcl`` / ``deleteUser -c`` sends."""
    from rocketmq_local.admin import admin_call

    signer = RemotingSigner(PROXY_AK, PROXY_SK)
    for broker in cluster.brokers:
        cmd = RemotingCommand(code, dict(fields), json.dumps(body).encode() if body else b"")
        signer(cmd)
        answer = admin_call(broker.address, cmd)
        assert answer.code == ResponseCode.SUCCESS, (code, answer.remark)


def _rules(user: str, *entries: tuple[str, list[str], str]) -> dict:
    return {
        "subject": f"User:{user}",
        "policies": [
            {
                "policyType": "Custom",
                "entries": [{"resource": r, "actions": a, "decision": d} for r, a, d in entries],
            }
        ],
    }


#: The Apache proxy reading the same users and rules from the cluster (its cluster mode's
#: metadata providers), refreshing them each second as ours does in the test below.
APACHE_ACL_CONF = {
    "authenticationEnabled": True,
    "authorizationEnabled": True,
    "authenticationProvider": ACL_CONF["authenticationProvider"],
    "authenticationMetadataProvider":
        "org.apache.rocketmq.proxy.auth.ProxyAuthenticationMetadataProvider",
    "authorizationProvider": ACL_CONF["authorizationProvider"],
    "authorizationMetadataProvider":
        "org.apache.rocketmq.proxy.auth.ProxyAuthorizationMetadataProvider",
    "innerClientAuthenticationCredentials": ACL_CONF["innerClientAuthenticationCredentials"],
    "enableAclRpcHookForClusterMode": True,
    "userCacheRefreshSeconds": 1,
    "aclCacheRefreshSeconds": 1,
}  # fmt: skip


@pytest.fixture(scope="module")
def apache_acl_proxy(acl_cluster):
    from rocketmq_local.launcher import LauncherError

    try:
        return acl_cluster.start_apache_proxy(settings=APACHE_ACL_CONF)
    except LauncherError as exc:
        pytest.fail(f"the Apache proxy with ACL did not start: {exc}", pytrace=False)


@pytest.mark.parametrize("peer", ["ours", "apache"])
async def test_the_clusters_own_users_and_rules_hold_through_the_proxy(acl_cluster, request, peer):
    """auth_source "cluster" on real brokers, beside the Apache proxy reading the same:
    users and rules made on the brokers decide what each client may do through the proxy,
    with the same code and words through both, and a rule updated or a user deleted there
    holds within the caches' refresh."""
    alice, mallory = f"alice-{peer}", f"mallory-{peer}"
    for user in (alice, mallory):
        body = {"username": user, "password": f"{user}-secret", "userType": "Normal"}
        _admin(acl_cluster, RequestCode.AUTH_CREATE_USER, {"username": user}, body)
    alice_rules = _rules(
        alice, (f"Topic:{TOPIC}", ["Pub", "Sub"], "Allow"), (f"Group:{GROUP}", ["Sub"], "Allow")
    )
    mallory_rules = _rules(mallory, ("*", ["All"], "Allow"), (f"Topic:{TOPIC}", ["Pub"], "Deny"))
    _admin(acl_cluster, RequestCode.AUTH_CREATE_ACL, {"subject": f"User:{alice}"}, alice_rules)
    _admin(acl_cluster, RequestCode.AUTH_CREATE_ACL, {"subject": f"User:{mallory}"}, mallory_rules)
    security = SecurityConfig(
        auth_source=AuthSource.CLUSTER, broker_access_key=PROXY_AK, broker_secret_key=PROXY_SK,
        cluster_users_refresh_s=1.0,
    )  # fmt: skip
    if peer == "ours":
        proxy = await _proxy(acl_cluster.namesrv_address, security)
        endpoint = f"127.0.0.1:{proxy.grpc_port}"
    else:
        proxy = None
        endpoint = request.getfixturevalue("apache_acl_proxy").grpc_address
    users = ((alice, f"{alice}-secret"), (mallory, f"{mallory}-secret"), ("ghost", "x"),
             (alice, "wrong"))  # fmt: skip
    clients = {
        name: SecureLeanClient(endpoint, access_key=user, secret_key=secret)
        for name, (user, secret) in zip(("alice", "mallory", "ghost", "wrong"), users, strict=True)
    }
    try:
        sent = await clients["alice"].send(TOPIC, b"by-alice")
        assert sent.status.code == pb.Code.OK, sent.status.message
        if peer == "ours":  # the Apache proxy answers a receive before Settings with a 50001
            got = await clients["alice"].receive(GROUP, TOPIC, await_ms=3_000)
            assert got.status == pb.Code.OK, got.message
        refused = {
            name: (await clients[name].send(TOPIC, b"no")).status
            for name in ("mallory", "ghost", "wrong")
        }
        assert {n: (s.code, s.message) for n, s in refused.items()} == {
            "mallory": (pb.Code.UNAUTHORIZED, f"User:{mallory} has no permission to access "
                        f"Topic:{TOPIC} from 127.0.0.1, the decision is deny."),
            "ghost": (pb.Code.UNAUTHORIZED, "User:ghost is not found."),
            "wrong": (pb.Code.UNAUTHORIZED, "check signature failed."),
        }  # fmt: skip

        _admin(acl_cluster, RequestCode.AUTH_UPDATE_ACL, {"subject": f"User:{alice}"},
               _rules(alice, (f"Topic:{TOPIC}", ["Pub"], "Deny")))  # fmt: skip
        _admin(acl_cluster, RequestCode.AUTH_DELETE_USER, {"username": mallory})

        async def changed() -> bool:
            a = (await clients["alice"].send(TOPIC, b"after")).status
            m = (await clients["mallory"].send(TOPIC, b"after")).status
            return a.message.endswith("the decision is deny.") and (
                m.message == f"User:{mallory} is not found."
            )

        await wait_until(changed, timeout=15, step=0.5)
    finally:
        for client in clients.values():
            await client.close()
        if proxy is not None:
            await proxy.stop()
