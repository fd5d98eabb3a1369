"""What the brokers are told of the proxy's clients (``processor/registrations.py``): the
version ordinal and language a client is listed with, the heartbeat body, and the slots
that keep one client per group on each connection."""

from __future__ import annotations

import json

from proxy.api.v2 import definition_pb2 as pb
from proxy.processor.registrations import (
    ConsumeType,
    Registered,
    Registrations,
    _java_hash,
    registered,
    version_ordinal,
)
from proxy.remoting.codes import CURRENT_VERSION, LanguageCode


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


def test_a_slot_holds_one_client_per_group_and_the_bound_holds():
    regs = Registrations(pool=None, max_clients=4)  # type: ignore[arg-type]  # never called
    for client_id, group in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("a3", "A")):
        regs.add(_client(client_id, group))
    assert [sorted(s.clients) for s in regs._slots] == [["a1", "b1"], ["a2"], ["a3"]]
    regs.add(_client("c1", "C"))  # past max_clients
    assert regs.refused == 1 and "c1" not in regs._clients
    regs.remove("a2")
    assert [c.client_id for c, _ in regs._leaving] == ["a2"]
    regs.add(_client("a4", "A"))  # takes the place a2 left
    assert regs._slot_of["a4"] == 1


def test_a_brokers_running_info_request_is_answered_for_the_client():
    from proxy.remoting.codes import RequestCode, ResponseCode
    from proxy.remoting.command import RemotingCommand

    regs = Registrations(pool=None, max_clients=4)  # type: ignore[arg-type]  # never called
    client = registered("c1", "JAVA", "5.2.0", _consumer(pb.ClientType.PUSH_CONSUMER, "*"))
    assert client is not None
    regs.add(client)

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

    regs = Registrations(pool=None, max_clients=4)  # type: ignore[arg-type]  # never called
    client = registered("c1", "JAVA", "5.2.0", _consumer(pb.ClientType.SIMPLE_CONSUMER, "*"))
    assert client is not None
    regs.add(client)
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
