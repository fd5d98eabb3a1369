"""The consume family of a broker's request handlers: pops, acks, invisible time, notifications,
dead letters and offsets. Only a parked long poll answers with a future."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import orjson

from broker_stub.admin import consume_stats_body
from broker_stub.handlers import RequestError
from broker_stub.parts import BAD, NO_MESSAGE_REMARK, OK, Handlers
from broker_stub.polling import PollingTable, PollKey, Waiter
from broker_stub.pop import POP_ORDER_REVIVE_QUEUE, MessageFilter, PopRequest, PopResult
from broker_stub.sql92 import Sql92Error, Sql92Filter
from proxy.remoting import fastjson
from proxy.remoting.codes import ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.filter import (
    MATCH_ALL,
    ExpressionType,
    FilterExpressionError,
    TagFilter,
)
from proxy.remoting.headers import (
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    ChangeInvisibleTimeResponseHeader,
    ConsumerSendMsgBackHeader,
    ConsumeStatsHeader,
    ConsumeTimeSpanHeader,
    NotificationHeader,
    NotificationResponseHeader,
    OffsetResponseHeader,
    PollingInfoHeader,
    PollingInfoResponseHeader,
    PopMessageHeader,
    PopMessageResponseHeader,
    QueueOffsetHeader,
    now_ms,
)
from proxy.remoting.message import Prop
from proxy.remoting.popinfo import (
    BatchAck,
    PopCheckpointInfo,
    join_info,
    retry_flag,
    topic_for_flag,
)
from proxy.remoting.server import Reply

log = logging.getLogger(__name__)

# A 5.5.0 broker's remark for a pop whose SQL92 expression does not parse.
SUBSCRIPTION_PARSE_FAILED_REMARK = "parse the consumer's subscription failed"


def pop_filter(expression: str | None, expression_type: str | None) -> MessageFilter:
    """The filter of a POP_MESSAGE (its ``exp`` and ``expType``), as a 5.5.0 broker reads
    them: no expression (absent or empty) takes every message whatever the type; ``SQL92``
    parses it with sql92.py, whatever ``enablePropertyFilter`` says (a broker applies SQL92
    to pops regardless); any other type is a tag expression (TagFilter, which refuses types
    it does not know). Raises RequestError SUBSCRIPTION_PARSE_FAILED."""
    if not expression:
        return MATCH_ALL
    if expression_type == ExpressionType.SQL92:
        try:
            return Sql92Filter.parse(expression)
        except Sql92Error as exc:
            log.debug("SQL92 expression %r refused: %s", expression, exc)
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED, SUBSCRIPTION_PARSE_FAILED_REMARK
            ) from None
    try:
        return TagFilter.parse(expression, expression_type)
    except FilterExpressionError as exc:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"{SUBSCRIPTION_PARSE_FAILED_REMARK}: {exc}"
        ) from None


class ConsumeHandlers(Handlers):
    """POP_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME,
    NOTIFICATION, POLLING_INFO, CONSUMER_SEND_MSG_BACK and the offset queries: what a
    consumer sends (the proxy's consumer processor and receive engine)."""

    # -- pop -----------------------------------------------------------------------------------

    def pop_message(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        h = PopMessageHeader.decode(cmd.ext_fields)
        group, topic, queue_id = h.consumer_group, h.topic, h.queue_id
        max_nums, invisible_time, poll_time = h.max_msg_nums, h.invisible_time, h.poll_time
        born_time = h.born_time or now_ms()
        if poll_time > 0 and now_ms() - born_time - poll_time > 500:
            # A RocketMQ broker answers with the header's numbers zeroed, no offset infos.
            return cmd.make_response(
                ResponseCode.POLLING_TIMEOUT,
                PopMessageResponseHeader().encode(),
                remark=f"the broker[{self.config.name}] pop message is timeout too much",
            )
        if max_nums > self.config.max_pop_batch:
            raise RequestError(
                BAD,
                f"the broker[{self.config.name}] pop message's num is greater than "
                f"{self.config.max_pop_batch}",
            )
        if max_nums <= 0:
            raise RequestError(BAD, f"maxMsgNums {max_nums} must be positive")
        if invisible_time <= 0:
            raise RequestError(BAD, f"invisibleTime {invisible_time} must be positive")
        if poll_time < 0:
            raise RequestError(BAD, f"pollTime {poll_time} must not be negative")
        config = self._topic(topic)
        self._read_queue(config, queue_id)
        self._group(group)
        request = PopRequest(
            group,
            topic,
            queue_id,
            max_nums,
            invisible_time,
            pop_filter(h.exp, h.exp_type),
            h.init_mode,
            self.groups.get(group).priority_factor,
        )

        def pop() -> PopResult:
            if h.order:
                return self.pop.pop_orderly(request, h.attempt_id)
            return self.pop.pop(request)

        result = pop()
        if result.message_count or poll_time <= 0:
            return self._pop_response(cmd, result)

        def on_wake(waiter: Waiter) -> None:
            again = pop()
            if again.message_count or not self.pops.park(waiter):
                waiter.future.set_result(self._pop_response(cmd, again))

        def on_timeout(waiter: Waiter) -> None:
            waiter.future.set_result(self._pop_response(cmd, pop()))

        return self._park(
            self.pops,
            (topic, group, queue_id),
            born_time + poll_time,
            on_wake,
            on_timeout,
            lambda: self._pop_full(cmd, result),
        )

    def _park(
        self,
        table: PollingTable,
        key: PollKey,
        deadline_ms: int,
        on_wake: Callable[[Waiter], None],
        on_timeout: Callable[[Waiter], None],
        when_full: Callable[[], RemotingCommand],
    ) -> Reply:
        future = self.loop.create_future()
        deadline = self.loop.time() + (deadline_ms - now_ms()) / 1000
        waiter = Waiter(key, future, deadline, on_wake, on_timeout)
        if not table.park(waiter):
            return when_full()
        return future

    def _pop_full(self, cmd: RemotingCommand, result: PopResult) -> RemotingCommand:
        response = self._pop_response(cmd, result)
        response.code = ResponseCode.POLLING_FULL
        return response

    def _pop_response(self, cmd: RemotingCommand, result: PopResult) -> RemotingCommand:
        fields = PopMessageResponseHeader(
            pop_time=result.pop_time,
            invisible_time=result.invisible_time,
            revive_qid=result.revive_qid,
            rest_num=result.rest_num,
            start_offset_info=join_info(
                [(retry_flag(q.topic), q.queue_id, str(q.start_offset)) for q in result.queues]
            ),
            msg_offset_info=join_info(
                [
                    (retry_flag(q.topic), q.queue_id, ",".join(map(str, q.offsets)))
                    for q in result.queues
                ]
            ),
            order_count_info=";".join(result.order_count_info) or None
            if result.order_count_info is not None
            else None,
        ).encode()
        if not result.queues:
            return cmd.make_response(ResponseCode.POLLING_TIMEOUT, fields, remark=NO_MESSAGE_REMARK)
        body = b"".join(record for q in result.queues for record in q.records)
        return cmd.make_response(OK, fields, body)

    # -- ack and invisible time ----------------------------------------------------------------

    def _checkpoint_target(
        self, h: AckMessageHeader | ChangeInvisibleTimeHeader
    ) -> tuple[str, str, int, PopCheckpointInfo, int]:
        """Check the fields acks and changes share; return the real topic."""
        group, topic, queue_id, offset = h.consumer_group, h.topic, h.queue_id, h.offset
        try:
            info = PopCheckpointInfo.parse(h.extra_info)
        except ValueError as exc:
            raise RequestError(BAD, f"bad extraInfo: {exc}") from None
        if retry_flag(topic) == 0:
            topic = topic_for_flag(info.retry, group, topic)
        config = self._topic(topic)
        if queue_id < 0:
            queue_id = -2  # -1 means "any" only for pops
        self._read_queue(config, queue_id, ResponseCode.MESSAGE_ILLEGAL)
        return group, topic, queue_id, info, offset

    def ack_message(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = AckMessageHeader.decode(cmd.ext_fields)
        if h.lite_topic:
            self._read_queue(self._topic(h.topic), h.queue_id, ResponseCode.MESSAGE_ILLEGAL)
            return self.lite_handlers.ack(cmd, h)
        group, topic, queue_id, info, offset = self._checkpoint_target(h)
        low, high = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
        if not low <= offset <= high:
            raise RequestError(
                ResponseCode.NO_MESSAGE,
                f"offset is illegal, key:{topic}@{queue_id}, commit:{offset}, store:{low}~{high}",
            )
        if info.revive_qid == POP_ORDER_REVIVE_QUEUE:
            self._ack_orderly(group, topic, queue_id, offset, info.pop_time)
        else:
            self.pop.ack(info, group, topic, offset)
        return cmd.make_response(OK)

    def _ack_orderly(
        self, group: str, topic: str, queue_id: int, offset: int, pop_time: int
    ) -> None:
        done = self.pop.ack_orderly(group, topic, queue_id, offset, pop_time)
        if done is None:
            raise RequestError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"offset is illegal, key:{topic}@{group}@{queue_id}, commit:{offset}",
            )
        if done:  # the queue is free: a parked orderly pop or probe may take it now
            self.pops.wake(topic, queue_id, group)
            self.notifications.wake(topic, queue_id, group)

    def change_invisible_time(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand:
        h = ChangeInvisibleTimeHeader.decode(cmd.ext_fields)
        if h.lite_topic:
            self._read_queue(self._topic(h.topic), h.queue_id, ResponseCode.MESSAGE_ILLEGAL)
            return self.lite_handlers.change_invisible_time(cmd, h)
        group, topic, queue_id, info, offset = self._checkpoint_target(h)
        invisible_time = h.invisible_time
        if invisible_time < 0:
            raise RequestError(BAD, f"invisibleTime {invisible_time} must not be negative")
        low, high = self.store.min_offset(topic, queue_id), self.store.max_offset(topic, queue_id)
        if not low <= offset < high:
            raise RequestError(ResponseCode.NO_MESSAGE, f"offset {offset} outside {low}~{high}")
        if info.revive_qid == POP_ORDER_REVIVE_QUEUE:
            changed = self.pop.change_orderly(
                group, topic, queue_id, offset, info.pop_time, invisible_time
            )
            if changed is None:  # already committed: RocketMQ answers OK without a header
                return cmd.make_response(OK)
            answer = ChangeInvisibleTimeResponseHeader(info.pop_time, changed, info.revive_qid)
            return cmd.make_response(OK, answer.encode())
        ck = self.pop.change_invisible_time(info, group, topic, offset, invisible_time)
        answer = ChangeInvisibleTimeResponseHeader(ck.pop_time, ck.invisible_time, ck.revive_qid)
        return cmd.make_response(OK, answer.encode())

    def batch_ack_message(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        try:  # read as a broker's fastjson2 reads it: a key written twice, its last value
            body = fastjson.loads(cmd.body) if cmd.body else {}
            acks = body.get("acks") or []
        except (fastjson.FastjsonError, AttributeError):
            raise RequestError(BAD, "the batch ack body is not JSON") from None
        if not acks:
            return cmd.make_response(ResponseCode.NO_MESSAGE)
        for entry in acks:
            try:
                ack = BatchAck.from_json(entry)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise RequestError(BAD, f"bad batch ack entry {entry!r}: {exc}") from None
            group, topic, queue_id = ack.consumer_group, ack.topic, ack.queue_id
            real_topic = topic if retry_flag(topic) else topic_for_flag(ack.retry, group, topic)
            info = PopCheckpointInfo(
                ack.start_offset, ack.pop_time, ack.invisible_time, 0, ack.retry,
                self.config.name, queue_id, 0,
            )  # fmt: skip
            for offset in ack.offsets():
                if ack.revive_queue_id == POP_ORDER_REVIVE_QUEUE:
                    self._ack_orderly(group, real_topic, queue_id, offset, ack.pop_time)
                else:
                    self.pop.ack(info, group, real_topic, offset)
        return cmd.make_response(OK)

    # -- notification --------------------------------------------------------------------------

    def notification(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        h = NotificationHeader.decode(cmd.ext_fields)
        group, topic, queue_id, poll_time = h.consumer_group, h.topic, h.queue_id, h.poll_time
        born_time = h.born_time or now_ms()
        self._read_queue(self._topic(topic), queue_id)
        self._group(group)

        def answer(has_msg: bool, full: bool = False) -> RemotingCommand:
            return cmd.make_response(OK, NotificationResponseHeader(has_msg, full).encode())

        has_msg = self.pop.has_message(group, topic, queue_id, order=h.order)
        if has_msg or poll_time <= 0:
            return answer(has_msg)
        return self._park(
            self.notifications,
            (topic, group, queue_id),
            born_time + poll_time,
            lambda w: w.future.set_result(answer(True)),
            lambda w: w.future.set_result(answer(False)),
            lambda: answer(False, full=True),
        )

    def polling_info(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """``pollingNum`` as RocketMQ answers it; ``parkedPops`` and ``parkedNotifications``
        (the whole broker's totals) are the stub's own additions, for benchmarks."""
        h = PollingInfoHeader.decode(cmd.ext_fields)
        group, topic, queue_id = h.consumer_group, h.topic, h.queue_id
        self._read_queue(self._topic(topic), queue_id)
        self._group(group)
        fields = {
            **PollingInfoResponseHeader(self.pops.count(topic, group, queue_id)).encode(),
            "parkedPops": str(self.pops.size),
            "parkedNotifications": str(self.notifications.size),
        }
        return cmd.make_response(OK, fields)

    # -- send back (dead-letter queue) ---------------------------------------------------------

    def send_back(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """CONSUMER_SEND_MSG_BACK: the DLQ when the delay level is negative or the attempts
        are spent (the header's maxReconsumeTimes, else the group's retryMaxTimes), else
        ``%RETRY%<group>`` after a delay, as a RocketMQ broker decides."""
        h = ConsumerSendMsgBackHeader.decode(cmd.ext_fields)
        group = h.group
        self._group(group)
        msg = self.store.message_at(h.offset)
        if msg is None:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "look message by offset failed")
        origin_topic = h.origin_topic or msg.properties.get(Prop.REAL_TOPIC, msg.topic)
        max_times = h.max_reconsume_times
        if max_times is None:
            max_times = self.groups.get(group).retry_max_times
        self.pop.send_back(msg, group, origin_topic, h.delay_level, max_times)
        return cmd.make_response(OK)

    # -- offsets and consumers -----------------------------------------------------------------

    def consumer_list(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return cmd.make_response(OK, body=b'{"consumerIdList":[]}')

    def query_consumer_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand:
        return cmd.make_response(
            ResponseCode.QUERY_NOT_FOUND, remark="Not found, maybe this group consumer boot first"
        )

    def consume_stats(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_CONSUME_STATS: each queue's end offset and the group's pop offset."""
        h = ConsumeStatsHeader.decode(cmd.ext_fields)
        config = self._topic(h.topic)
        queues = [
            (qid, self.store.max_offset(h.topic, qid),
             self.pop.consumed_offset(h.consumer_group, h.topic, qid))
            for qid in range(config.read_queue_nums)
        ]  # fmt: skip
        body = consume_stats_body(self.config.name, h.topic, queues)
        return cmd.make_response(OK, body=body)

    def consume_time_span(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """QUERY_CONSUME_TIME_SPAN: per queue, the first and last store times, the last
        consumed message's and, where the group is behind, the age of the message at its
        offset (``delayTime``), as a RocketMQ broker computes them."""
        h = ConsumeTimeSpanHeader.decode(cmd.ext_fields)
        config = self._topic(h.topic)
        now = int(time.time() * 1000)
        spans = []
        for qid in range(config.write_queue_nums):
            low, high = self.store.min_offset(h.topic, qid), self.store.max_offset(h.topic, qid)
            mine = self.pop.consumed_offset(h.group, h.topic, qid)

            def stored(offset: int, qid: int = qid) -> int:
                message = self.store.message(h.topic, qid, offset)
                return message.store_timestamp if message is not None else 0

            spans.append({
                "messageQueue": {"brokerName": self.config.name, "queueId": qid,
                                 "topic": h.topic},
                "minTimeStamp": stored(low) if high > low else 0,
                "maxTimeStamp": stored(high - 1) if high > low else 0,
                "consumeTimeStamp": stored(mine - 1) if mine > 0 else 0,
                "delayTime": now - stored(mine) if low <= mine < high else 0,
            })  # fmt: skip
        body = orjson.dumps({"consumeTimeSpanSet": spans}, option=orjson.OPT_SORT_KEYS)
        return cmd.make_response(OK, body=body)

    def max_offset(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd.ext_fields)
        offset = self.store.max_offset(h.topic, h.queue_id)
        return cmd.make_response(OK, OffsetResponseHeader(offset).encode())

    def min_offset(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd.ext_fields)
        offset = self.store.min_offset(h.topic, h.queue_id)
        return cmd.make_response(OK, OffsetResponseHeader(offset).encode())
