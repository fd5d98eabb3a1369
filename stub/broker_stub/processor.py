"""The broker's request handlers, one method per request code.

Handlers answer synchronously where they can; only a parked long poll returns a future.
Validation follows RocketMQ's broker: the codes and remarks a RocketMQ client expects.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence

import orjson

from broker_stub.config import BrokerConfig
from broker_stub.groups import GroupConfig, GroupTable
from broker_stub.handlers import RequestError, dispatch
from broker_stub.lite import LiteService
from broker_stub.lite_handlers import LiteHandlers, RouteLookup
from broker_stub.polling import PollingTable, PollKey, Waiter
from broker_stub.pop import POP_ORDER_REVIVE_QUEUE, PopRequest, PopResult, PopService
from broker_stub.store import MessageStore
from broker_stub.timers import DeliveryScheduler
from broker_stub.topics import (
    TopicConfig,
    TopicTable,
    alter_attributes,
    group_name_error,
    topic_name_error,
)
from broker_stub.transactions import TransactionService
from proxy.message_types import MessageType, message_type_of
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand, RemotingProtocolError
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.filter import FilterExpressionError, TagFilter
from proxy.remoting.headers import (
    AckMessageHeader,
    ChangeInvisibleTimeHeader,
    ChangeInvisibleTimeResponseHeader,
    ConsumerSendMsgBackHeader,
    CreateTopicHeader,
    EndTransactionHeader,
    GroupHeader,
    NotificationHeader,
    NotificationResponseHeader,
    OffsetResponseHeader,
    PollingInfoHeader,
    PollingInfoResponseHeader,
    PopMessageHeader,
    PopMessageResponseHeader,
    QueueOffsetHeader,
    RecallMessageHeader,
    RecallMessageResponseHeader,
    SendMessageHeader,
    SendMessageResponseHeader,
    TopicHeader,
    now_ms,
)
from proxy.remoting.lite import lmq_name
from proxy.remoting.message import (
    SYSFLAG_MULTI_TAGS,
    MessageExt,
    Prop,
    UniqueIdGenerator,
    decode_batch,
    decode_properties,
    offset_message_id,
)
from proxy.remoting.popinfo import (
    BatchAck,
    PopCheckpointInfo,
    join_info,
    retry_flag,
    topic_for_flag,
)
from proxy.remoting.recall import RecallHandle, RecallHandleError
from proxy.remoting.server import Reply

log = logging.getLogger(__name__)

OK = ResponseCode.SUCCESS
BAD = ResponseCode.INVALID_PARAMETER
NO_MESSAGE_REMARK = "NO_MESSAGE_IN_QUEUE"


class BrokerProcessor:
    """Serves the requests of one broker."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        topics: TopicTable,
        pop: PopService,
        pops: PollingTable,
        notifications: PollingTable,
        scheduler: DeliveryScheduler,
        transactions: TransactionService | None = None,
        route: RouteLookup | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.pop = pop
        self.pops = pops
        self.notifications = notifications
        self.scheduler = scheduler
        self.loop = pop.loop
        self.transactions = transactions or TransactionService(
            store,
            scheduler,
            pop.loop,
            check_interval_ms=config.transaction_check_interval_ms,
            timeout_ms=config.transaction_timeout_ms,
            check_max=config.transaction_check_max,
        )
        self.groups = GroupTable(config.max_reconsume_times)
        # Lite topics (RocketMQ 5.5): parked lite pops wait per client, not per queue.
        self.lite_polls = PollingTable(pop.loop, config.polling_per_key, config.polling_total)
        self.lite = LiteService(
            store, pop, self.groups, self.lite_polls, pop.loop,
            max_subscriptions=config.max_lite_subscriptions,
        )  # fmt: skip
        self.lite_handlers = LiteHandlers(
            config, store, topics, self.groups, pop, self.lite, self.lite_polls, route
        )
        self.ids = UniqueIdGenerator(config.address.rpartition(":")[0])
        self.handlers: dict[int, Callable[[RemotingCommand, RemotingConnection], Reply]] = {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.POP_MESSAGE: self.pop_message,
            RequestCode.ACK_MESSAGE: self.ack_message,
            RequestCode.BATCH_ACK_MESSAGE: self.batch_ack_message,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME: self.change_invisible_time,
            RequestCode.NOTIFICATION: self.notification,
            RequestCode.POLLING_INFO: self.polling_info,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.send_back,
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.RECALL_MESSAGE: self.recall_message,
            RequestCode.UNREGISTER_CLIENT: self.ok,
            RequestCode.CHECK_CLIENT_CONFIG: self.ok,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.ok,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.create_group,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_TOPIC_CONFIG: self.topic_config,
            RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG: self.group_config,
            RequestCode.POP_LITE_MESSAGE: self.lite_handlers.pop_lite,
            RequestCode.LITE_SUBSCRIPTION_CTL: self.lite_handlers.subscription_ctl,
            RequestCode.GET_BROKER_LITE_INFO: self.lite_handlers.broker_lite_info,
            RequestCode.UPDATE_BROKER_CONFIG: self.update_broker_config,
        }
        self.started_ms = now_ms()

    @property
    def store_host(self) -> tuple[str, int]:
        """This broker's advertised address, as stored in messages (the port is known only
        once the server has bound it)."""
        return (self.config.address.rpartition(":")[0], self.config.port)

    def __call__(self, cmd: RemotingCommand, conn: RemotingConnection) -> Reply:
        return dispatch(self.handlers, cmd, conn)

    # -- shared checks --------------------------------------------------------------------

    def _topic(self, topic: str) -> TopicConfig:
        error = topic_name_error(topic)
        if error:
            raise RequestError(BAD, error)
        config = self.topics.get(topic)
        if config is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        return config

    def _read_queue(self, config: TopicConfig, queue_id: int, code: int = BAD) -> None:
        if queue_id < -1 or queue_id >= config.read_queue_nums:
            raise RequestError(
                code,
                f"queueId[{queue_id}] is illegal, topic:[{config.name}] "
                f"topicConfig.readQueueNums:[{config.read_queue_nums}] broker:[{self.config.name}]",
            )

    @staticmethod
    def _group(group: str) -> None:
        error = group_name_error(group)
        if error:
            raise RequestError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, error)

    # -- send -----------------------------------------------------------------------------

    def send_message(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = SendMessageHeader.decode(cmd.ext_fields)
        topic = h.topic
        error = topic_name_error(topic)
        if error:
            raise RequestError(BAD, error)
        config = self.topics.get(topic)
        if config is None:
            if not self.config.auto_create_topics:
                raise RequestError(
                    ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
                )
            config = self.topics.create(topic)
        queue_id = h.queue_id
        if queue_id >= config.write_queue_nums:
            raise RequestError(
                BAD,
                f"request queueId[{queue_id}] is illegal, {topic} "
                f"writeQueueNums:[{config.write_queue_nums}] Producer:[{conn.peer}]",
            )
        if queue_id < 0:
            queue_id = random.randrange(config.write_queue_nums)
        born_timestamp = h.born_timestamp or now_ms()
        batch = h.batch or cmd.code == RequestCode.SEND_BATCH_MESSAGE
        header_props = decode_properties(h.properties)
        if not batch:
            queue_id = _priority_queue(header_props, queue_id, config.write_queue_nums)
        if batch:
            try:
                entries = decode_batch(cmd.body)
            except RemotingProtocolError as exc:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}") from None
            if not entries:
                raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
            bodies = [(e.body, {**header_props, **e.properties}, e.flag) for e in entries]
        else:
            bodies = [(cmd.body, header_props, h.flag)]
        born_host = _host(conn.peer)
        store_host = self.store_host
        messages = []
        for body, props, flag in bodies:
            if len(body) > self.config.max_message_size:
                raise RequestError(
                    ResponseCode.MESSAGE_ILLEGAL,
                    f"the message body size over max value, MAX: {self.config.max_message_size}",
                )
            props = dict(props)
            props.setdefault(Prop.UNIQ_KEY, self.ids.next_id())
            if props.get(Prop.LITE_TOPIC):
                # Also indexed in the lite topic's LMQ (store.put), whatever the topic's type.
                lmq = lmq_name(topic, props[Prop.LITE_TOPIC])
                if (
                    self.config.lmq_quota
                    and not self.store.has_queue(lmq, 0)
                    and self.lite.lmq_count >= self.config.max_lmq_queues
                ):  # HookUtils.handleLmqQuota: no new LMQ past maxLmqConsumeQueueNum
                    raise RequestError(
                        ResponseCode.LMQ_QUOTA_EXCEEDED,
                        "[LMQ_CONSUME_QUEUE_NUM_EXCEEDED]lmq consume queue num exceeded.",
                    )
                props[Prop.INNER_MULTI_DISPATCH] = lmq
            props[Prop.CLUSTER] = self.config.cluster
            messages.append(
                MessageExt(
                    topic=topic,
                    body=body,
                    properties=props,
                    queue_id=queue_id,
                    flag=flag,
                    sys_flag=h.sys_flag & ~SYSFLAG_MULTI_TAGS,
                    born_timestamp=born_timestamp,
                    born_host=born_host,
                    store_host=store_host,
                    reconsume_times=h.reconsume_times,
                )
            )
        half = not batch and messages[0].properties.get(Prop.TRANSACTION_PREPARED) == "true"
        if half:
            results = [self.transactions.put_half(messages[0])]
        else:
            results = [self.scheduler.put(msg) for msg in messages]
        first = messages[0]
        recall_handle = None
        due = (
            None if batch or half else self.scheduler.due_ms(topic, first.properties[Prop.UNIQ_KEY])
        )
        if due is not None and not topic.startswith("%RETRY%"):
            # RocketMQ 5.3.2+: a timed message can be recalled before its time.
            recall_handle = RecallHandle(
                topic, self.config.name, due + 1, first.properties[Prop.UNIQ_KEY]
            ).encode()
        answer = SendMessageResponseHeader(
            msg_id=",".join(offset_message_id(store_host, r.physical_offset) for r in results),
            queue_id=first.queue_id,
            queue_offset=results[0].queue_offset,
            transaction_id=first.properties[Prop.UNIQ_KEY],
            recall_handle=recall_handle,
        )
        # Two more fields a RocketMQ broker sends with every send answer.
        fields = {**answer.encode(), "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return cmd.make_response(OK, fields)

    # -- transactions and recall ----------------------------------------------------------

    def heartbeat(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        self.transactions.heartbeat(cmd.body, conn)
        return cmd.make_response(OK)

    def end_transaction(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = EndTransactionHeader.decode(cmd.ext_fields)
        if not self.transactions.end(h):
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"no half message at commit log offset {h.commit_log_offset}",
            )
        return cmd.make_response(OK)

    def recall_message(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = RecallMessageHeader.decode(cmd.ext_fields)
        if not self.config.recall_message_enable:
            raise RequestError(ResponseCode.NO_PERMISSION, "recall failed, operation is forbidden")
        if self.topics.get(h.topic) is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{h.topic}] not exist"
            )
        try:
            handle = RecallHandle.decode(h.recall_handle)
        except RecallHandleError as exc:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, str(exc)) from None
        if handle.topic != h.topic:
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker != self.config.name:
            raise RequestError(
                ResponseCode.ILLEGAL_OPERATION, "recall failed, broker service not available"
            )
        if handle.timestamp_ms <= now_ms():
            raise RequestError(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        # As a RocketMQ broker: a handle still in the future is recalled (a delete marker
        # there, the held message cancelled here), whether or not the message exists.
        self.scheduler.recall(h.topic, handle.msg_id)
        return cmd.make_response(OK, RecallMessageResponseHeader(msg_id=handle.msg_id).encode())

    # -- pop ------------------------------------------------------------------------------

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
        try:
            tag_filter = TagFilter.parse(h.exp, h.exp_type)
        except FilterExpressionError as exc:
            raise RequestError(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription failed: {exc}",
            ) from None
        request = PopRequest(
            group,
            topic,
            queue_id,
            max_nums,
            invisible_time,
            tag_filter,
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

    # -- ack and invisible time -------------------------------------------------------------

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
        try:
            body = orjson.loads(cmd.body) if cmd.body else {}
            acks = body.get("acks") or []
        except (orjson.JSONDecodeError, AttributeError):
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

    # -- notification ---------------------------------------------------------------------

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

    # -- send back (dead-letter queue) ------------------------------------------------------

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

    # -- the rest a client sends on start-up or as admin -------------------------------------

    def ok(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return cmd.make_response(OK)

    def consumer_list(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        return cmd.make_response(OK, body=b'{"consumerIdList":[]}')

    def query_consumer_offset(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand:
        return cmd.make_response(
            ResponseCode.QUERY_NOT_FOUND, remark="Not found, maybe this group consumer boot first"
        )

    def max_offset(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd.ext_fields)
        offset = self.store.max_offset(h.topic, h.queue_id)
        return cmd.make_response(OK, OffsetResponseHeader(offset).encode())

    def min_offset(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = QueueOffsetHeader.decode(cmd.ext_fields)
        offset = self.store.min_offset(h.topic, h.queue_id)
        return cmd.make_response(OK, OffsetResponseHeader(offset).encode())

    def create_topic(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        h = CreateTopicHeader.decode(cmd.ext_fields)
        topic = h.topic
        error = topic_name_error(topic)
        if error:
            raise RequestError(BAD, error)
        nums = self.config.default_queue_nums if h.read_queue_nums is None else h.read_queue_nums
        write_nums = nums if h.write_queue_nums is None else h.write_queue_nums
        for n in (nums, write_nums):
            if not 1 <= n <= 1024:
                raise RequestError(BAD, f"queue count {n} outside 1..1024")
        current = self.topics.get(topic)
        try:
            attributes = alter_attributes(current.attributes if current else {}, h.attributes)
        except ValueError as exc:
            raise RequestError(BAD, str(exc)) from None
        self.topics.create(topic, nums, h.perm, write_nums, attributes)
        return cmd.make_response(OK)

    def create_group(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: body = SubscriptionGroupConfig JSON."""
        try:
            body = orjson.loads(cmd.body)
            name = str(body["groupName"])
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            raise RequestError(BAD, "the body is not a SubscriptionGroupConfig") from None
        current = self.groups.find(name)
        try:
            config = GroupConfig.from_json(
                body, self.config.max_reconsume_times, current.attributes if current else None
            )
        except (TypeError, KeyError, AttributeError):
            raise RequestError(BAD, "the body is not a SubscriptionGroupConfig") from None
        except ValueError as exc:
            # A RocketMQ broker lets AttributeUtil's exception reach the remoting layer.
            # (Its remark goes on with the Java stack frame, which the stub has not.)
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"java.lang.RuntimeException: {exc}"
            ) from None
        self._group(config.name)
        self.groups.put(config)
        return cmd.make_response(OK)

    def group_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_SUBSCRIPTIONGROUP_CONFIG: the group's SubscriptionGroupConfig JSON; a group
        never configured gets the defaults, as a broker with autoCreateSubscriptionGroup."""
        group = GroupHeader.decode(cmd.ext_fields).group
        self._group(group)
        config = self.groups.get(group)
        return cmd.make_response(OK, body=orjson.dumps(config.to_json()))

    def update_broker_config(
        self, cmd: RemotingCommand, conn: RemotingConnection
    ) -> RemotingCommand:
        """UPDATE_BROKER_CONFIG: a properties body (``key=value`` lines). The stub acts on
        ``maxLiteSubscriptionCount``, ``maxLmqConsumeQueueNum`` and ``enableLmqQuota``; like
        a RocketMQ broker, which sets whatever field matches, it takes other keys without
        complaint (and ignores them)."""
        text = cmd.body.decode("utf-8", "replace") if cmd.body else ""
        for line in text.splitlines():
            key, sep, value = (part.strip() for part in line.partition("="))
            if not sep:
                continue
            if key == "enableLmqQuota":
                self.config.lmq_quota = value.lower() == "true"
            elif key in ("maxLiteSubscriptionCount", "maxLmqConsumeQueueNum"):
                try:
                    number = int(value)
                except ValueError:
                    raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad {line!r}") from None
                if key == "maxLiteSubscriptionCount":
                    self.lite.max_subscriptions = number
                else:
                    self.config.max_lmq_queues = number
        return cmd.make_response(OK)

    def runtime_info(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO: a KVTable of the figures ``mqadmin clusterList`` prints
        (the stub measures none of the rates: zeros)."""
        earliest = min(
            (m.store_timestamp for m in self._first_messages() if m is not None),
            default=0,
        )
        table = {
            "brokerVersionDesc": "V5_3_3",
            "brokerVersion": "479",
            "brokerActive": "true",
            "bootTimestamp": str(self.started_ms),
            "putTps": "0.0 0.0 0.0",
            "getTransferredTps": "0.0 0.0 0.0",
            "sendThreadPoolQueueSize": "0",
            "pullThreadPoolQueueSize": "0",
            "ackThreadPoolQueueSize": "0",
            "sendThreadPoolQueueHeadWaitTimeMills": "0",
            "pullThreadPoolQueueHeadWaitTimeMills": "0",
            "ackThreadPoolQueueHeadWaitTimeMills": "0",
            "pageCacheLockTimeMills": "0",
            "earliestMessageTimeStamp": str(earliest),
            "commitLogDiskRatio": "0.0",
            "msgPutTotalYesterdayMorning": "0",
            "msgPutTotalTodayMorning": "0",
            "msgPutTotalTodayNow": str(self.store.commit_log_count),
            "msgGetTotalYesterdayMorning": "0",
            "msgGetTotalTodayMorning": "0",
            "msgGetTotalTodayNow": "0",
            "timerReadBehind": "0",
            "timerOffsetBehind": "0",
            "timerCongestNum": "0",
            "timerEnqueueTps": "0.0",
            "timerDequeueTps": "0.0",
        }
        return cmd.make_response(OK, body=orjson.dumps({"table": table}))

    def _first_messages(self) -> Iterator[MessageExt | None]:
        for config in self.topics.all():
            for qid in range(config.read_queue_nums):
                if self.store.max_offset(config.name, qid) > 0:
                    yield self.store.message(
                        config.name, qid, self.store.min_offset(config.name, qid)
                    )

    def topic_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_TOPIC_CONFIG (admin tools read it before the stats): TopicConfig JSON."""
        config = self._topic(TopicHeader.decode(cmd.ext_fields).topic)
        return cmd.make_response(OK, body=orjson.dumps(config.to_json()))

    def topic_stats(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        """GET_TOPIC_STATS_INFO: min and max offset and last store time of each queue
        (TopicStatsTable, keyed by MessageQueue as fastjson writes it)."""
        topic = TopicHeader.decode(cmd.ext_fields).topic
        config = self._topic(topic)
        entries = []
        for qid in range(config.write_queue_nums):
            low, high = self.store.min_offset(topic, qid), self.store.max_offset(topic, qid)
            last = self.store.message(topic, qid, high - 1) if high > low else None
            entries.append(
                (
                    {"brokerName": self.config.name, "queueId": qid, "topic": topic},
                    {
                        "lastUpdateTimestamp": last.store_timestamp if last else 0,
                        "maxOffset": high,
                        "minOffset": low,
                    },
                )
            )
        body = b'{"offsetTable":' + _fastjson_map(entries) + b',"topicPutTps":0.0}'
        return cmd.make_response(OK, body=body)

    def all_topic_config(self, cmd: RemotingCommand, conn: RemotingConnection) -> RemotingCommand:
        body = {
            "dataVersion": {
                "counter": self.topics.version,
                "stateVersion": 0,
                "timestamp": now_ms(),
            },
            "topicConfigTable": {t.name: t.to_json() for t in self.topics.all()},
        }
        return cmd.make_response(OK, body=orjson.dumps(body))


def _fastjson_map(entries: Sequence[tuple[Mapping[str, object], Mapping[str, object]]]) -> bytes:
    """A JSON-like map with object keys, as fastjson writes a ``Map<MessageQueue, ...>``:
    ``{{"brokerName":..,"queueId":0,"topic":..}:{...}}``. Not valid JSON, but what a Java
    admin client parses (and what a RocketMQ broker sends)."""
    parts = [orjson.dumps(key, option=orjson.OPT_SORT_KEYS) + b":" + orjson.dumps(
        value, option=orjson.OPT_SORT_KEYS) for key, value in entries]  # fmt: skip
    return b"{" + b",".join(parts) + b"}"


def _host(peer: str) -> tuple[str, int]:
    host, _, port = peer.rpartition(":")
    return (host or "127.0.0.1", int(port) if port.isdigit() else 0)


def _priority_queue(props: dict[str, str], queue_id: int, write_queue_nums: int) -> int:
    """The queue of a priority message, as a 5.5.0 broker picks it (SendMessageProcessor):
    a message of type PRIORITY (not FIFO, delayed or transactional too) goes to queue
    min(priority, writeQueueNums - 1) of any topic; from the others the broker drops the
    priority. The topic's own type is not looked at."""
    try:
        priority = int(props.get(Prop.PRIORITY, "-1"))
    except ValueError:
        priority = -1
    if priority < 0:
        return queue_id
    if message_type_of(props) is MessageType.PRIORITY:
        return min(priority, write_queue_nums - 1)
    del props[Prop.PRIORITY]
    return queue_id
