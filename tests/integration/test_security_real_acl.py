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
from proxy.security.config import SecurityConfig
from proxy.security.signing import RemotingSigner
from testkit.waits import wait_for
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
