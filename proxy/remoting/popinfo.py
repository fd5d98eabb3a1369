"""POP bookkeeping strings: the checkpoint extra info (POP_CK) and the offset-info headers.

``POP_CK`` (RocketMQ's ``ExtraInfoUtil``) is eight space-separated fields::

    startOffset popTime invisibleTime reviveQid retryFlag brokerName queueId queueOffset

``startOffsetInfo`` and ``msgOffsetInfo`` list ``<retryFlag> <queueId> <value>`` entries
joined by ``;``; the retry flag says which topic a queue belongs to.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson

from proxy.remoting import fastjson

RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
RETRY_NORMAL = 0  # the topic itself
RETRY_V1 = 1  # %RETRY%<group>_<topic>
RETRY_V2 = 2  # %RETRY%<group>+<topic>


def retry_flag(topic: str) -> int:
    if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return RETRY_NORMAL
    return RETRY_V2 if "+" in topic else RETRY_V1


def pop_retry_topic(group: str, topic: str) -> str:
    """The V1 pop retry topic of a (group, topic)."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def dlq_topic(group: str) -> str:
    return f"{DLQ_GROUP_TOPIC_PREFIX}{group}"


def topic_for_flag(flag: int, group: str, topic: str) -> str:
    """The broker topic an ack must name, given the retry flag of its checkpoint."""
    if flag == RETRY_NORMAL:
        return topic
    if flag == RETRY_V1:
        return pop_retry_topic(group, topic)
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}+{topic}"


@dataclass(frozen=True, slots=True)
class PopCheckpointInfo:
    """The parsed POP_CK extra info of one popped message."""

    start_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry: int
    broker_name: str
    queue_id: int
    queue_offset: int

    def encode(self) -> str:
        return (
            f"{self.start_offset} {self.pop_time} {self.invisible_time} {self.revive_qid} "
            f"{self.retry} {self.broker_name} {self.queue_id} {self.queue_offset}"
        )

    @property
    def next_visible_time(self) -> int:
        return self.pop_time + self.invisible_time

    @classmethod
    def parse(cls, text: str) -> PopCheckpointInfo:
        """Parse extra info; raises ValueError saying what is wrong."""
        parts = text.split(" ")
        if len(parts) != 8:
            raise ValueError(f"extraInfo has {len(parts)} fields, expected 8")
        try:
            return cls(
                start_offset=int(parts[0]),
                pop_time=int(parts[1]),
                invisible_time=int(parts[2]),
                revive_qid=int(parts[3]),
                retry=int(parts[4]),
                broker_name=parts[5],
                queue_id=int(parts[6]),
                queue_offset=int(parts[7]),
            )
        except ValueError:
            raise ValueError(f"extraInfo {text!r} has a non-numeric field") from None


@dataclass(frozen=True)
class BatchAck:
    """One entry of a BATCH_ACK_MESSAGE body (``BatchAck``): the acked offsets of one pop
    from one queue, as a bit set relative to ``start_offset`` (``bits``: Java's
    ``BitSet.toByteArray()``, bit i of byte j is offset 8j+i)."""

    consumer_group: str
    topic: str
    retry: int
    start_offset: int
    queue_id: int
    revive_queue_id: int
    pop_time: int
    invisible_time: int
    bits: bytes

    # Each field as fastjson writes it (the @JSONField short name) and the long name a
    # reader also accepts (``alternateNames``): of the two, the one written last counts.
    KEYS: ClassVar[dict[str, tuple[str, str]]] = {
        "consumer_group": ("c", "consumerGroup"),
        "topic": ("t", "topic"),
        "retry": ("r", "retry"),
        "start_offset": ("so", "startOffset"),
        "queue_id": ("q", "queueId"),
        "revive_queue_id": ("rq", "reviveQueueId"),
        "pop_time": ("pt", "popTime"),
        "invisible_time": ("it", "invisibleTime"),
        "bits": ("b", "bitSet"),
    }

    def offsets(self) -> list[int]:
        """The acked offsets, in order."""
        return [
            self.start_offset + 8 * j + i
            for j, byte in enumerate(self.bits)
            for i in range(8)
            if byte & (1 << i)
        ]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, (short, _) in self.KEYS.items():
            value = getattr(self, name)
            if name == "bits":
                value = base64.b64encode(value).decode()
            elif name == "retry":
                value = str(value)
            out[short] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BatchAck:
        """Raises KeyError, TypeError or ValueError for a missing or malformed field (the
        revive queue defaults to 0, as the broker's does)."""

        def field(name: str, default: object = None) -> Any:
            short, long = cls.KEYS[name]
            value = fastjson.field(data, short, long)  # the last written wins, as a broker's
            value = default if value is None else value
            if value is None:
                raise KeyError(short)
            return value

        return cls(
            consumer_group=str(field("consumer_group")),
            topic=str(field("topic")),
            retry=int(field("retry", 0)),
            start_offset=int(field("start_offset")),
            queue_id=int(field("queue_id")),
            revive_queue_id=int(field("revive_queue_id", 0)),
            pop_time=int(field("pop_time")),
            invisible_time=int(field("invisible_time")),
            bits=base64.b64decode(field("bits", "")),
        )


def batch_ack_body(
    broker: str, group: str, topic: str, checkpoints: list[PopCheckpointInfo]
) -> bytes:
    """The BATCH_ACK_MESSAGE body acking ``checkpoints`` (``BatchAckMessageRequestBody``).

    Messages that one pop took from one queue share a checkpoint; each such group becomes
    one ``BatchAck``. ``topic`` is the topic popped; the retry flag tells the broker the
    real one.
    """
    offsets: dict[tuple[int, int, int, int, int, int], list[int]] = {}
    for ck in checkpoints:
        # A handle whose offset lies before its start is not one a broker made; it gets an
        # entry of its own (start = its offset), which the broker answers as it would a
        # single ack of it.
        start = min(ck.start_offset, ck.queue_offset)
        key = (ck.retry, ck.queue_id, start, ck.pop_time, ck.invisible_time, ck.revive_qid)
        offsets.setdefault(key, []).append(ck.queue_offset - start)
    acks = []
    for (retry, queue_id, start, pop_time, invisible, revive_qid), indexes in offsets.items():
        bits = bytearray(max(indexes) // 8 + 1)
        for i in indexes:
            bits[i // 8] |= 1 << (i % 8)
        entry = BatchAck(
            group, topic, retry, start, queue_id, revive_qid, pop_time, invisible, bytes(bits)
        )
        acks.append(entry.to_json())
    return orjson.dumps({"brokerName": broker, "acks": acks})


def join_info(entries: list[tuple[int, int, str]]) -> str:
    """``retry queueId value`` entries joined by ``;``."""
    return ";".join(f"{retry} {queue_id} {value}" for retry, queue_id, value in entries)


def parse_info(text: str) -> dict[str, str]:
    """Parse a start/msg offset info string into ``{"<retry>@<queueId>": value}``."""
    result: dict[str, str] = {}
    if not text:
        return result
    for entry in text.split(";"):
        parts = entry.split(" ")
        if len(parts) != 3:
            raise ValueError(f"offset info entry {entry!r} does not have 3 fields")
        key = f"{parts[0]}@{parts[1]}"
        if key in result:
            raise ValueError(f"offset info repeats the key {key}")
        result[key] = parts[2]
    return result
