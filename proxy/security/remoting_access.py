"""What each request of the remoting port touches, for the guard (``Guard.check_remoting``):
the remoting twin of ``guard.RESOURCES``.

A request that names a topic and a group is a subscription; one that names a topic only, a
look at the topic, but a send's, a publication. A consumer's own retry topic
(``%RETRY%<group>``) is its group's: a user that may subscribe the group to any topic may
pull from it and send messages back to it. A code missing here is refused (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.remoting import fastjson
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.security.access import Access

RETRY_PREFIX = "%RETRY%"


def _subscription(group: str, topic: str) -> Access:
    if topic.startswith(RETRY_PREFIX) and topic[len(RETRY_PREFIX) :] == group:
        return Access("retry", topic, group)
    return Access("subscribe", topic, group)


def _fields(*names: str) -> Callable[[RemotingCommand], list[Access]]:
    """A subscription of (group field, topic field), or a look at the topic alone."""

    def accesses(cmd: RemotingCommand) -> list[Access]:
        values = [cmd.fields.get(name, "") for name in names]
        if len(values) == 1:
            topic = values[0]
            if topic.startswith(RETRY_PREFIX):  # a consumer's look at its retry topic
                return [Access("retry", topic, topic[len(RETRY_PREFIX) :])]
            return [Access("see", topic)]
        return [_subscription(values[0], values[1])]

    return accesses


def _publish(field: str) -> Callable[[RemotingCommand], list[Access]]:
    return lambda cmd: [Access("publish", cmd.fields.get(field, ""))]


def _body(cmd: RemotingCommand) -> dict[str, Any]:
    try:
        data = fastjson.loads(cmd.body) if cmd.body else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _heartbeat(cmd: RemotingCommand) -> list[Access]:
    """A consumer's heartbeat subscribes its group to each topic it lists."""
    return [
        _subscription(str(consumer.get("groupName", "")), str(sub.get("topic", "")))
        for consumer in _body(cmd).get("consumerDataSet") or []
        if isinstance(consumer, dict)
        for sub in consumer.get("subscriptionDataSet") or []
        if isinstance(sub, dict)
    ]


def _locks(cmd: RemotingCommand) -> list[Access]:
    body = _body(cmd)
    group = str(body.get("consumerGroup", ""))
    queues = [q for q in body.get("mqSet") or [] if isinstance(q, dict)]
    return [_subscription(group, str(q.get("topic", ""))) for q in queues]


def _batch_ack(cmd: RemotingCommand) -> list[Access]:
    acks = [a for a in _body(cmd).get("acks") or [] if isinstance(a, dict)]
    return [_subscription(str(a.get("consumerGroup", "")), str(a.get("topic", ""))) for a in acks]


def _end_transaction(cmd: RemotingCommand) -> list[Access]:
    topic = cmd.fields.get("topic")
    return [Access("publish", topic)] if topic else []


def _signature_only(cmd: RemotingCommand) -> list[Access]:
    return []


REMOTING_RESOURCES: dict[int, Callable[[RemotingCommand], list[Access]]] = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: _fields("topic"),
    RequestCode.SEND_MESSAGE: _publish("topic"),
    RequestCode.SEND_MESSAGE_V2: _publish("b"),
    RequestCode.SEND_BATCH_MESSAGE: _publish("b"),
    RequestCode.RECALL_MESSAGE: _publish("topic"),
    RequestCode.END_TRANSACTION: _end_transaction,
    RequestCode.CONSUMER_SEND_MSG_BACK: _fields("group", "originTopic"),
    RequestCode.PULL_MESSAGE: _fields("consumerGroup", "topic"),
    RequestCode.LITE_PULL_MESSAGE: _fields("consumerGroup", "topic"),
    RequestCode.POP_MESSAGE: _fields("consumerGroup", "topic"),
    RequestCode.NOTIFICATION: _fields("consumerGroup", "topic"),
    RequestCode.ACK_MESSAGE: _fields("consumerGroup", "topic"),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: _fields("consumerGroup", "topic"),
    RequestCode.BATCH_ACK_MESSAGE: _batch_ack,
    RequestCode.QUERY_CONSUMER_OFFSET: _fields("consumerGroup", "topic"),
    RequestCode.UPDATE_CONSUMER_OFFSET: _fields("consumerGroup", "topic"),
    RequestCode.GET_MAX_OFFSET: _fields("topic"),
    RequestCode.GET_MIN_OFFSET: _fields("topic"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: _fields("topic"),
    RequestCode.GET_EARLIEST_MSG_STORETIME: _fields("topic"),
    RequestCode.LOCK_BATCH_MQ: _locks,
    RequestCode.UNLOCK_BATCH_MQ: _locks,
    RequestCode.HEART_BEAT: _heartbeat,
    RequestCode.UNREGISTER_CLIENT: _signature_only,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _signature_only,
    RequestCode.CHECK_CLIENT_CONFIG: _signature_only,
}
