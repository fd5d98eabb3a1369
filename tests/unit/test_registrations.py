"""What the brokers are told of the proxy's clients (``processor/registrations.py``): the
version ordinal and language a client is listed with, the heartbeat body, the slots that
keep one client per group on each connection, and the bounds of what clients may make the
proxy register: clients, clients per group, topics per client, and connections, which
take their descriptors from the process's open-files budget."""

from __future__ import annotations

import json
import logging

import pytest

from proxy.api.v2 import definition_pb2 as pb
from proxy.brokers import BrokerRoute, TopicNotFound, TopicRoute
from proxy.descriptors import DescriptorBudget
from proxy.processor.registrations import (
    MAX_TOPICS,
    ConsumeType,
    Refusal,
    Registered,
    Registrations,
    Subscription,
    _java_hash,
    registered,
    version_ordinal,
)
from proxy.remoting.codes import CURRENT_VERSION, LanguageCode


class _Pool:
    """Routes only: each topic of ``routes`` is on the brokers it lists (addresses); any
    other topic does not exist. No connection is ever opened (no heartbeat task runs)."""

    def __init__(self, routes: dict[str, list[str]] | None = None) -> None:
        self.routes = routes or {}

    async def route(self, topic: str) -> TopicRoute:
        if topic not in self.routes:
            raise TopicNotFound(topic)
        brokers = tuple(BrokerRoute(a, a, 4, 4, 6) for a in self.routes[topic])
        return TopicRoute(topic, brokers)


def _registrations(routes: dict[str, list[str]] | None = None, **kw) -> Registrations:
    kw.setdefault("max_clients", 4)
    kw.setdefault("budget", DescriptorBudget(1000))
    return Registrations(_Pool(routes), **kw)  # type: ignore[arg-type]  # routes only


def test_versions_are_rocketmqs_ordinals():
    # MQVersion.Version of the 5.5.0 jar: V5_0_0 = 413, V5_1_2 = 437, V5_2_0 = 453, V5_3_3 = 479.
    assert version_ordinal("5.0.0") == 413
    assert version_ordinal("5.1.2") == 437
    assert version_ordinal("5.2.0") == 453
    assert version_ordinal("5.3.3") == CURRENT_VERSION == 479
    assert version_ordinal("5.2.1-SNAPSHOT") == 455
    assert version_ordinal("6.0.0") == 612  # HIGHER_VERSION
    assert version_ordinal("") == version_ordinal("x.y") == CURRENT_VERSION


def test_tag_codes_are_javas_string_hashes():
    assert _java_hash("abc") == 96354
    assert _java_hash("TagA") == 2598919
    assert _java_hash("Hello World") == -862545276  # Java's int wraps


def _consumer(
    client_type: pb.ClientType,
    expression: str,
    kind: pb.FilterType = pb.FilterType.TAG,
) -> pb.Settings:
    return pb.Settings(
        client_type=client_type,
        subscription=pb.Subscription(
            group=pb.Resource(name="G"),
            subscriptions=[
                pb.SubscriptionEntry(
                    topic=pb.Resource(name="T"),
                    expression=pb.FilterExpression(type=kind, expression=expression),
                )
            ],
        ),
    )


def test_a_simple_consumer_is_listed_as_the_apache_proxy_would_list_it():
    client = registered("c1", "java", "5.2.0", _consumer(pb.ClientType.SIMPLE_CONSUMER, "a||b"))
    assert client is not None
    assert (client.language, client.version) == (LanguageCode.JAVA, 453)
    assert client.consume_type is ConsumeType.ACTIVELY
    body = json.loads(client.heartbeat_body())
    assert body["clientID"] == "c1" and body["producerDataSet"] == []
    (consumer,) = body["consumerDataSet"]
    assert consumer["groupName"] == "G" and consumer["consumeType"] == "CONSUME_ACTIVELY"
    (sub,) = consumer["subscriptionDataSet"]
    assert (sub["topic"], sub["subString"], sub["expressionType"]) == ("T", "a||b", "TAG")
    assert sub["tagsSet"] == ["a", "b"] and sub["codeSet"] == [97, 98]


def test_push_consumers_sql_subscriptions_and_producers():
    push = registered("c2", "PYTHON", "5.1.2", _consumer(pb.ClientType.PUSH_CONSUMER, "a > 1",
                                                         pb.FilterType.SQL))  # fmt: skip
    assert push is not None and push.consume_type is ConsumeType.PASSIVELY
    lite = registered("c5", "JAVA", "5.2.0", _consumer(pb.ClientType.LITE_SIMPLE_CONSUMER, "*"))
    assert lite is not None and lite.consume_type is ConsumeType.ACTIVELY
    (sub,) = json.loads(push.heartbeat_body())["consumerDataSet"][0]["subscriptionDataSet"]
    assert sub["expressionType"] == "SQL92" and sub["tagsSet"] == []
    producer = registered(
        "c3", "NODE_JS", "5.0.0",
        pb.Settings(client_type=pb.ClientType.PRODUCER,
                    publishing=pb.Publishing(topics=[pb.Resource(name="T1")])),
    )  # fmt: skip
    assert producer is not None and producer.groups == {"T1"}
    assert json.loads(producer.heartbeat_body())["producerDataSet"] == [{"groupName": "T1"}]
    assert registered("c4", "GO", "5.0.0", pb.Settings()) is None  # nothing to list


def _client(client_id: str, group: str) -> Registered:
    return Registered(client_id, LanguageCode.JAVA, 453, consumer_group=group)


def _consumer_of(client_id: str, group: str, *topics: str) -> Registered:
    subscriptions = tuple(Subscription(t, "TAG", "*") for t in topics)
    return Registered(
        client_id, LanguageCode.JAVA, 453, consumer_group=group, subscriptions=subscriptions
    )


async def test_a_slot_holds_one_client_per_group_and_the_bound_holds():
    refused: list[str] = []
    regs = _registrations(on_refused=refused.append)
    for client_id, group in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")):
        assert await regs.add(_client(client_id, group)) is None
    assert [sorted(s.clients) for s in regs._slots] == [["a1", "b1"], ["a2"], ["a3"]]
    assert await regs.add(_client("c1", "C")) is Refusal.CLIENTS  # past max_clients
    assert regs.refused == 1 and "c1" not in regs._clients and refused == ["clients"]
    regs.remove("a2")
    assert [c.client_id for c, _ in regs._leaving] == ["a2"]
    assert await regs.add(_client("a4", "A")) is None  # takes the place a2 left
    assert regs._slot_of["a4"] == 1


async def test_one_group_registers_at_most_its_share_and_others_still_register(caplog):
    refused: list[str] = []
    regs = _registrations(max_clients=100, max_per_group=3, on_refused=refused.append)
    with caplog.at_level(logging.WARNING, logger="proxy.processor.registrations"):
        for i in range(10):
            await regs.add(_client(f"hot-{i}", "hot"))
        assert regs.clients_of("hot") == 3 and len(regs._slots) == 3  # 3 slots, no more
        assert regs.refusals[Refusal.GROUP] == 7 and refused == ["group"] * 7
        assert await regs.add(_client("cold-1", "cold")) is None  # another group: served
    # Logged once for the burst (throttled), naming the bound.
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "max_registered_per_group" in lines[0], lines
    regs.remove("hot-0")
    assert await regs.add(_client("hot-new", "hot")) is None  # a place freed up
    assert regs.status()["groups"] == 2


async def test_a_client_naming_too_many_topics_is_not_registered():
    regs = _registrations()
    many = _consumer_of("c1", "G", *(f"T{i}" for i in range(MAX_TOPICS + 1)))
    assert await regs.add(many) is Refusal.TOPICS
    assert regs.status()["clients"] == 0
    assert await regs.add(_consumer_of("c1", "G", *(f"T{i}" for i in range(MAX_TOPICS)))) is None


async def test_slot_connections_stop_at_their_share_of_the_budget_and_come_back():
    budget = DescriptorBudget(40)  # a quarter for the registrations: 10 connections
    regs = _registrations({"T": ["b1:1", "b2:1"]}, max_clients=100, budget=budget)
    assert regs.max_connections == 10
    for i in range(8):
        await regs.add(_consumer_of(f"hot-{i}", "hot", "T"))
    # 5 slots of 2 brokers each hold the 10; the 6th client of the group needs a 6th slot.
    assert regs.clients_of("hot") == 5 and regs.refusals[Refusal.CONNECTIONS] == 3
    assert regs.status()["reserved"] == 10 == budget.held
    # A client of another group fits a slot that holds its connections: no more needed.
    assert await regs.add(_consumer_of("other", "other", "T")) is None
    # A topic nobody serves needs no connection: a 6th client of the group still registers
    # on it, in a slot of its own (with no connection).
    assert await regs.add(_consumer_of("lost", "hot", "Nowhere")) is None
    assert budget.held == 10 and len(regs._slots) == 6
    regs.remove("lost")
    # What the fronts took is not the registrations' to take: with the budget spent, a
    # slot within their share is refused too.
    regs.remove("hot-4")
    await regs._close_idle_slots()  # the last slot, empty, closes: its 2 come back
    assert budget.held == 8 and regs.status()["reserved"] == 8
    assert budget.take(budget.free)  # the fronts hold the rest
    assert await regs.add(_consumer_of("hot-again", "hot", "T")) is Refusal.CONNECTIONS
    budget.give(budget.total - 8)
    assert await regs.add(_consumer_of("hot-again", "hot", "T")) is None
    await regs.close()
    assert budget.held == 0


async def test_later_settings_replace_the_registration():
    regs = _registrations({"T": ["b1:1"], "U": ["b1:1"]}, max_per_group=1)
    assert await regs.add(_consumer_of("c1", "G", "T")) is None
    assert regs.consumed() == {("G", "T")}
    assert await regs.add(_consumer_of("c1", "G", "T", "U")) is None  # a new subscription
    assert regs.consumed() == {("G", "T"), ("G", "U")} and regs.clients_of("G") == 1
    assert await regs.add(_consumer_of("c1", "H", "U")) is None  # another group
    assert regs.consumed() == {("H", "U")} and regs.clients_of("G") == 0
    # Settings past a bound leave the client unregistered, not with its older settings.
    many = _consumer_of("c1", "H", *(f"T{i}" for i in range(MAX_TOPICS + 1)))
    assert await regs.add(many) is Refusal.TOPICS
    assert regs.consumed() == set() and regs.status()["clients"] == 0


@pytest.mark.parametrize("budget_total", [3, 0])
async def test_a_budget_too_small_for_a_share_registers_no_connection(budget_total):
    regs = _registrations({"T": ["b1:1"]}, budget=DescriptorBudget(budget_total))
    assert regs.max_connections == 0
    assert await regs.add(_consumer_of("c1", "G", "T")) is Refusal.CONNECTIONS
    assert await regs.add(_consumer_of("c2", "G", "Nowhere")) is None  # needs none
    assert regs.status()["clients"] == 1


async def test_a_brokers_running_info_request_is_answered_for_the_client():
    from proxy.remoting.codes import RequestCode, ResponseCode
    from proxy.remoting.command import RemotingCommand

    regs = _registrations()
    client = registered("c1", "JAVA", "5.2.0", _consumer(pb.ClientType.PUSH_CONSUMER, "*"))
    assert client is not None
    assert await regs.add(client) is None

    def ask(client_id: str, group: str = "G") -> RemotingCommand:
        fields = {"clientId": client_id, "consumerGroup": group, "jstackEnable": "false"}
        answer = regs.on_broker_request(
            RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, fields)
        )
        assert isinstance(answer, RemotingCommand)  # answered at once
        return answer

    answer = ask("c1")
    assert answer.code == ResponseCode.SUCCESS
    info = json.loads(answer.body)
    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
    assert info["properties"]["PROP_CLIENT_VERSION"] == "5.2.0"
    assert [s["topic"] for s in info["subscriptionSet"]] == ["T"]
    assert ask("c2").code == ask("c1", "other").code == ResponseCode.SYSTEM_ERROR
    direct = regs.on_broker_request(RemotingCommand(RequestCode.CONSUME_MESSAGE_DIRECTLY, {}))
    assert isinstance(direct, RemotingCommand) and direct.code == ResponseCode.SYSTEM_ERROR


async def test_thread_stacks_are_asked_of_the_client_over_its_stream():
    from proxy.api.v2 import service_pb2 as api
    from proxy.remoting.codes import RequestCode, ResponseCode
    from proxy.remoting.command import RemotingCommand

    regs = _registrations()
    client = registered("c1", "JAVA", "5.2.0", _consumer(pb.ClientType.SIMPLE_CONSUMER, "*"))
    assert client is not None
    assert await regs.add(client) is None
    asked: list[tuple[str, api.TelemetryCommand]] = []

    async def ask(client_id, command, nonce, timeout_s):
        asked.append((client_id, command))
        assert command.print_thread_stack_trace_command.nonce == nonce
        trace = api.ThreadStackTrace(nonce=nonce, thread_stack_trace='"main" RUNNABLE')
        return api.TelemetryCommand(thread_stack_trace=trace)

    regs.ask = ask
    fields = {"clientId": "c1", "consumerGroup": "G", "jstackEnable": "true"}
    pending = regs.on_broker_request(RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, fields))
    assert pending is not None and not isinstance(pending, RemotingCommand)
    answer = await pending
    assert answer.code == ResponseCode.SUCCESS
    assert json.loads(answer.body)["jstack"] == '"main" RUNNABLE'
    assert [c for c, _ in asked] == ["c1"]
