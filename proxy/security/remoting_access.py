"""What each request of the remoting port touches, for the guard (``Guard.check_remoting``):
the remoting twin of ``guard.RESOURCES``.

A request that names a topic and a group is a subscription; one that names a topic only, a
look at the topic, but a send's, a publication. A consumer's own retry topic
(``%RETRY%<group>``) is its group's: a user that may subscribe the group to any topic may
pull from it and send messages back to it. A code missing here is refused (fail closed),
and so is a request whose resources cannot be named as the broker will read them: a body
the shared reading (``proxy/remoting/bodies.py``) cannot read, an END_TRANSACTION without
its topic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from proxy.remoting.bodies import BatchAcks, Heartbeat, QueueLock, RequestBody, UnreadableBody
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.security.access import Access

RETRY_PREFIX = "%RETRY%"
_B = TypeVar("_B", QueueLock, BatchAcks, Heartbeat)

# What a request touches, from its header fields and its body as the broker reads it
# (``proxy/remoting/bodies.py``: None for a body that names nothing); raises UnreadableBody
# where a resource cannot be named.
Extractor = Callable[[RemotingCommand, RequestBody | None], list[Access]]


def _read_as(body: RequestBody | None, kind: type[_B]) -> _B:
    if not isinstance(body, kind):  # a caller that did not read the body first
        raise UnreadableBody(f"the body was not read as a {kind.__name__}")
    return body


def _subscription(group: str, topic: str) -> Access:
    if topic.startswith(RETRY_PREFIX) and topic[len(RETRY_PREFIX) :] == group:
        return Access("retry", topic, group)
    return Access("subscribe", topic, group)


def _fields(*names: str) -> Extractor:
    """A subscription of (group field, topic field), or a look at the topic alone."""

    def accesses(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
        values = [cmd.fields.get(name, "") for name in names]
        if len(values) == 1:
            topic = values[0]
            if topic.startswith(RETRY_PREFIX):  # a consumer's look at its retry topic
                return [Access("retry", topic, topic[len(RETRY_PREFIX) :])]
            return [Access("see", topic)]
        return [_subscription(values[0], values[1])]

    return accesses


def _publish(field: str) -> Extractor:
    return lambda cmd, body: [Access("publish", cmd.fields.get(field, ""))]


def _heartbeat(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
    """A consumer's heartbeat subscribes its group to each topic it lists (a producer's
    names only groups, which no permission covers)."""
    heartbeat = _read_as(body, Heartbeat)
    return [_subscription(c.group, topic) for c in heartbeat.consumers for topic in c.topics]


def _locks(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
    lock = _read_as(body, QueueLock)
    return [_subscription(lock.group, q.topic) for q in lock.queues]


def _batch_ack(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
    return [_subscription(a.group, a.topic) for a in _read_as(body, BatchAcks).acks]


def _end_transaction(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
    """The broker ends whichever half message the offsets name, once its producer group
    matches; the topic is all the request says of where it was sent. Without one there is
    nothing to check, so it is refused (``UnreadableBody``)."""
    topic = cmd.fields.get("topic")
    if not topic:
        raise UnreadableBody("END_TRANSACTION names no topic")
    return [Access("publish", topic)]


def _signature_only(cmd: RemotingCommand, body: RequestBody | None) -> list[Access]:
    return []


REMOTING_RESOURCES: dict[int, Extractor] = {
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
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: lambda cmd, body: [
        Access("group", "", cmd.fields.get("consumerGroup", ""))
    ],
    RequestCode.CHECK_CLIENT_CONFIG: _signature_only,
}
