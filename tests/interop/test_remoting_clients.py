"""The official Java client's remoting API (rocketmq-client 5.5.0, the API of the 4.x
clients), the native C++ client and the Go client through the proxy's remoting port, on
real RocketMQ 5.5.0 brokers; and the same through the Apache proxy's remoting port, the
peer.

Every client is built as an application builds it: its name server address is the proxy's
remoting port, and nothing else is set but the group and, for consumers, where a new group
starts (the first offset, so that what was sent before the consumer started counts too).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.request
import uuid
from collections import defaultdict
from pathlib import Path

import orjson
import pytest

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from rocketmq_local import admin
from rocketmq_local.launcher import mqadmin
from testkit.balancer import BalancerThread
from testkit.official.harness import STOP_TIMEOUT, ProxyProcess, start_proxy
from testkit.official.remoting_driver import CPP, GO, JAVA, Driver
from testkit.waits import wait_for
from tests.support.ports import free_port

pytestmark = [pytest.mark.real, pytest.mark.interop]

VIAS = ("ours", "apache")
BROKERS = ("broker-a", "broker-b")
RESULT_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def remoting_proxy(real_cluster, tmp_path_factory):
    """Our proxy in front of the session's real cluster, its remoting port on, run as a user
    runs it (``rmq-proxy --namesrv ... --remoting-port``, default workers)."""
    proxy = start_proxy(
        tmp_path_factory.mktemp("remoting-proxy"),
        (),
        namesrv=real_cluster.namesrv_address,
        extra_args=("--remoting-port", "0"),
    )
    try:
        yield proxy
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


@pytest.fixture(params=VIAS)
def via(request, real_cluster) -> str:
    """The remoting address the clients use: ours, or the Apache proxy's (the peer)."""
    if request.param == "ours":
        proxy: ProxyProcess = request.getfixturevalue("remoting_proxy")
        assert proxy.remoting, f"no remoting port in the ready line\n{proxy.logs()}"
        return proxy.remoting
    apache = request.getfixturevalue("apache_proxy")
    return f"127.0.0.1:{apache.remoting_port}"


@pytest.fixture
def homes(tmp_path):
    names = iter(range(1, 100))
    return lambda role: tmp_path / f"{next(names)}-{role}"


def fresh(real_cluster, prefix: str, message_type: str | None = None) -> tuple[str, str, str]:
    """A new topic on both brokers (of ``message_type``: its message.type attribute), and
    new producer and consumer group names."""
    tag = uuid.uuid4().hex[:8]
    topic = f"{prefix}-{tag}"
    admin.create_topic(real_cluster.namesrv_address, topic, message_type=message_type)
    return topic, f"{prefix}-p-{tag}", f"{prefix}-c-{tag}"


def client(
    address: str,
    home: Path,
    command: str,
    group: str,
    topic: str,
    *more: str | int,
    driver: Driver = JAVA,
):
    """The ``driver``'s ``command`` as a client of the remoting port at ``address``, of
    ``group`` on ``topic``; started (``result`` waits for its end)."""
    return driver.start(
        home, command, "--namesrv", address, "--group", group, "--topic", topic, *more
    )


def bodies(result: dict) -> list[str]:
    return [m["body"] for m in result["messages"]]


def assert_in_order_per_key(got: dict, keys: int = 4) -> None:
    """Each key's messages (an orderly producer's ``m-<i>``, key ``k<i mod keys>``) were
    first consumed in the order sent."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for message in got["messages"]:
        index = int(message["body"].split("-")[1])
        if index not in by_key[message["key"]]:  # a redelivery repeats, in order
            by_key[message["key"]].append(index)
    assert sorted(by_key) == [f"k{k}" for k in range(keys)]
    for key, indices in by_key.items():
        assert indices == sorted(indices), f"{key} out of order: {indices}"


def test_a_push_consumer_gets_every_message_a_producer_sends(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-push")
    push = client(via, homes("push"), "push", consumer, topic, "--expect", 40)
    sent = client(via, homes("produce"), "produce", producer, topic, "--count", 40).result(
        RESULT_TIMEOUT_S
    )
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    assert {m["status"] for m in sent["sent"]} == {"SEND_OK"}
    # Spread over both brokers, and every one consumed.
    assert {m["broker"] for m in sent["sent"]} == {"broker-a", "broker-b"}
    assert set(bodies(got)) == {f"m-{i}" for i in range(40)}


def test_a_lite_pull_consumer_gets_every_message(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-lite")
    sent = client(via, homes("produce"), "produce", producer, topic, "--count", 20).result(
        RESULT_TIMEOUT_S
    )
    got = client(via, homes("litepull"), "litepull", consumer, topic, "--expect", 20).result(
        RESULT_TIMEOUT_S
    )
    assert sent["errors"] == [] and got["errors"] == []
    assert set(bodies(got)) == {f"m-{i}" for i in range(20)}


def test_an_orderly_consumer_gets_each_key_in_the_order_sent(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-order")
    push = client(via, homes("push"), "push", consumer, topic, "--expect", 48, "--orderly")
    sent = client(
        via,
        homes("produce"),
        "produce",
        producer,
        topic,
        "--count",
        48,
        "--kind",
        "orderly",
        "--order-keys",
        4,
    ).result(RESULT_TIMEOUT_S)
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    assert set(bodies(got)) == {f"m-{i}" for i in range(48)}
    assert_in_order_per_key(got)


def test_broadcasting_consumers_each_get_every_message(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-bcast")
    consumers = [
        client(via, homes(f"push-{n}"), "push", consumer, topic, "--expect", 16, "--broadcast")
        for n in range(2)
    ]
    client(via, homes("produce"), "produce", producer, topic, "--count", 16).result(
        RESULT_TIMEOUT_S
    )
    for push in consumers:
        got = push.result(RESULT_TIMEOUT_S)
        assert got["errors"] == []
        assert set(bodies(got)) == {f"m-{i}" for i in range(16)}


def test_a_delayed_message_is_consumed_after_its_delay(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "rm-delay", "DELAY")
    push = client(via, homes("push"), "push", consumer, topic, "--expect", 1)
    sent = client(
        via,
        homes("produce"),
        "produce",
        producer,
        topic,
        "--count",
        1,
        "--kind",
        "delay",
        "--delay-level",
        2,
    ).result(RESULT_TIMEOUT_S)
    got = push.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and got["errors"] == []
    [message] = got["messages"]
    # Delay level 2 is 5 s; the broker's timer ticks each second.
    assert message["at_ms"] - message["born_ms"] >= 4_000


def test_transactions_deliver_what_was_committed_or_checked(real_cluster, remoting_proxy, homes):
    """Nine transactional messages, committed, rolled back and left open by turns; the
    producer's checker commits what it is asked about."""
    address = remoting_proxy.remoting
    topic, producer, consumer = fresh(real_cluster, "rm-tx", "TRANSACTION")
    push = client(address, homes("push"), "push", consumer, topic, "--expect", 9, "--seconds", 15)
    sent = client(
        address, homes("produce"), "produce", producer, topic, "--count", 9, "--kind", "transaction"
    ).result(RESULT_TIMEOUT_S)
    got = set(bodies(push.result(RESULT_TIMEOUT_S)))
    committed = {f"m-{i}" for i in range(0, 9, 3)}
    rolled_back = {f"m-{i}" for i in range(1, 9, 3)}
    open_ = {f"m-{i}" for i in range(2, 9, 3)}
    assert sent["errors"] == []
    assert set(sent["committed"]) == committed
    # Each transaction left open was checked with the producer (on its own connection),
    # which committed it; the producer's own commits and rollbacks reached the brokers.
    assert set(sent["checked"]) == open_
    assert got == committed | open_
    assert not got & rolled_back


def test_a_message_its_topic_does_not_take_is_refused(real_cluster, via, homes):
    topic, producer, _ = fresh(real_cluster, "rm-typed", "NORMAL")
    sent = client(
        via, homes("produce"), "produce", producer, topic, "--count", 1, "--kind", "delay"
    ).result(RESULT_TIMEOUT_S)
    [error] = sent["errors"]
    assert "CODE: 13" in error and "TopicMessageType validate failed" in error


@pytest.mark.timeout(400)
@pytest.mark.parametrize("driver", [CPP], ids=["cpp"])
def test_a_rolling_restart_of_two_proxies_loses_nothing(real_cluster, tmp_path, homes, driver):
    """Two proxies behind a balancer; each restarted in turn (out of the balancer, SIGTERM,
    started again on its ports) while a producer sends and a push consumer consumes. Every
    message sent is consumed and no send fails: a send the restart cuts (answered GO_AWAY,
    or its connection closed) is sent again by the client on a new connection, which the
    balancer opens to the other proxy. The C++ client's proxies have a port per broker,
    each behind a balancer of its own, as its routes name them. The Java client's rolling
    restart runs with production's settings on, beside the Python client's
    (test_production_drain.py)."""
    brokers = BROKERS if driver is CPP else ()
    public = ("remoting", *brokers)  # the proxies' client-facing remoting ports
    ports = [{name: free_port() for name in ("grpc", "http", *public)} for _ in range(2)]
    front = BalancerThread(
        [[(f"127.0.0.1:{p[name]}", f"127.0.0.1:{p['http']}") for p in ports] for name in public]
    )
    balanced = dict(zip(public, front.start(), strict=True))
    address = balanced["remoting"]
    config = tmp_path / "proxy.toml"
    advertised = ", ".join(f'"{b}" = "{balanced[b]}"' for b in brokers)
    config.write_text(
        f'remoting_advertise_address = "{address}"\n'
        f"remoting_broker_advertise_addresses = {{ {advertised} }}\n"
    )

    def start(n: int) -> ProxyProcess:
        mine = ports[n]
        args = ["--config", str(config), "--grpc-port", str(mine["grpc"]), "--remoting-port",
                str(mine["remoting"]), "--http-port", str(mine["http"])]  # fmt: skip
        for b in brokers:
            args += ["--remoting-broker-port", f"{b}={mine[b]}"]
        return start_proxy(tmp_path / f"proxy-{n}", (), namesrv=real_cluster.namesrv_address,
                           extra_args=tuple(args))  # fmt: skip

    proxies = [start(0), start(1)]
    try:
        topic, producer, consumer = fresh(real_cluster, "rm-roll")
        count = 60
        push = client(address, homes("push"), "push", consumer, topic, "--expect", count,
                      "--seconds", 120, driver=driver)  # fmt: skip
        sending = client(address, homes("produce"), "produce", producer, topic, "--count",
                         count, "--interval-ms", 250, driver=driver)  # fmt: skip
        front.roll(proxies, start, STOP_TIMEOUT)
        assert sending.proc.poll() is None, "the producer ended before the restarts did"
        sent = sending.result(RESULT_TIMEOUT_S)
        got = push.result(150)
    finally:
        for proxy in proxies:
            proxy.stop()
        front.stop()
    assert sent["errors"] == []
    assert len(sent["sent"]) == count
    assert set(bodies(got)) == {f"m-{i}" for i in range(count)}
    assert got["errors"] == []


def listed_at(address: str, group: str) -> list[str]:
    """The client ids ``address`` (a broker, or a proxy's remoting port) lists in ``group``:
    what a consumer's rebalance and mqadmin consumerConnection read."""
    ask = RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    answer = admin.admin_call(address, ask)
    return orjson.loads(answer.body).get("consumerIdList", []) if answer.body else []


@pytest.mark.parametrize("port_of", VIAS)
def test_a_remoting_consumer_is_listed_by_the_brokers_through_ours_only(
    real_cluster, port_of, request, homes
):
    """Ours relays the consumer's heartbeats to every broker; the Apache proxy keeps them
    to itself (docs/api.md, "The remoting port"). Either port lists the consumer to its
    clients. Through ours, ``mqadmin consumerStatus`` gets the client's own running info:
    the broker's request reaches the client on its connection, and its answer comes back."""
    if port_of == "ours":
        address = request.getfixturevalue("remoting_proxy").remoting
    else:
        address = f"127.0.0.1:{request.getfixturevalue('apache_proxy').remoting_port}"
    topic, producer, consumer = fresh(real_cluster, "rm-listed")
    brokers = admin.masters(real_cluster.namesrv_address).values()
    push = client(address, homes("push"), "push", consumer, topic, "--expect", 1)
    try:
        wait_for(lambda: len(listed_at(address, consumer)) == 1, timeout=20, step=0.2)
        on_brokers = [listed_at(broker, consumer) for broker in brokers]
        assert on_brokers == ([listed_at(address, consumer)] * 2 if port_of == "ours" else [[], []])
        if port_of == "ours":
            [client_id] = on_brokers[0]
            done = mqadmin(real_cluster.namesrv_address, "consumerStatus", "-g", consumer,
                           "-i", client_id)  # fmt: skip
            assert "Exception" not in done.stderr, done.stderr
            # Answered by the Java client itself: a push consumer, and its subscription.
            assert re.search(r"PROP_CONSUME_TYPE\s*:\s*CONSUME_PASSIVELY", done.stdout), done.stdout
            assert topic in done.stdout.split("#Consumer Subscription#")[1], done.stdout
    finally:
        client(address, homes("produce"), "produce", producer, topic, "--count", 1).result(
            RESULT_TIMEOUT_S
        )
        push.result(RESULT_TIMEOUT_S)


ACL_USERS = """
[[users]]
access_key = "alice"
secret_key = "alice-secret"
publish = ["rm-acl-*"]
subscribe = [
  { group = "rm-acl-c-*", topic = "rm-acl-*" },
  { group = "rm-acl-c-*", topic = "rm-ro-*" },
]
"""


def test_a_user_of_the_users_file_signs_with_the_4x_acl_hook(real_cluster, tmp_path, homes):
    """The proxy's users file guards its remoting port as it does the gRPC port: the Java
    client's own ACL hook (AclClientRPCHook) signs each request, and the proxy checks the
    signature and what the user may do. The C++ client's hook (ClientRPCHook) signs the
    same way, on the broker ports."""
    users = tmp_path / "users.toml"
    users.write_text(ACL_USERS)
    config = tmp_path / "proxy.toml"
    config.write_text(f'[security]\nusers_file = "{users}"\n')
    proxy = start_proxy(
        tmp_path / "proxy", (), namesrv=real_cluster.namesrv_address,
        extra_args=("--config", str(config), "--remoting-port", "0",
                    *(arg for b in BROKERS for arg in ("--remoting-broker-port", f"{b}=0"))),
    )  # fmt: skip
    alice = ("--access-key", "alice", "--secret-key", "alice-secret")
    try:
        address = proxy.remoting
        assert address is not None, proxy.logs()
        topic, producer, consumer = fresh(real_cluster, "rm-acl")
        push = client(address, homes("push"), "push", consumer, topic, "--expect", 10, *alice)
        sent = client(
            address, homes("produce"), "produce", producer, topic, "--count", 10, *alice
        ).result(RESULT_TIMEOUT_S)
        got = push.result(RESULT_TIMEOUT_S)
        assert sent["errors"] == [] and got["errors"] == []
        assert set(bodies(got)) == {f"m-{i}" for i in range(10)}
        read_only, _, _ = fresh(real_cluster, "rm-ro")  # alice may see it, not publish to it
        refused = client(
            address, homes("refused"), "produce", producer, read_only, "--count", 1, *alice
        ).result(RESULT_TIMEOUT_S)
        [error] = refused["errors"]
        assert "CODE: 16" in error, error
        unsigned = client(
            address, homes("unsigned"), "produce", producer, topic, "--count", 1
        ).result(RESULT_TIMEOUT_S)
        assert len(unsigned["errors"]) == 1, unsigned
        cpp = functools.partial(client, address, driver=CPP)
        topic, producer, consumer = fresh(real_cluster, "rm-acl")
        push = cpp(homes("cpp-push"), "push", consumer, topic, "--expect", 5, *alice)
        sent = cpp(homes("cpp-produce"), "produce", producer, topic, "--count", 5, *alice)
        assert sent.result(RESULT_TIMEOUT_S)["errors"] == [] and cpp_refusals(sent) == []
        assert set(bodies(push.result(RESULT_TIMEOUT_S))) == {f"m-{i}" for i in range(5)}
        refused = cpp(homes("cpp-refused"), "produce", producer, read_only, "--count", 1, *alice)
        assert len(refused.result(RESULT_TIMEOUT_S)["errors"]) == 1
        refusals = cpp_refusals(refused)
        assert refusals and all("error code:16" in r for r in refusals), refusals
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


def test_a_tls_client_and_a_plaintext_one_share_the_port(real_cluster, remoting_proxy, homes):
    """The remoting port takes TLS and plaintext clients on one port, as the gRPC port does
    (security.tls_mode permissive, the default, with the certificate made at start): a TLS
    producer's messages reach a plaintext consumer and the other way round."""
    address = remoting_proxy.remoting
    assert address is not None
    for producer_tls, consumer_tls in ((True, False), (False, True)):
        topic, producer, consumer = fresh(real_cluster, "rm-tls")
        push = client(
            address,
            homes("push"),
            "push",
            consumer,
            topic,
            "--expect",
            5,
            *(["--tls"] if consumer_tls else []),
        )
        sent = client(
            address,
            homes("produce"),
            "produce",
            producer,
            topic,
            "--count",
            5,
            *(["--tls"] if producer_tls else []),
        ).result(RESULT_TIMEOUT_S)
        got = push.result(RESULT_TIMEOUT_S)
        assert sent["errors"] == [] and got["errors"] == []
        assert set(bodies(got)) == {f"m-{i}" for i in range(5)}
    # Both kinds came through the port's front (each worker counts its own).
    with urllib.request.urlopen(f"http://{remoting_proxy.http}/v1/status", timeout=10) as r:
        status = json.load(r)
    each = [w["status"] for w in status["workers"]] if "workers" in status else [status]
    accepted = {"tls": 0, "plaintext": 0}
    for one in each:
        for kind, count in one["remoting"]["front"]["accepted"].items():
            accepted[kind] += count
    assert accepted["tls"] >= 2 and accepted["plaintext"] >= 2, accepted


# -- The Go client ---------------------------------------------------------------------------
#
# The Go client (rocketmq-client-go v2) names its broker in each request (``bname``, ``n``),
# as the Java client does: it is served on the shared port, by ours and the Apache proxy.


def test_the_go_client_sends_to_both_brokers_and_consumes_everything(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "go-push")
    sent = client(via, homes("produce"), "produce", producer, topic, "--count", 40, driver=GO)
    sent = sent.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == []
    assert {m["broker"] for m in sent["sent"]} == set(BROKERS)
    got = client(via, homes("push"), "push", consumer, topic, "--expect", 40, driver=GO)
    assert set(bodies(got.result(RESULT_TIMEOUT_S))) == {f"m-{i}" for i in range(40)}


def test_the_go_client_consumes_each_key_in_order(real_cluster, via, homes):
    topic, producer, consumer = fresh(real_cluster, "go-order")
    orderly = ("--kind", "orderly", "--order-keys", 4)
    sent = client(via, homes("produce"), "produce", producer, topic, "--count", 32, *orderly,
                  driver=GO).result(RESULT_TIMEOUT_S)  # fmt: skip
    assert sent["errors"] == []
    got = client(via, homes("push"), "push", consumer, topic, "--expect", 32, "--orderly",
                 driver=GO).result(RESULT_TIMEOUT_S)  # fmt: skip
    assert set(bodies(got)) == {f"m-{i}" for i in range(32)}
    assert_in_order_per_key(got)


# -- The C++ client --------------------------------------------------------------------------
#
# The native C++ client (librocketmq 2.x, through PyPI ``rocketmq`` 0.4.4) never names a
# broker in its requests: it tells brokers apart by address alone. So it needs a port per
# broker (``--remoting-broker-port NAME=PORT``): routes name each broker at its own port, and
# a request goes to the broker of the port it came in on. On the shared port, ours and the
# Apache proxy refuse its sends alike ("Request doesn't have field bname"): the Apache proxy
# has no such ports (docs/api.md, "The remoting port").


@pytest.fixture(scope="module")
def broker_ports_proxy(real_cluster, tmp_path_factory):
    """Our proxy with a remoting port per broker, run as a user runs it (default workers:
    the supervisor reserves every port, and each worker serves them all)."""
    ports = [arg for b in BROKERS for arg in ("--remoting-broker-port", f"{b}=0")]
    proxy = start_proxy(
        tmp_path_factory.mktemp("broker-ports-proxy"),
        (),
        namesrv=real_cluster.namesrv_address,
        extra_args=("--remoting-port", "0", *ports),
    )
    try:
        yield proxy
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


def stored(namesrv: str, topic: str, queues: int = 4) -> dict[str, int]:
    """How many messages of ``topic`` each broker holds (its queues' max offsets)."""
    held = {}
    for broker, address in admin.masters(namesrv).items():
        total = 0
        for queue in range(queues):
            ask = RemotingCommand(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": str(queue)}
            )
            answer = admin.admin_call(address, ask)
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            total += int(answer.fields["offset"])
        held[broker] = total
    return held


def cpp_refusals(producer) -> list[str]:
    """What refused a C++ producer's sends, from its log: the answers of the proxy or a
    broker. (A send the client fails before sending, at its start, is tried again by the
    driver; see testkit/official/cpp/driver.py.)"""
    logs = sorted((producer.home / "logs" / "rocketmq-cpp").glob("*.log.*"))
    lines = (line for log in logs for line in log.read_text(errors="replace").splitlines())
    return [line for line in lines if "processSendResponse error" in line]


def test_cpp_sends_reach_both_brokers_and_a_push_consumer_gets_them(
    real_cluster, broker_ports_proxy, homes
):
    address = broker_ports_proxy.remoting
    topic, producer, consumer = fresh(real_cluster, "cpp-push")
    producing = client(address, homes("produce"), "produce", producer, topic, "--count", 40,
                       driver=CPP)  # fmt: skip
    sent = producing.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == [] and cpp_refusals(producing) == []
    assert {m["status"] for m in sent["sent"]} == {"OK"}
    # The client spreads its sends over the queues of both brokers (about evenly: a send
    # it retries goes to the next queue).
    held = stored(real_cluster.namesrv_address, topic)
    assert sorted(held) == list(BROKERS) and min(held.values()) > 0, held
    assert sum(held.values()) == 40, held
    got = client(address, homes("push"), "push", consumer, topic, "--expect", 40, driver=CPP)
    got = got.result(RESULT_TIMEOUT_S)
    assert set(bodies(got)) == {f"m-{i}" for i in range(40)}


def test_cpp_orderly_sends_are_consumed_in_order_per_key(real_cluster, broker_ports_proxy, homes):
    """An orderly producer (each key to its own queue) and an orderly push consumer, which
    locks its queues on their brokers."""
    address = broker_ports_proxy.remoting
    topic, producer, consumer = fresh(real_cluster, "cpp-order")
    orderly = ("--kind", "orderly", "--order-keys", 4)
    producing = client(address, homes("produce"), "produce", producer, topic, "--count", 48,
                       *orderly, driver=CPP)  # fmt: skip
    assert producing.result(RESULT_TIMEOUT_S)["errors"] == []
    assert cpp_refusals(producing) == []
    got = client(
        address, homes("push"), "push", consumer, topic, "--expect", 48, "--orderly", driver=CPP
    )
    got = got.result(RESULT_TIMEOUT_S)
    assert set(bodies(got)) == {f"m-{i}" for i in range(48)}
    assert_in_order_per_key(got)


def test_cpp_consumes_what_the_java_client_sent_on_broker_ports(
    real_cluster, broker_ports_proxy, homes
):
    """The Java client's 4.x API works on a proxy with broker ports too: its requests name
    their broker, and routes name each broker at its own port."""
    address = broker_ports_proxy.remoting
    topic, producer, consumer = fresh(real_cluster, "cpp-java")
    sent = client(address, homes("produce"), "produce", producer, topic, "--count", 24)
    sent = sent.result(RESULT_TIMEOUT_S)
    assert sent["errors"] == []
    assert {m["broker"] for m in sent["sent"]} == set(BROKERS)
    got = client(address, homes("push"), "push", consumer, topic, "--expect", 24, driver=CPP)
    got = got.result(RESULT_TIMEOUT_S)
    assert set(bodies(got)) == {f"m-{i}" for i in range(24)}


def test_on_the_shared_port_cpp_sends_are_refused_as_by_the_apache_proxy(real_cluster, via, homes):
    """Without broker ports the C++ client's sends name no broker: both proxies refuse
    them the same way, and nothing is stored."""
    topic, producer, _ = fresh(real_cluster, "cpp-shared")
    producing = client(via, homes("produce"), "produce", producer, topic, "--count", 2, driver=CPP)
    sent = producing.result(RESULT_TIMEOUT_S)
    assert len(sent["errors"]) == 2, sent
    # The client's exception names its last retry's failure; its log, the proxy's answer.
    refusals = cpp_refusals(producing)
    assert refusals, producing.client_log(producing.home)
    assert all("Request doesn't have field bname, error code:15" in r for r in refusals)
    assert stored(real_cluster.namesrv_address, topic) == {"broker-a": 0, "broker-b": 0}
