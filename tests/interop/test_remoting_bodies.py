"""The remoting port's guard checks what the broker will act on: the same requests, read by
the guard (``proxy/security/remoting_access.py`` over the shared reading of
``proxy/remoting/bodies.py``) and by a real RocketMQ 5.5.0 broker's own header and body
classes (``rocketmq_local/broker_reading.py``, one JVM), for every request code the port
relays that names a resource.

Each case says what the guard must do: ``CHECKED`` (it allows or refuses by exactly the
(group, topic) pairs the broker reads) or ``REFUSED`` (it cannot name what the broker
would act on, so it refuses whoever asks). Bodies come with short keys, long keys, both,
and both with different values; the broker reads the last key written of a field's names,
and coerces numbers, arrays and objects into names, which the guard refuses.

Codes relayed that name nothing the broker acts on beyond the client's own connection
(UNREGISTER_CLIENT, CHECK_CLIENT_CONFIG) need a signature only; GET_CONSUMER_LIST_BY_GROUP
names a group, checked here like the rest.
"""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field

import pytest

from proxy.remoting.bodies import UnreadableBody, read_body
from proxy.remoting.client import RemotingClient
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import now_ms
from proxy.remoting.popinfo import PopCheckpointInfo, batch_ack_body
from proxy.remoting_port.routing import Destination, destination
from proxy.security.remoting_access import REMOTING_RESOURCES
from proxy.security.signing import RemotingSigner
from rocketmq_local import admin
from rocketmq_local.broker_reading import BODIES, HEADERS, Request, read_all
from tests.interop.conftest import BILLING_USER

pytestmark = [pytest.mark.real]


class Expect(enum.Enum):
    CHECKED = "checked"
    REFUSED = "refused"


Pair = tuple[str, str]  # (group, topic); group "" where the request names a topic alone


@dataclass(frozen=True)
class Case:
    name: str
    code: int
    expect: Expect
    fields: dict[str, str] = field(default_factory=dict)
    body: str = ""


def cmd(case: Case) -> RemotingCommand:
    return RemotingCommand(case.code, dict(case.fields), case.body.encode())


# -- what the guard checks ------------------------------------------------------------------


def guard_pairs(case: Case) -> set[Pair] | None:
    """The pairs the guard checks, or None when it refuses the request unread."""
    request = cmd(case)
    try:
        accesses = REMOTING_RESOURCES[case.code](request, read_body(request))
    except UnreadableBody:
        return None
    return {(a.group if a.action != "see" and a.action != "publish" else "", a.topic)
            for a in accesses}  # fmt: skip


# -- what the broker reads ------------------------------------------------------------------

# Header codes: the class the broker's processor decodes into, and the fields of it that
# name the group (or None) and the topic.
HEADER_CODES: dict[int, tuple[str, str | None, str]] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: ("namesrv.GetRouteInfoRequestHeader", None, "topic"),
    RequestCode.RECALL_MESSAGE: ("RecallMessageRequestHeader", None, "topic"),
    RequestCode.END_TRANSACTION: ("EndTransactionRequestHeader", None, "topic"),
    RequestCode.CONSUMER_SEND_MSG_BACK: (
        "ConsumerSendMsgBackRequestHeader", "group", "originTopic"),
    RequestCode.PULL_MESSAGE: ("PullMessageRequestHeader", "consumerGroup", "topic"),
    RequestCode.LITE_PULL_MESSAGE: ("PullMessageRequestHeader", "consumerGroup", "topic"),
    RequestCode.POP_MESSAGE: ("PopMessageRequestHeader", "consumerGroup", "topic"),
    RequestCode.NOTIFICATION: ("NotificationRequestHeader", "consumerGroup", "topic"),
    RequestCode.ACK_MESSAGE: ("AckMessageRequestHeader", "consumerGroup", "topic"),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: (
        "ChangeInvisibleTimeRequestHeader", "consumerGroup", "topic"),
    RequestCode.QUERY_CONSUMER_OFFSET: (
        "QueryConsumerOffsetRequestHeader", "consumerGroup", "topic"),
    RequestCode.UPDATE_CONSUMER_OFFSET: (
        "UpdateConsumerOffsetRequestHeader", "consumerGroup", "topic"),
    RequestCode.GET_MAX_OFFSET: ("GetMaxOffsetRequestHeader", None, "topic"),
    RequestCode.GET_MIN_OFFSET: ("GetMinOffsetRequestHeader", None, "topic"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: ("SearchOffsetRequestHeader", None, "topic"),
    RequestCode.GET_EARLIEST_MSG_STORETIME: ("GetEarliestMsgStoretimeRequestHeader", None, "topic"),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: (
        "GetConsumerListByGroupRequestHeader", "consumerGroup", ""),
}  # fmt: skip
SENDS = {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
BODY_CODES: dict[int, str] = {
    RequestCode.LOCK_BATCH_MQ: "body.LockBatchRequestBody",
    RequestCode.UNLOCK_BATCH_MQ: "body.UnlockBatchRequestBody",
    RequestCode.BATCH_ACK_MESSAGE: "body.BatchAckMessageRequestBody",
    RequestCode.HEART_BEAT: "heartbeat.HeartbeatData",
}
SIGNATURE_ONLY = {RequestCode.UNREGISTER_CLIENT, RequestCode.CHECK_CLIENT_CONFIG}


def broker_request(case: Case) -> Request:
    if case.code in SENDS:
        return Request("send", case.code, fields=case.fields)
    if case.code in BODY_CODES:
        return Request("body", case.code, BODIES + BODY_CODES[case.code], body=case.body.encode())
    return Request("header", case.code, HEADERS + HEADER_CODES[case.code][0], fields=case.fields)


def broker_pairs(case: Case, value: dict) -> set[Pair]:
    """The pairs a broker acts on, from what its classes read."""
    code = case.code
    if code in SENDS:
        return {("", value.get("topic") or "")}
    if code == RequestCode.BATCH_ACK_MESSAGE:
        return {(a.get("c") or "", a.get("t") or "") for a in value.get("acks") or []}
    if code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
        group = value.get("consumerGroup") or ""
        return {(group, q.get("topic") or "") for q in value.get("mqSet") or []}
    if code == RequestCode.HEART_BEAT:
        return {
            (c.get("groupName") or "", s.get("topic") or "")
            for c in value.get("consumerDataSet") or []
            for s in c.get("subscriptionDataSet") or []
        }
    _, group_field, topic_field = HEADER_CODES[code]
    group = value.get(group_field) or "" if group_field else ""
    return {(group, value.get(topic_field) or "" if topic_field else "")}


# -- the cases ------------------------------------------------------------------------------

Q = {"queueId": "0"}
POP = {"maxMsgNums": "1", "invisibleTime": "1000", "pollTime": "0", "bornTime": "0",
       "initMode": "0"}  # fmt: skip
PULL = {"queueOffset": "0", "maxMsgNums": "1", "sysFlag": "0", "commitOffset": "0",
        "suspendTimeoutMillis": "0", "subVersion": "0"}  # fmt: skip
EXTRA = {"extraInfo": "0 1 1000 0 0 broker-a 0 0", "offset": "0"}
V2 = {"a": "P", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0", "h": "0", "j": "0"}
V1 = {"producerGroup": "P", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
      "queueId": "0", "sysFlag": "0", "bornTimestamp": "0", "flag": "0"}  # fmt: skip


def ack(**keys: object) -> dict:
    return {"rq": 0, "q": 0, "so": 0, "pt": 0, "it": 1000, "b": "AQ==", **keys}


def body(value: object) -> str:
    return json.dumps(value)


def dup_keys_ack() -> str:
    # A key written twice: json.dumps cannot, so the text is made by hand.
    return '{"acks":[{"c":"allowed","t":"T","c":"victim","q":0,"so":0,"pt":0,"it":1}]}'


C = Expect.CHECKED
R = Expect.REFUSED
CASES = [
    Case("route", RequestCode.GET_ROUTEINFO_BY_TOPIC, C, {"topic": "T"}),
    Case("send v1", RequestCode.SEND_MESSAGE, C, {**V1, "topic": "T"}),
    Case("send v2", RequestCode.SEND_MESSAGE_V2, C, {**V2, "b": "T"}),
    Case("send v2, a v1 topic beside", RequestCode.SEND_MESSAGE_V2, C,
         {**V2, "b": "T", "topic": "victim"}),
    Case("send batch", RequestCode.SEND_BATCH_MESSAGE, C, {**V2, "b": "T", "m": "true"}),
    Case("recall", RequestCode.RECALL_MESSAGE, C,
         {"producerGroup": "P", "topic": "T", "recallHandle": "h"}),
    Case("end transaction", RequestCode.END_TRANSACTION, C,
         {"producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
          "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "m",
          "topic": "T"}),
    Case("end transaction, no topic", RequestCode.END_TRANSACTION, R,
         {"producerGroup": "P", "tranStateTableOffset": "0", "commitLogOffset": "0",
          "commitOrRollback": "8", "fromTransactionCheck": "false", "msgId": "m"}),
    Case("send back", RequestCode.CONSUMER_SEND_MSG_BACK, C,
         {"offset": "0", "group": "G", "delayLevel": "0", "originTopic": "T"}),
    Case("send back to the retry topic", RequestCode.CONSUMER_SEND_MSG_BACK, C,
         {"offset": "0", "group": "G", "delayLevel": "0", "originTopic": "%RETRY%G"}),
    Case("pull", RequestCode.PULL_MESSAGE, C, {**PULL, **Q, "consumerGroup": "G", "topic": "T"}),
    Case("lite pull", RequestCode.LITE_PULL_MESSAGE, C,
         {**PULL, **Q, "consumerGroup": "G", "topic": "T"}),
    Case("pop", RequestCode.POP_MESSAGE, C, {**POP, **Q, "consumerGroup": "G", "topic": "T"}),
    Case("notification", RequestCode.NOTIFICATION, C,
         {**Q, "pollTime": "0", "bornTime": "0", "consumerGroup": "G", "topic": "T"}),
    Case("ack", RequestCode.ACK_MESSAGE, C, {**Q, **EXTRA, "consumerGroup": "G", "topic": "T"}),
    Case("change invisible", RequestCode.CHANGE_MESSAGE_INVISIBLETIME, C,
         {**Q, **EXTRA, "invisibleTime": "1000", "consumerGroup": "G", "topic": "T"}),
    Case("query offset", RequestCode.QUERY_CONSUMER_OFFSET, C,
         {**Q, "consumerGroup": "G", "topic": "T"}),
    Case("update offset", RequestCode.UPDATE_CONSUMER_OFFSET, C,
         {**Q, "commitOffset": "0", "consumerGroup": "G", "topic": "T"}),
    Case("max offset", RequestCode.GET_MAX_OFFSET, C, {**Q, "topic": "T"}),
    Case("min offset", RequestCode.GET_MIN_OFFSET, C, {**Q, "topic": "T"}),
    Case("search offset", RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, C,
         {**Q, "timestamp": "0", "topic": "T"}),
    Case("earliest", RequestCode.GET_EARLIEST_MSG_STORETIME, C, {**Q, "topic": "T"}),
    Case("consumer list", RequestCode.GET_CONSUMER_LIST_BY_GROUP, C, {"consumerGroup": "G"}),
    # Queue locks.
    Case("lock", RequestCode.LOCK_BATCH_MQ, C, body=body(
        {"consumerGroup": "G", "clientId": "c",
         "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0},
                   {"topic": "U", "brokerName": "b", "queueId": 1}]})),
    Case("unlock", RequestCode.UNLOCK_BATCH_MQ, C, body=body(
        {"consumerGroup": "G", "clientId": "c",
         "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0}]})),
    Case("lock, a queue without its topic", RequestCode.LOCK_BATCH_MQ, R, body=body(
        {"consumerGroup": "G", "mqSet": [{"brokerName": "b", "queueId": 0}]})),
    Case("lock, queues an object not a list", RequestCode.LOCK_BATCH_MQ, R, body=body(
        {"consumerGroup": "G", "mqSet": {"topic": "T", "brokerName": "b", "queueId": 0}})),
    Case("lock, the group a number", RequestCode.LOCK_BATCH_MQ, R, body=body(
        {"consumerGroup": 7, "mqSet": [{"topic": "T", "brokerName": "b", "queueId": 0}]})),
    # Batch acks: the short keys clients write, the long ones a broker also reads, both.
    Case("batch ack, short keys", RequestCode.BATCH_ACK_MESSAGE, C,
         body=body({"brokerName": "b", "acks": [ack(c="G", t="T")]})),
    Case("batch ack, long keys", RequestCode.BATCH_ACK_MESSAGE, C,
         body=body({"brokerName": "b", "acks": [ack(consumerGroup="G", topic="T")]})),
    Case("batch ack, both alike", RequestCode.BATCH_ACK_MESSAGE, C, body=body(
        {"acks": [ack(c="G", consumerGroup="G", t="T", topic="T")]})),
    Case("batch ack, long then short differing", RequestCode.BATCH_ACK_MESSAGE, C, body=body(
        {"acks": [ack(consumerGroup="allowed", c="victim", topic="T", t="victim-topic")]})),
    Case("batch ack, short then long differing", RequestCode.BATCH_ACK_MESSAGE, C, body=body(
        {"acks": [ack(c="victim", consumerGroup="allowed", t="T", topic="T2")]})),
    Case("batch ack, a key written twice", RequestCode.BATCH_ACK_MESSAGE, C,
         body=dup_keys_ack()),
    Case("batch ack, two entries", RequestCode.BATCH_ACK_MESSAGE, C, body=body(
        {"acks": [ack(c="G", t="T"), ack(consumerGroup="H", topic="U")]})),
    Case("batch ack, no group", RequestCode.BATCH_ACK_MESSAGE, R,
         body=body({"acks": [ack(t="T")]})),
    Case("batch ack, a group the broker reads from an array", RequestCode.BATCH_ACK_MESSAGE, R,
         body=body({"acks": [ack(c=["victim"], t="T")]})),
    Case("batch ack, acks an object", RequestCode.BATCH_ACK_MESSAGE, R,
         body=body({"acks": ack(c="victim", t="T")})),
    Case("batch ack, the group a number", RequestCode.BATCH_ACK_MESSAGE, R,
         body=body({"acks": [ack(c=5, t="T")]})),
    # Heartbeats: each consumer's group and topics.
    Case("heartbeat", RequestCode.HEART_BEAT, C, body=body(
        {"clientID": "c", "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
         "consumerDataSet": [{"groupName": "G", "consumeType": "CONSUME_PASSIVELY",
                              "messageModel": "CLUSTERING",
                              "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                              "subscriptionDataSet": [{"topic": "T", "subString": "*"},
                                                      {"topic": "%RETRY%G", "subString": "*"}],
                              "unitMode": False}]})),
    Case("heartbeat, a producer's", RequestCode.HEART_BEAT, C,
         body=body({"clientID": "c", "producerDataSet": [{"groupName": "P"}]})),
    Case("heartbeat, a group written twice", RequestCode.HEART_BEAT, C, body=(
        '{"clientID":"c","consumerDataSet":[{"groupName":"allowed","groupName":"victim",'
        '"subscriptionDataSet":[{"topic":"T"}]}]}')),
    Case("heartbeat, a subscription without its topic", RequestCode.HEART_BEAT, R, body=body(
        {"clientID": "c", "consumerDataSet": [{"groupName": "G",
                                               "subscriptionDataSet": [{"subString": "*"}]}]})),
]  # fmt: skip


def test_the_cases_cover_every_code_the_port_relays():
    relayed = {code for code in RequestCode if destination(RemotingCommand(code, {})) not in
               (Destination.NOT_SERVED,)}  # fmt: skip
    assert relayed - SIGNATURE_ONLY == {c.code for c in CASES}


def test_the_guard_checks_what_the_broker_acts_on():
    read = read_all([broker_request(c) for c in CASES])
    wrong = []
    for case, answer in zip(CASES, read, strict=True):
        checked = guard_pairs(case)
        if case.expect is Expect.REFUSED:
            if checked is not None:
                wrong.append(f"{case.name}: the guard checked {checked}, not refused")
            continue
        if not answer["ok"]:
            wrong.append(f"{case.name}: the broker could not read it: {answer['error']}")
            continue
        acted = broker_pairs(case, answer["value"])
        if checked != acted:
            wrong.append(f"{case.name}: the guard checked {checked}, the broker acts on {acted}")
    assert not wrong, "\n".join(wrong)


def test_a_crafted_batch_ack_is_refused_on_real_brokers(production_proxy, real_cluster):
    """The production profile's remoting port on the session's real brokers, a user of
    group ``billing`` only: its batch ack as a client writes it passes the guard; one that
    names ``billing`` under the long key and another group under the short key, which the
    broker reads, is refused (that it then reaches no broker, tests/integration/
    test_remoting_port.py holds)."""
    host, port = production_proxy.remoting.rsplit(":", 1)
    broker = min(admin.masters(real_cluster.namesrv_address))
    checkpoint = PopCheckpointInfo(0, now_ms(), 30_000, 0, 0, broker, 0, 0)

    async def batch_acks() -> tuple[RemotingCommand, RemotingCommand]:
        client = RemotingClient(f"{host}:{port}", request_hook=RemotingSigner(*BILLING_USER))
        try:
            own = RemotingCommand(
                RequestCode.BATCH_ACK_MESSAGE, {"bname": broker},
                batch_ack_body(broker, "billing", "orders", [checkpoint]),
            )  # fmt: skip
            entry = ack(consumerGroup="billing", c="shipping", t="orders")
            crafted = RemotingCommand(
                RequestCode.BATCH_ACK_MESSAGE, {"bname": broker},
                json.dumps({"brokerName": broker, "acks": [entry]}).encode(),
            )  # fmt: skip
            return await client.invoke(own, 10.0), await client.invoke(crafted, 10.0)
        finally:
            await client.close()

    own, crafted = asyncio.run(batch_acks())
    assert own.code != ResponseCode.NO_PERMISSION, own.remark
    assert crafted.code == ResponseCode.NO_PERMISSION
    assert crafted.remark == (
        f"user {BILLING_USER[0]!r} may not subscribe to 'orders' as group 'shipping'"
    )
