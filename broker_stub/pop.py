"""POP consumption: pop offsets, checkpoints, acks, invisible time and revival.

A pop takes messages from a queue at the group's pop offset and moves the offset past
them, recording a *checkpoint* (the offsets taken, when, for how long). Until the
checkpoint's invisible time ends no one else can get those messages. An ack removes an
offset from its checkpoint. When the time ends, every offset still unacked is *revived*: a
copy goes to the group's retry topic with ``reconsumeTimes + 1``, visible at once. As on a
RocketMQ 5 broker with ``enableRetryTopicV2`` that is ``%RETRY%<group>+<topic>``, and a
revival never dead-letters: the consumer (the proxy) moves a message past its last attempt
to ``%DLQ%<group>`` with CONSUMER_SEND_MSG_BACK, where the group's ``retryMaxTimes`` decides.

An *orderly* pop (``order=true``, FIFO consumer groups) works as a RocketMQ 5 broker's
(``ConsumerOrderInfoManager``): no checkpoint and no retry topic. A queue with a message
popped and neither acked nor past its invisible time is *blocked*: no other orderly pop
gets anything from it, unless it repeats the attempt id of the pop that blocked it (a
client retrying a receive whose answer it lost), which gets the same messages again. The
group's offset of the queue stays at the first unacked message; when the invisible time
passes unacked, the next pop reads the same messages again and ``orderCountInfo`` counts
the attempts (the reconsume times). Acks commit the offset (``ack_orderly``); a change of
invisible time moves the block's end (``change_orderly``). Handles carry revive queue 999.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from broker_stub.config import BrokerConfig
from broker_stub.sql92 import Sql92Filter
from broker_stub.store import MessageStore, PutResult
from broker_stub.topics import TopicTable
from proxy.remoting.filter import TagFilter
from proxy.remoting.headers import now_ms
from proxy.remoting.message import (
    MessageExt,
    Prop,
    decode_messages,
    encode_message,
    record_properties,
)
from proxy.remoting.popinfo import (
    RETRY_GROUP_TOPIC_PREFIX,
    RETRY_V2,
    PopCheckpointInfo,
    dlq_topic,
    retry_flag,
    topic_for_flag,
)

log = logging.getLogger(__name__)

ORIGIN_GROUP = "ORIGIN_GROUP"  # set by a RocketMQ 5 broker on revived messages
INIT_MODE_MIN = 0  # a new group starts at the oldest message
INIT_MODE_MAX = 1  # ... or at the newest, unless nothing has been dropped yet
POP_ORDER_REVIVE_QUEUE = 999  # KeyBuilder.POP_ORDER_REVIVE_QUEUE: the reviveQid of orderly pops


def pop_retry_topic(group: str, topic: str) -> str:
    """The pop retry topic of (group, topic): V2, ``%RETRY%<group>+<topic>``, what a RocketMQ
    5 broker with ``enableRetryTopicV2`` writes (V1 ``_`` names cannot be told apart when a
    group or topic name holds ``_``, and only V2 revivals wake parked requests there)."""
    return topic_for_flag(RETRY_V2, group, topic)


def group_retry_topic(group: str) -> str:
    """``%RETRY%<group>``: where CONSUMER_SEND_MSG_BACK puts a message it does not
    dead-letter (with a delay level)."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}"


# A pop's filter: tags, matched against the consume queue's tag of each message, or SQL92,
# evaluated against the properties of its stored record.
MessageFilter = TagFilter | Sql92Filter


@dataclass(slots=True)
class PopRequest:
    group: str
    topic: str
    queue_id: int  # -1: every queue, from a random one
    max_nums: int
    invisible_time: int  # ms
    filter: MessageFilter
    init_mode: int = INIT_MODE_MAX
    priority_factor: int = 100  # the group's priority.factor


@dataclass(slots=True)
class PoppedQueue:
    """One queue's share of a pop."""

    topic: str  # the topic read: the requested one or its retry topic
    queue_id: int
    start_offset: int
    offsets: list[int]
    records: list[bytes]


@dataclass(slots=True)
class PopResult:
    pop_time: int
    invisible_time: int
    revive_qid: int
    queues: list[PoppedQueue] = field(default_factory=list)
    rest_num: int = 0
    # Orderly pops: "<retry> qo<queueId>%<offset> <count>" per message popped before, then
    # "<retry> <queueId> <least count>" per queue (ExtraInfoUtil); None for plain pops.
    order_count_info: list[str] | None = None

    @property
    def message_count(self) -> int:
        return sum(len(q.offsets) for q in self.queues)


# group, topic, queue id, start offset, pop time, invisible time
CheckpointKey = tuple[str, str, int, int, int, int]


@dataclass(slots=True, eq=False)
class Checkpoint:
    group: str
    topic: str
    queue_id: int
    start_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    origin_topic: str  # the topic the consumer asked for
    unacked: set[int]
    timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> CheckpointKey:
        # The invisible time is part of it: a change of invisible time in the same
        # millisecond as the pop makes a checkpoint of its own, not a merge into the old one.
        return (
            self.group,
            self.topic,
            self.queue_id,
            self.start_offset,
            self.pop_time,
            self.invisible_time,
        )


@dataclass(slots=True, eq=False)
class OrderInfo:
    """The last orderly pop of one (group, topic, queue): what blocks the queue."""

    attempt_id: str | None
    pop_time: int
    invisible_time: int
    offsets: list[int]
    acked: set[int] = field(default_factory=set)
    counts: dict[int, int] = field(default_factory=dict)  # offset -> earlier pops of it
    next_visible: dict[int, int] = field(default_factory=dict)  # changed invisible times

    def blocks(self, attempt_id: str | None, now: int) -> bool:
        """Whether an orderly pop with ``attempt_id`` must skip the queue (needBlock)."""
        if self.attempt_id is not None and self.attempt_id == attempt_id:
            return False
        default = self.pop_time + self.invisible_time
        return any(
            now < self.next_visible.get(off, default)
            for off in self.offsets
            if off not in self.acked
        )

    def next_offset(self) -> int:
        """The first unacked offset, or past the last one (getNextOffset)."""
        for off in self.offsets:
            if off not in self.acked:
                return off
        return self.offsets[-1] + 1


def _info_key(group: str, topic: str, info: PopCheckpointInfo) -> CheckpointKey:
    """The key of the checkpoint a handle names (see ``Checkpoint.key``)."""
    return (group, topic, info.queue_id, info.start_offset, info.pop_time, info.invisible_time)


class PopService:
    def __init__(
        self,
        store: MessageStore,
        topics: TopicTable,
        config: BrokerConfig,
        loop: asyncio.AbstractEventLoop,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.topics = topics
        self.config = config
        self.loop = loop
        self.rng = rng or random.Random()
        self._offsets: dict[tuple[str, str, int], int] = {}
        self._checkpoints: dict[CheckpointKey, Checkpoint] = {}
        self._orders: dict[tuple[str, str, int], OrderInfo] = {}  # (group, topic, queue)
        self._revive_counter = 0
        # retry topic -> (group, original topic), so a revival wakes the right waiters
        self.retry_origins: dict[str, tuple[str, str]] = {}
        # Puts a message honouring its delay (the broker's scheduler); set by the broker.
        self.put: Callable[[MessageExt], PutResult] | None = None

    @property
    def checkpoint_count(self) -> int:
        return len(self._checkpoints)

    def close(self) -> None:
        for ck in self._checkpoints.values():
            if ck.timer is not None:
                ck.timer.cancel()
        self._checkpoints.clear()

    # -- pop ------------------------------------------------------------------------------

    def pop(self, req: PopRequest) -> PopResult:
        self._revive_counter += 1
        result = PopResult(
            pop_time=now_ms(),
            invisible_time=req.invisible_time,
            revive_qid=self._revive_counter % self.config.revive_queue_nums,
        )
        retry_topic = pop_retry_topic(req.group, req.topic)
        # A 5.5.0 broker pops a PRIORITY topic in "priority mode" in priority.factor percent
        # of pops: its queues from the highest id down (queue id = priority), and its retry
        # topic never first (popFromRetryProbabilityForPriority 0).
        config = self.topics.get(req.topic)
        priority_mode = (
            config is not None
            and config.message_type == "PRIORITY"
            and self.rng.randrange(100) < req.priority_factor
        )
        retry_first = not priority_mode and self.rng.random() < self.config.retry_first_probability
        if retry_first:
            self._pop_topic(req, retry_topic, -1, result)
        self._pop_topic(req, req.topic, req.queue_id, result, by_priority=priority_mode)
        if not retry_first:
            self._pop_topic(req, retry_topic, -1, result)
        return result

    def _pop_topic(
        self,
        req: PopRequest,
        topic: str,
        queue_id: int,
        result: PopResult,
        *,
        by_priority: bool = False,
    ) -> None:
        config = self.topics.get(topic)
        if config is None:
            return
        if queue_id >= 0:
            queue_ids = [queue_id]
        elif by_priority:
            queue_ids = list(reversed(range(config.read_queue_nums)))
        else:
            count = config.read_queue_nums
            start = self.rng.randrange(count)
            queue_ids = [(start + i) % count for i in range(count)]
        for qid in queue_ids:
            want = req.max_nums - result.message_count
            if want <= 0:
                # Still count the backlog the client will find on its next pop.
                result.rest_num += self.store.max_offset(topic, qid) - self._offset(req, topic, qid)
                continue
            self._pop_queue(req, topic, qid, want, result)

    def _scan(
        self, req: PopRequest, topic: str, queue_id: int, offset: int, want: int
    ) -> tuple[list[int], list[bytes], int]:
        """Up to ``want`` messages of the queue from ``offset`` that the filter matches
        (within the scan limit): their offsets, their records, and the offset after the
        last entry looked at. A tag filter reads only the consume queue's tags; a SQL92
        filter reads each record's properties (record_properties, not the whole message)."""
        offsets: list[int] = []
        records: list[bytes] = []
        next_offset = offset
        entries = self.store.queue(topic, queue_id).scan(offset, self.config.scan_limit)
        read = self.store.commit_log.read
        sql = req.filter if isinstance(req.filter, Sql92Filter) else None
        tags = req.filter if isinstance(req.filter, TagFilter) else None
        for off, entry in entries:
            next_offset = off + 1
            if tags is not None and not tags.matches(entry.tag):
                continue
            record = read(entry.physical_offset)
            if record is None or (sql is not None and not sql.matches(record_properties(record))):
                continue
            offsets.append(off)
            records.append(record)
            if len(offsets) >= want:
                break
        return offsets, records, next_offset

    def _pop_queue(
        self, req: PopRequest, topic: str, queue_id: int, want: int, result: PopResult
    ) -> None:
        queue = self.store.queue(topic, queue_id)
        offset = self._offset(req, topic, queue_id)
        offsets, records, next_offset = self._scan(req, topic, queue_id, offset, want)
        # A message the filter skips is consumed for this group.
        self._offsets[(req.group, topic, queue_id)] = next_offset
        result.rest_num += queue.max_offset - next_offset
        if not offsets:
            return
        if topic != req.topic:
            records = [self._as_origin(r, req, topic, offset, result) for r in records]
        self._add_checkpoint(
            Checkpoint(
                group=req.group,
                topic=topic,
                queue_id=queue_id,
                start_offset=offset,
                pop_time=result.pop_time,
                invisible_time=result.invisible_time,
                revive_qid=result.revive_qid,
                origin_topic=req.topic,
                unacked=set(offsets),
            )
        )
        result.queues.append(PoppedQueue(topic, queue_id, offset, offsets, records))

    def _offset(self, req: PopRequest, topic: str, queue_id: int) -> int:
        offset = self._offsets.get((req.group, topic, queue_id))
        minimum = self.store.min_offset(topic, queue_id)
        if offset is None:
            # As RocketMQ (getInitOffset, initPopOffsetByCheckMsgInMem on): retry topics and
            # initMode MIN start at the oldest message; so does MAX while the queue still
            # holds its first message; otherwise MAX starts at the newest one ("pop last one").
            use_min = (
                req.init_mode == INIT_MODE_MIN
                or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
                or minimum == 0
            )
            offset = minimum if use_min else max(self.store.max_offset(topic, queue_id) - 1, 0)
        return max(offset, minimum)

    def _as_origin(
        self, record: bytes, req: PopRequest, topic: str, start: int, result: PopResult
    ) -> bytes:
        """Re-encode a retry-topic record as the original topic, its POP_CK filled in.

        The client cannot compute POP_CK for these itself: once the topic is rewritten it no
        longer knows the record came from the retry topic.
        """
        msg = decode_messages(record)[0]
        info = PopCheckpointInfo(
            start,
            result.pop_time,
            result.invisible_time,
            result.revive_qid,
            retry_flag(topic),
            self.config.name,
            msg.queue_id,
            msg.queue_offset,
        )
        msg.properties.setdefault(Prop.POP_CK, info.encode())
        msg.topic = req.topic
        return encode_message(msg)

    # -- orderly pop ------------------------------------------------------------------------

    def pop_orderly(self, req: PopRequest, attempt_id: str | None) -> PopResult:
        """An orderly pop: the topic's queues only (never the retry topic), each skipped
        while blocked by an earlier pop of another attempt."""
        now = now_ms()
        result = PopResult(now, req.invisible_time, POP_ORDER_REVIVE_QUEUE, order_count_info=[])
        config = self.topics.get(req.topic)
        if config is None:
            return result
        if req.queue_id >= 0:
            queue_ids = [req.queue_id]
        else:
            count = config.read_queue_nums
            start = self.rng.randrange(count)
            queue_ids = [(start + i) % count for i in range(count)]
        for qid in queue_ids:
            key = (req.group, req.topic, qid)
            order = self._orders.get(key)
            if order is not None and order.blocks(attempt_id, now):
                continue  # the backlog behind a block is not counted (as RocketMQ)
            offset = self._offset(req, req.topic, qid)
            want = req.max_nums - result.message_count
            if want <= 0:
                result.rest_num += self.store.max_offset(req.topic, qid) - offset
                continue
            self._pop_queue_orderly(req, qid, offset, want, attempt_id, result)
        return result

    def pop_queue_orderly(
        self,
        group: str,
        topic: str,
        queue_id: int,
        max_nums: int,
        invisible_time: int,
        attempt_id: str | None,
        pop_time: int,
    ) -> PopResult:
        """An orderly pop of one queue of a topic the broker need not have a config for (a
        lite topic's LMQ): nothing while the queue is blocked by another attempt."""
        result = PopResult(pop_time, invisible_time, POP_ORDER_REVIVE_QUEUE, order_count_info=[])
        order = self._orders.get((group, topic, queue_id))
        if order is not None and order.blocks(attempt_id, pop_time):
            return result
        req = PopRequest(group, topic, queue_id, max_nums, invisible_time, TagFilter(None))
        offset = self._offset(req, topic, queue_id)
        self._pop_queue_orderly(req, queue_id, offset, max_nums, attempt_id, result)
        return result

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Move the group's offset of a queue (a lite subscription's offset option) and
        forget its orderly block, as a RocketMQ broker's assignResetOffset does."""
        self._offsets[(group, topic, queue_id)] = offset
        self._orders.pop((group, topic, queue_id), None)

    def suspend_orderly(
        self, group: str, topic: str, queue_id: int, pop_time: int, next_visible: int
    ) -> None:
        """Hand a whole orderly pop back until ``next_visible`` without counting it as an
        attempt (MemoryConsumerOrderInfoManager.suspendQueue): each message's count of
        earlier pops goes down by one; a handle of another pop changes nothing."""
        order = self._orders.get((group, topic, queue_id))
        if order is None or order.pop_time != pop_time:
            return
        order.counts = {o: c - 1 if c > 0 else c for o, c in order.counts.items()}
        order.next_visible.clear()
        order.invisible_time = next_visible - pop_time

    def block_end(self, group: str, topic: str, queue_id: int) -> int | None:
        """When the last unacked message of the queue's orderly pop becomes visible again
        (its lock-free time), or None when none is unacked."""
        order = self._orders.get((group, topic, queue_id))
        if order is None:
            return None
        default = order.pop_time + order.invisible_time
        ends = [order.next_visible.get(o, default) for o in order.offsets if o not in order.acked]
        return max(ends) if ends else None

    def consumed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where the group's next pop of the queue starts (0 before any): the consumer
        offset a broker reports in its consume stats."""
        return self._offsets.get((group, topic, queue_id), 0)

    def has_offset(self, group: str, topic: str, queue_id: int) -> bool:
        """Whether the group has consumed (or reset) the queue before."""
        return (group, topic, queue_id) in self._offsets

    def _pop_queue_orderly(
        self,
        req: PopRequest,
        queue_id: int,
        offset: int,
        want: int,
        attempt_id: str | None,
        result: PopResult,
    ) -> None:
        topic, key = req.topic, (req.group, req.topic, queue_id)
        queue = self.store.queue(topic, queue_id)
        offsets, records, next_offset = self._scan(req, topic, queue_id, offset, want)
        result.rest_num += queue.max_offset - next_offset
        if not offsets:
            # Nothing matched: the offset moves past what the filter skipped.
            self._offsets[key] = next_offset
            return
        self._offsets[key] = offset  # stays at the first message until it is acked
        old = self._orders.get(key)
        order = OrderInfo(attempt_id, result.pop_time, req.invisible_time, offsets)
        if old is not None:
            if old.attempt_id is not None and old.attempt_id == attempt_id:
                order.counts = old.counts  # the same attempt again: not another delivery
            else:
                before = set(old.offsets)
                order.counts = {o: old.counts.get(o, 0) + 1 for o in offsets if o in before}
        self._orders[key] = order
        assert result.order_count_info is not None
        flag = retry_flag(topic)
        for off, count in order.counts.items():
            result.order_count_info.append(f"{flag} qo{queue_id}%{off} {count}")
        least = min(order.counts.values()) if len(order.counts) == len(offsets) else 0
        result.order_count_info.append(f"{flag} {queue_id} {least}")
        result.queues.append(PoppedQueue(topic, queue_id, offset, offsets, records))

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's offset of an orderly consumed queue (0 before any pop)."""
        return self._offsets.get((group, topic, queue_id), 0)

    def ack_orderly(
        self, group: str, topic: str, queue_id: int, offset: int, pop_time: int
    ) -> bool | None:
        """Ack ``offset`` of an orderly pop (ackOrderly). True: the offset was committed
        and the queue is free for the next pop; False: nothing to do (already committed,
        or the handle is of an earlier pop of the queue); None: no such offset was popped."""
        key = (group, topic, queue_id)
        if offset < self.committed_offset(group, topic, queue_id):
            return False
        order = self._orders.get(key)
        if order is None:
            self._offsets[key] = offset + 1
            return True
        if pop_time != order.pop_time:
            return False
        if offset not in order.offsets:
            return None
        order.acked.add(offset)
        self._offsets[key] = order.next_offset()
        return not order.blocks(None, now_ms())

    def change_orderly(
        self, group: str, topic: str, queue_id: int, offset: int, pop_time: int, invisible: int
    ) -> int | None:
        """Make an orderly popped message invisible for ``invisible`` ms from now; the new
        invisible time counted from ``pop_time`` (the handle keeps its pop time), or None
        when the offset is already committed."""
        if offset < self.committed_offset(group, topic, queue_id):
            return None
        next_visible = now_ms() + invisible
        order = self._orders.get((group, topic, queue_id))
        if order is not None and order.pop_time == pop_time:
            order.next_visible[offset] = next_visible
        return next_visible - pop_time

    def has_message(self, group: str, topic: str, queue_id: int, *, order: bool = False) -> bool:
        """Whether a pop by ``group`` would find a message now, ignoring filters; an orderly
        one skips blocked queues.

        NOTIFICATION answers with this. It carries no filter of its own, and a 5.5.0 broker's
        NOTIFICATION cannot evaluate a SQL92 filter at the consume-queue level (that needs the
        message's properties), so it answers hasMsg for any new message, one that the
        group's SQL92 pop would skip included: so does the stub."""
        probe = PopRequest(group, topic, queue_id, 1, 0, TagFilter(None), INIT_MODE_MAX)
        config = self.topics.get(topic)
        queue_ids = [queue_id] if queue_id >= 0 else range(config.read_queue_nums if config else 0)
        now = now_ms()
        for qid in queue_ids:
            blocker = self._orders.get((group, topic, qid)) if order else None
            if blocker is not None and blocker.blocks(None, now):
                continue
            if self.store.max_offset(topic, qid) > self._offset(probe, topic, qid):
                return True
        retry = pop_retry_topic(group, topic)
        return self.store.max_offset(retry, 0) > self._offset(probe, retry, 0)

    # -- checkpoints ----------------------------------------------------------------------

    def _add_checkpoint(self, ck: Checkpoint) -> None:
        existing = self._checkpoints.get(ck.key)
        if existing is not None:  # same queue, start offset and millisecond: merge
            existing.unacked |= ck.unacked
            return
        self._checkpoints[ck.key] = ck
        delay = max((ck.pop_time + ck.invisible_time - now_ms()) / 1000, 0)
        ck.timer = self.loop.call_later(delay, self._revive, ck)

    def ack(self, info: PopCheckpointInfo, group: str, topic: str, offset: int) -> bool:
        """Ack ``offset`` of the checkpoint ``info`` names; False if it holds no such offset
        (already acked, or revived after its invisible time)."""
        ck = self._checkpoints.get(_info_key(group, topic, info))
        if ck is None or offset not in ck.unacked:
            return False
        ck.unacked.discard(offset)
        if not ck.unacked:
            self._drop_checkpoint(ck)
        return True

    def change_invisible_time(
        self, info: PopCheckpointInfo, group: str, topic: str, offset: int, invisible_time: int
    ) -> Checkpoint:
        """Move ``offset`` into a new checkpoint that starts now; return it.

        RocketMQ always writes the new checkpoint. We write it only while the old one still
        holds the offset: a message already acked or already revived must not come back.
        """
        ck = Checkpoint(
            group=group,
            topic=topic,
            queue_id=info.queue_id,
            start_offset=offset,
            pop_time=now_ms(),
            invisible_time=invisible_time,
            revive_qid=info.revive_qid,
            origin_topic=topic,
            unacked={offset},
        )
        old = self._checkpoints.get(_info_key(group, topic, info))
        if old is not None and offset in old.unacked:
            ck.origin_topic = old.origin_topic
            self.ack(info, group, topic, offset)
            self._add_checkpoint(ck)
        return ck

    def _drop_checkpoint(self, ck: Checkpoint) -> None:
        self._checkpoints.pop(ck.key, None)
        if ck.timer is not None:
            ck.timer.cancel()

    def _revive(self, ck: Checkpoint) -> None:
        if self._checkpoints.get(ck.key) is not ck:
            return
        del self._checkpoints[ck.key]
        for offset in sorted(ck.unacked):
            msg = self.store.message(ck.topic, ck.queue_id, offset)
            if msg is None:
                log.warning(
                    "cannot revive %s:%s@%s: no longer stored", ck.topic, ck.queue_id, offset
                )
                continue
            self.requeue(msg, ck.group, ck.origin_topic, first_pop_time=ck.pop_time)

    def requeue(
        self,
        msg: MessageExt,
        group: str,
        origin_topic: str,
        *,
        first_pop_time: int | None = None,
    ) -> MessageExt:
        """Revive: store a copy of ``msg`` in the group's pop retry topic with
        ``reconsumeTimes + 1``, visible at once. Returns the copy."""
        topic = pop_retry_topic(group, origin_topic)
        self.retry_origins[topic] = (group, origin_topic)
        props = dict(msg.properties)
        props.pop(Prop.POP_CK, None)
        props.setdefault(ORIGIN_GROUP, group)
        if first_pop_time is not None:
            props.setdefault(Prop.FIRST_POP_TIME, str(first_pop_time))
        return self._put_copy(msg, topic, props)

    def send_back(
        self, msg: MessageExt, group: str, origin_topic: str, delay_level: int, max_times: int
    ) -> MessageExt:
        """CONSUMER_SEND_MSG_BACK as a RocketMQ broker serves it: to ``%DLQ%<group>`` when
        ``delay_level`` < 0 or ``reconsumeTimes >= max_times``; else to ``%RETRY%<group>``
        after the delay level (0 means 3 + reconsumeTimes). Returns the copy."""
        props = dict(msg.properties)
        props.pop(Prop.POP_CK, None)
        props.setdefault(Prop.RETRY_TOPIC, origin_topic)
        props.setdefault(Prop.ORIGIN_MESSAGE_ID, msg.msg_id)
        if delay_level < 0 or msg.reconsume_times >= max_times:
            props.pop(Prop.DELAY, None)
            return self._put_copy(msg, dlq_topic(group), props)
        props[Prop.DELAY] = str(delay_level or 3 + msg.reconsume_times)
        return self._put_copy(msg, group_retry_topic(group), props)

    def _put_copy(self, msg: MessageExt, topic: str, props: dict[str, str]) -> MessageExt:
        self.topics.system_topic(topic)
        copy = MessageExt(
            topic=topic,
            body=msg.body,
            properties=props,
            queue_id=0,
            flag=msg.flag,
            sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp,
            born_host=msg.born_host,
            store_host=msg.store_host,
            reconsume_times=msg.reconsume_times + 1,
        )
        if self.put is not None and Prop.DELAY in props:
            self.put(copy)
        else:
            self.store.put(copy)
        return copy
