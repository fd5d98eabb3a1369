"""What the bodies of 4.x clients' requests name, read as a RocketMQ 5.5.0 broker reads
them: one reading, shared by the remoting port's guard (what it checks) and its relay
(where a request goes), so that both see what the broker will act on.

A broker reads these bodies with fastjson2 into its own classes, and fastjson2 is lenient
in ways a check must not be blind to (each seen with the broker's own classes,
``rocketmq_local/broker-reading``, in tests/interop/test_remoting_bodies.py):

- a field is read from its name or any of its ``alternateNames`` (a BatchAck's group
  from ``c`` or ``consumerGroup``), and when several are written the last one wins;
- a number, a boolean, an object or a one-item array where a name is expected becomes a
  name (``5`` is ``"5"``, ``["x"]`` is ``"x"``), and an object where a list is expected a
  list of one.

So a resource is read here from every key the broker reads it from, the last written
winning; and a body whose resources the broker would read by one of those coercions, or
that leaves a resource out, is ``UnreadableBody``: the guard refuses it (fail closed)
rather than guess. A real client writes each name once, as a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.remoting import fastjson
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand


class UnreadableBody(ValueError):
    """A body whose resources cannot be named as the broker will read them."""


@dataclass(frozen=True, slots=True)
class Queue:
    """A message queue a body names (``MessageQueue``)."""

    topic: str
    broker: str


@dataclass(frozen=True, slots=True)
class QueueLock:
    """LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (``LockBatchRequestBody``, ``UnlockBatchRequestBody``)."""

    group: str
    queues: tuple[Queue, ...]


@dataclass(frozen=True, slots=True)
class Acked:
    """One entry of a BATCH_ACK_MESSAGE body (``BatchAck``): the group and the topic acked."""

    group: str
    topic: str


@dataclass(frozen=True, slots=True)
class BatchAcks:
    """BATCH_ACK_MESSAGE (``BatchAckMessageRequestBody``)."""

    acks: tuple[Acked, ...]


@dataclass(frozen=True, slots=True)
class Consumer:
    """A consumer a heartbeat registers (``ConsumerData``): its group and topics."""

    group: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """HEART_BEAT (``HeartbeatData``)."""

    producer_groups: tuple[str, ...]
    consumers: tuple[Consumer, ...]


RequestBody = QueueLock | BatchAcks | Heartbeat
# A body as read once for the guard and the relay: what it names, why it cannot be read,
# or None for a request whose body names nothing.
BodyReading = RequestBody | UnreadableBody | None

# Each field the bodies name a resource by, with every key the broker reads it from.
GROUP_OF_ACK = ("c", "consumerGroup")
TOPIC_OF_ACK = ("t", "topic")


def reading(cmd: RemotingCommand) -> BodyReading:
    """``read_body``'s answer, its UnreadableBody as a value: the port reads each request
    once and hands the reading to the guard and the relay."""
    try:
        return read_body(cmd)
    except UnreadableBody as exc:
        return exc


def read_body(cmd: RemotingCommand) -> RequestBody | None:
    """The resources ``cmd``'s body names; None for a request whose body names none.
    Raises UnreadableBody."""
    reader = _READERS.get(cmd.code)
    if reader is None:
        return None
    try:
        data = fastjson.loads(cmd.body) if cmd.body else {}
    except fastjson.FastjsonError as exc:
        raise UnreadableBody(f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UnreadableBody("the body is not an object")
    return reader(data)


def _queue_lock(data: dict[Any, Any]) -> QueueLock:
    group = _name(data, "consumerGroup")
    queues = tuple(
        Queue(_name(q, "topic"), _name(q, "brokerName")) for q in _objects(data, "mqSet")
    )
    return QueueLock(group, queues)


def _batch_ack(data: dict[Any, Any]) -> BatchAcks:
    return BatchAcks(
        tuple(
            Acked(_name(a, *GROUP_OF_ACK), _name(a, *TOPIC_OF_ACK)) for a in _objects(data, "acks")
        )
    )


def _heartbeat(data: dict[Any, Any]) -> Heartbeat:
    producers = tuple(_name(p, "groupName") for p in _objects(data, "producerDataSet"))
    consumers = tuple(
        Consumer(
            _name(c, "groupName"),
            tuple(_name(s, "topic") for s in _objects(c, "subscriptionDataSet")),
        )
        for c in _objects(data, "consumerDataSet")
    )
    return Heartbeat(producers, consumers)


_READERS: dict[int, Callable[[dict[Any, Any]], RequestBody]] = {
    RequestCode.LOCK_BATCH_MQ: _queue_lock,
    RequestCode.UNLOCK_BATCH_MQ: _queue_lock,
    RequestCode.BATCH_ACK_MESSAGE: _batch_ack,
    RequestCode.HEART_BEAT: _heartbeat,
}


def _name(obj: dict[Any, Any], *keys: str) -> str:
    """The resource name the broker reads from ``keys``: a non-empty string, or else
    UnreadableBody (absent, empty, or a value the broker would coerce into a name)."""
    value = fastjson.field(obj, *keys)
    if not isinstance(value, str) or not value:
        raise UnreadableBody(f"{keys[0]} is {'missing' if value is None else 'not a name'}")
    return value


def _objects(obj: dict[Any, Any], key: str) -> list[dict[Any, Any]]:
    """The list under ``key`` (absent or null: none), each item an object; else
    UnreadableBody (an object where the broker expects a list it reads as a list of one)."""
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise UnreadableBody(f"{key} is not a list of objects")
    return value
