"""``security.auth_source = "cluster"`` on broker stubs that serve ACL 2.0's admin reads
from a file (broker_stub/auth.py): the users and rules are the cluster's, read with
AUTH_GET_USER / AUTH_GET_ACL, decided as a 5.5.0 broker decides them, refused with the
Apache proxy's code and words on both client ports, changed without a restart, and with no
broker answering, the stated policy (proxy/security/cluster_users.py). The same on real
5.5.0 brokers with ACL on is tests/interop (issue 59)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.security.config import AuthSource, SecurityConfig
from proxy.security.signing import RemotingSigner
from testkit.metrics_text import total
from testkit.waits import wait_until
from tests.integration.test_remoting_port import send_v2
from tests.support.secure_client import SecureLeanClient

REFRESH_S = 0.5


def allow(*resources: str, actions=("Pub", "Sub"), decision: str = "Allow") -> list[dict]:
    return [{"resource": r, "actions": list(actions), "decision": decision} for r in resources]


def acl_file(alice_entries: list[dict]) -> dict:
    def acl(user: str, entries: list[dict]) -> dict:
        return {
            "subject": f"User:{user}",
            "policies": [{"policyType": "Custom", "entries": entries}],
        }

    return {
        "users": [
            {"username": "root", "password": "root-secret", "userType": "Super"},
            {"username": "alice", "password": "alice-secret"},
            {"username": "mallory", "password": "mallory-secret"},
            {"username": "carol", "password": "carol-secret", "userStatus": "disable"},
        ],
        "acls": [
            acl("alice", alice_entries),
            # Everything, but a deny on the topic: the literal entry decides.
            acl("mallory", allow("*", actions=("All",)) + allow("Topic:orders", decision="Deny")),
            acl("carol", allow("*", actions=("All",))),
        ],
    }


ALICE = allow("Topic:orders", "Group:billing")


@pytest.fixture
async def cluster_proxy(start_proxy, tmp_path):
    path = tmp_path / "acl.json"
    path.write_text(json.dumps(acl_file(ALICE)))
    security = SecurityConfig(
        auth_source=AuthSource.CLUSTER,
        broker_access_key="proxy",
        broker_secret_key="proxy-secret",
        cluster_users_refresh_s=REFRESH_S,
    )
    proxy = await start_proxy(
        brokers=2, topics=("orders", "hidden"), security=security,
        proxy_options={"remoting_port": 0}, broker_options={"acl_file": str(path)},
    )  # fmt: skip
    made: list = []

    def grpc_client(user: str, secret: str | None = None) -> SecureLeanClient:
        client = SecureLeanClient(
            f"127.0.0.1:{proxy.grpc_port}", access_key=user, secret_key=secret or f"{user}-secret"
        )
        made.append(client)
        return client

    def remoting_client(user: str, secret: str | None = None) -> RemotingClient:
        hook = RemotingSigner(user, secret or f"{user}-secret")
        client = RemotingClient(f"127.0.0.1:{proxy.remoting_port}", request_hook=hook)
        made.append(client)
        return client

    yield proxy, path, grpc_client, remoting_client
    for client in made:
        await client.close()


async def test_cluster_users_send_receive_and_ack_as_their_rules_say(cluster_proxy):
    _, _, connect, _ = cluster_proxy
    alice, root = connect("alice"), connect("root")
    sent = await alice.send("orders", b"hello")
    assert sent.status.code == pb.Code.OK, sent.status.message
    got = await alice.receive("billing", "orders", await_ms=2_000)
    assert got.status == pb.Code.OK and [m.body for m in got.messages] == [b"hello"]
    assert (await alice.ack("billing", "orders", got.messages)).status.code == pb.Code.OK
    # A super user's rules are not read: it may do anything.
    assert (await root.send("hidden", b"x")).status.code == pb.Code.OK
    # alice may not use another topic or group: nothing matches, so no (the broker's words).
    refused = await alice.send("hidden", b"x")
    assert (refused.status.code, refused.status.message) == (
        pb.Code.UNAUTHORIZED,
        "User:alice has no permission to access Topic:hidden from 127.0.0.1, no matched policies.",
    )
    refused_receive = await alice.receive("other-group", "orders", await_ms=500)
    assert refused_receive.status == pb.Code.UNAUTHORIZED
    assert "Group:other-group" in refused_receive.message


@pytest.mark.parametrize(
    ("user", "secret", "words"),
    [
        ("mallory", None, "User:mallory has no permission to access Topic:orders from "
                          "127.0.0.1, the decision is deny."),
        ("carol", None, "User:carol is disabled."),
        ("ghost", "x", "User:ghost is not found."),
        ("alice", "wrong", "check signature failed."),
    ],
)  # fmt: skip
async def test_each_refusal_has_the_apache_proxys_code_and_words(
    cluster_proxy, user, secret, words
):
    proxy, _, connect, remoting = cluster_proxy
    answer = await connect(user, secret).send("orders", b"no")
    assert (answer.status.code, answer.status.message) == (pb.Code.UNAUTHORIZED, words)
    broker = proxy.cluster.brokers[0].name
    refused = await remoting(user, secret).invoke(send_v2("orders", broker, b"no"), 5.0)
    assert (refused.code, refused.remark) == (ResponseCode.NO_PERMISSION, words)


async def test_a_rule_changed_in_the_cluster_holds_within_the_refresh(cluster_proxy):
    """As ``mqadmin updateAcl`` and ``deleteUser`` change them on the brokers: the proxy
    reads the user again once its entry is ``cluster_users_refresh_s`` old."""
    proxy, path, connect, _ = cluster_proxy
    alice = connect("alice")
    assert (await alice.send("orders", b"before")).status.code == pb.Code.OK
    path.write_text(json.dumps(acl_file(ALICE + allow("Topic:orders", decision="Deny"))))

    async def refused() -> bool:
        return (await alice.send("orders", b"after")).status.code == pb.Code.UNAUTHORIZED

    await wait_until(refused, timeout=10 * REFRESH_S + 5, step=REFRESH_S / 2)
    gone = acl_file(ALICE)
    gone["users"] = [u for u in gone["users"] if u["username"] != "root"]
    path.write_text(json.dumps(gone))
    root = connect("root")

    async def root_unknown() -> bool:
        answer = await root.send("orders", b"x")
        return answer.status.message == "User:root is not found."

    await wait_until(root_unknown, timeout=10 * REFRESH_S + 5, step=REFRESH_S / 2)
    reads = "rocketmq_proxy_cluster_user_reads_total"
    text = proxy.metrics.render()[0]
    # alice read twice (the change), root once, after it was gone.
    assert total(text, reads, result="found") >= 2 and total(text, reads, result="unknown") >= 1


async def test_with_no_broker_answering_a_read_user_keeps_working_and_a_new_one_waits(
    cluster_proxy,
):
    proxy, _, connect, _ = cluster_proxy
    alice = connect("alice")
    assert (await alice.send("orders", b"before")).status.code == pb.Code.OK
    for broker in proxy.cluster.brokers:
        broker.processor.handlers.pop(RequestCode.AUTH_GET_USER)  # "not supported" now
    reads = "rocketmq_proxy_cluster_user_reads_total"

    async def read_again_and_failed() -> bool:
        # Past its refresh, each request of alice's is answered from her entry, which is
        # read again in the background: until it expires, a failed read changes nothing.
        answer = await alice.send("orders", b"during")
        assert answer.status.code == pb.Code.OK, answer.status.message
        return total(proxy.metrics.render()[0], reads, result="failed") >= 1

    await wait_until(read_again_and_failed, timeout=10, step=REFRESH_S / 2)
    root = connect("root")  # never read: refused, with the words a client may retry on
    refused = await root.send("orders", b"x")
    assert (refused.status.code, refused.status.message) == (
        pb.Code.UNAUTHORIZED,
        "Authentication failed. Please verify the credentials and try again.",
    )
    denied = "rocketmq_proxy_auth_denied_total"
    text = proxy.metrics.render()[0]
    assert total(text, denied, rpc="send_message", reason="users_unavailable") == 1


async def test_a_proxy_authenticating_no_one_in_front_of_acl_brokers_says_so(
    start_proxy, tmp_path, caplog
):
    """Broker credentials and no client authentication, in front of brokers whose ACL
    store knows the proxy's user: every client would act as that user. Logged at start,
    and in /v1/status."""
    path = tmp_path / "acl.json"
    path.write_text(json.dumps({"users": [{"username": "proxy", "password": "p"}], "acls": []}))
    security = SecurityConfig(broker_access_key="proxy", broker_secret_key="p")
    proxy = await start_proxy(brokers=1, security=security, broker_options={"acl_file": str(path)})
    assert proxy.security.open_in_front_of_acl
    assert any("authenticates no client" in r.getMessage() for r in caplog.records)
    plain = await start_proxy(brokers=1, security=replace(security))
    assert not plain.security.open_in_front_of_acl  # no users at those brokers
