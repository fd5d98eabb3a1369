"""The message store: a commit log of encoded records plus a consume queue per topic queue.

The split is RocketMQ's own. The commit log owns the bytes and hands out physical offsets;
a consume queue indexes one (topic, queue) by logical offset. ``InMemoryCommitLog`` keeps
records in a dict; a durable log only has to implement ``CommitLog`` (append, read by
offset, drop up to an offset) over files, and nothing above this module changes.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proxy.remoting.message import MessageExt, Prop, decode_messages, encode_message

LMQ_PREFIX = "%LMQ%"  # MixAll.LMQ_PREFIX: queues a message can be multi-dispatched to


class CommitLog(ABC):
    """Append-only storage of encoded message records, addressed by physical offset."""

    @property
    @abstractmethod
    def end_offset(self) -> int:
        """The physical offset the next record will get."""

    @abstractmethod
    def append(self, record: bytes) -> int:
        """Store a record at ``end_offset``; return that offset."""

    @abstractmethod
    def read(self, offset: int) -> bytes | None:
        """The record stored at ``offset``, or None if there is none (or it was dropped)."""

    @abstractmethod
    def drop(self, offset: int) -> None:
        """Forget the record at ``offset`` (retention); reads of it return None."""


class InMemoryCommitLog(CommitLog):
    def __init__(self) -> None:
        self._records: dict[int, bytes] = {}
        self._end = 0

    @property
    def end_offset(self) -> int:
        return self._end

    def append(self, record: bytes) -> int:
        offset = self._end
        self._records[offset] = record
        self._end += len(record)
        return offset

    def read(self, offset: int) -> bytes | None:
        return self._records.get(offset)

    def drop(self, offset: int) -> None:
        self._records.pop(offset, None)


@dataclass(slots=True)
class QueueEntry:
    """One consume-queue slot: where the record lives and its tag, for filtering."""

    physical_offset: int
    tag: str | None


class ConsumeQueue:
    """The logical offsets of one (topic, queue). Offsets start at 0 and only grow."""

    __slots__ = ("_entries", "_min_offset", "queue_id", "topic")

    def __init__(self, topic: str, queue_id: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._entries: list[QueueEntry] = []
        self._min_offset = 0  # logical offset of _entries[0]

    @property
    def min_offset(self) -> int:
        return self._min_offset

    @property
    def max_offset(self) -> int:
        """One past the last offset, as RocketMQ reports it."""
        return self._min_offset + len(self._entries)

    def add(self, entry: QueueEntry) -> int:
        self._entries.append(entry)
        return self.max_offset - 1

    def entry(self, offset: int) -> QueueEntry | None:
        index = offset - self._min_offset
        if 0 <= index < len(self._entries):
            return self._entries[index]
        return None

    def scan(self, offset: int, limit: int) -> Iterator[tuple[int, QueueEntry]]:
        """Up to ``limit`` (offset, entry) pairs from ``offset`` on."""
        start = max(offset - self._min_offset, 0)
        for index in range(start, min(start + limit, len(self._entries))):
            yield self._min_offset + index, self._entries[index]

    def truncate_to(self, count: int) -> list[QueueEntry]:
        """Keep at most ``count`` newest entries; return the dropped ones."""
        excess = len(self._entries) - count
        if excess <= 0:
            return []
        dropped = self._entries[:excess]
        del self._entries[:excess]
        self._min_offset += excess
        return dropped


@dataclass(slots=True)
class PutResult:
    queue_offset: int
    physical_offset: int
    store_timestamp: int


class MessageStore:
    """Stores messages and reads them back by (topic, queue, offset).

    ``on_arrival`` is called after every put with (topic, queue_id): the broker's long
    polling hangs off it, so waiting requests wake at once, not on a scan tick.
    """

    def __init__(
        self,
        commit_log: CommitLog | None = None,
        retain_per_queue: int = 1_000_000,
        on_arrival: Callable[[str, int], None] | None = None,
    ) -> None:
        self.commit_log = commit_log or InMemoryCommitLog()
        self.retain_per_queue = retain_per_queue
        self.on_arrival = on_arrival
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._puts = 0

    @property
    def commit_log_count(self) -> int:
        """How many messages were ever put."""
        return self._puts

    def put(self, msg: MessageExt) -> PutResult:
        """Assign offsets and store time, encode and append ``msg``; return where it went.

        A message naming light message queues in INNER_MULTI_DISPATCH (a lite message) is
        also indexed in queue 0 of each, its offsets there written into the record as
        INNER_MULTI_QUEUE_OFFSET: RocketMQ's LMQ dispatch (enableLmq, enableMultiDispatch).
        """
        queue = self.queue(msg.topic, msg.queue_id)
        lmqs = [
            name
            for name in msg.properties.get(Prop.INNER_MULTI_DISPATCH, "").split(",")
            if name.startswith(LMQ_PREFIX)
        ]
        if lmqs:
            msg.properties[Prop.INNER_MULTI_QUEUE_OFFSET] = ",".join(
                str(self.max_offset(name, 0)) for name in lmqs
            )
        msg.queue_offset = queue.max_offset
        msg.commit_log_offset = self.commit_log.end_offset
        msg.store_timestamp = int(time.time() * 1000)
        physical = self.commit_log.append(encode_message(msg))
        self._puts += 1
        queue.add(QueueEntry(physical, msg.tags))
        for dropped in queue.truncate_to(self.retain_per_queue):
            self.commit_log.drop(dropped.physical_offset)
        for name in lmqs:
            # The commit log keeps the record while its own queue does; an LMQ only
            # indexes it.
            self.queue(name, 0).add(QueueEntry(physical, msg.tags))
        if self.on_arrival is not None:
            self.on_arrival(msg.topic, msg.queue_id)
            for name in lmqs:
                self.on_arrival(name, 0)
        return PutResult(msg.queue_offset, physical, msg.store_timestamp)

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = ConsumeQueue(topic, queue_id)
        return queue

    def has_queue(self, topic: str, queue_id: int) -> bool:
        return (topic, queue_id) in self._queues

    def queue_count(self, prefix: str) -> int:
        """How many queues there are of topics named ``prefix...``."""
        return sum(1 for topic, _ in self._queues if topic.startswith(prefix))

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.max_offset if queue else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get((topic, queue_id))
        return queue.min_offset if queue else 0

    def record(self, topic: str, queue_id: int, offset: int) -> bytes | None:
        """The encoded record at a logical offset, or None."""
        queue = self._queues.get((topic, queue_id))
        entry = queue.entry(offset) if queue else None
        return self.commit_log.read(entry.physical_offset) if entry else None

    def message(self, topic: str, queue_id: int, offset: int) -> MessageExt | None:
        record = self.record(topic, queue_id, offset)
        return decode_messages(record)[0] if record else None

    def message_at(self, physical_offset: int) -> MessageExt | None:
        record = self.commit_log.read(physical_offset)
        return decode_messages(record)[0] if record else None
