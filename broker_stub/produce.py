"""The produce family of a broker's request handlers: sends, transactions, recalls."""

from __future__ import annotations

import logging
import random

from broker_stub.handlers import RequestError
from broker_stub.parts import BAD, OK, Handlers
from broker_stub.topics import topic_name_error
from proxy.message_types import MessageType, message_type_of
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand, RemotingProtocolError
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import (
    EndTransactionHeader,
    RecallMessageHeader,
    RecallMessageResponseHeader,
    SendMessageHeader,
    SendMessageResponseHeader,
    now_ms,
)
from proxy.remoting.lite import lmq_name
from proxy.remoting.message import (
    SYSFLAG_MULTI_TAGS,
    MessageExt,
    Prop,
    decode_batch,
    decode_properties,
    offset_message_id,
)
from proxy.remoting.recall import RecallHandle, RecallHandleError

log = logging.getLogger(__name__)


class ProduceHandlers(Handlers):
    """SEND_MESSAGE (V2, batch), END_TRANSACTION, RECALL_MESSAGE and HEART_BEAT: what a
    producer sends (the proxy's producer processor)."""

    # -- send ----------------------------------------------------------------------------------

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

    # -- transactions, recall and heartbeats ---------------------------------------------------

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
