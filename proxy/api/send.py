"""SendMessage: validate each message, translate it into broker properties, and report
what the producer processor did with it, one entry per message."""

from __future__ import annotations

import time

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.convert import decoded_body
from proxy.api.errors import ApiError, Code, code_name, ok, recall_error, send_error
from proxy.api.route import topic_route
from proxy.api.transaction import encode_transaction_id
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import BrokerPool, TopicRoute
from proxy.message_types import accepts, message_type_of
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.producer import ProducerProcessor, SendFailure
from proxy.processor.transaction import HalfMessageRef
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE
from proxy.remoting.message import Prop, UniqueIdGenerator
from proxy.remoting.recall import RecallHandle, RecallHandleError

# The longest orphaned-transaction recovery time a producer may ask for (the Apache proxy's
# maxTransactionRecoverySecond default).
MAX_TRANSACTION_RECOVERY_S = 3600


class SendActivity:
    def __init__(
        self,
        pool: BrokerPool,
        producer: ProducerProcessor,
        metrics: ProxyMetrics,
        max_body_bytes: int,
        max_lite_topic_size: int = 64,
    ) -> None:
        self.pool = pool
        self.producer = producer
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_lite_topic_size = max_lite_topic_size
        self._ids = UniqueIdGenerator()

    async def send_message(
        self, request: api.SendMessageRequest, context: Context
    ) -> api.SendMessageResponse:
        if not request.messages:
            raise ApiError(Code.BAD_REQUEST, "no message to send")
        topic = check.validate_topic(request.messages[0].topic.name)
        if any(m.topic.name != topic for m in request.messages):
            raise ApiError(Code.BAD_REQUEST, "messages of one request must share a topic")
        route = await topic_route(self.pool, topic)
        if not route.writable:
            raise ApiError(Code.FORBIDDEN, f"no broker accepts writes to {topic!r}")
        entries = [await self._send_one(route, message) for message in request.messages]
        codes = {e.status.code for e in entries}
        status = (
            entries[0].status
            if len(codes) == 1
            else pb.Status(code=Code.MULTIPLE_RESULTS, message="messages have different results")
        )
        return api.SendMessageResponse(status=status, entries=entries)

    async def _send_one(self, route: TopicRoute, message: pb.Message) -> api.SendResultEntry:
        system = message.system_properties
        half = system.message_type == pb.MessageType.TRANSACTION
        try:
            properties = self._properties(message)
            if half:
                # The producer group of a gRPC producer is its topic, as in the Apache proxy:
                # the broker's check of this half message goes to a producer of the topic.
                properties[Prop.TRANSACTION_PREPARED] = "true"
                properties[Prop.PRODUCER_GROUP] = route.topic
            self._check_type(route, properties)
            body = self._body(message)
            result = await self.producer.send(
                route,
                body,
                properties,
                producer_group=route.topic,
                sys_flag=TRANSACTION_PREPARED_TYPE if half else TRANSACTION_NOT_TYPE,
            )
        except SendFailure as failure:
            return self._failed(route.topic, system, send_error(failure.broker, failure.error))
        except ApiError as err:
            return self._failed(route.topic, system, err)
        self.metrics.sent(route.topic, code_name(Code.OK))
        msg_id = properties[Prop.UNIQ_KEY]
        transaction_id = msg_id
        if half:
            transaction_id = encode_transaction_id(
                HalfMessageRef(result.broker, result.commit_log_offset, result.queue_offset, msg_id)
            )
        return api.SendResultEntry(
            status=ok(),
            message_id=msg_id,
            transaction_id=transaction_id,
            offset=result.queue_offset,
            recall_handle=result.recall_handle or "",
        )

    async def recall_message(
        self, request: api.RecallMessageRequest, context: Context
    ) -> api.RecallMessageResponse:
        """Take back a timed message before its time, on the broker its handle names."""
        topic = check.validate_topic(request.topic.name)
        try:
            handle = RecallHandle.decode(request.recall_handle)
        except RecallHandleError as exc:
            raise ApiError(Code.BAD_REQUEST, str(exc)) from None
        client = await self.pool.broker_by_name(handle.broker, topic)
        if client is None:
            raise ApiError(Code.BAD_REQUEST, f"broker {handle.broker!r} does not serve {topic!r}")
        try:
            msg_id = await client.recall(topic, topic, request.recall_handle)
        except RemotingError as exc:
            raise recall_error(handle.broker, exc) from None
        return api.RecallMessageResponse(status=ok(), message_id=msg_id or handle.msg_id)

    def _failed(
        self, topic: str, system: pb.SystemProperties, err: ApiError
    ) -> api.SendResultEntry:
        self.metrics.sent(topic, code_name(err.code))
        return api.SendResultEntry(status=err.status, message_id=system.message_id)

    def _body(self, message: pb.Message) -> bytes:
        body = decoded_body(message)
        if not body:
            raise ApiError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
        if len(body) > self.max_body_bytes:
            raise ApiError(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"body of {len(body)} bytes exceeds {self.max_body_bytes}",
            )
        return body

    @staticmethod
    def _check_type(route: TopicRoute, properties: dict[str, str]) -> None:
        """Refuse a message its topic's type does not take, as the Apache proxy does
        (ProducerProcessor with DefaultTopicMessageTypeValidator; the broker checks nothing).
        Clients check the route's accepted types first: this catches the rest."""
        message_type = message_type_of(properties)
        if not accepts(route.message_type, message_type):
            raise ApiError(
                Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {route.topic} takes {route.message_type.value or 'untyped'} messages, "
                f"not {message_type.value}",
            )

    def _properties(self, message: pb.Message) -> dict[str, str]:
        system = message.system_properties
        props = check.validate_user_properties(dict(message.user_properties))
        if system.HasField("tag"):
            props[Prop.TAGS] = check.validate_tag(system.tag)
        if system.keys:
            props[Prop.KEYS] = " ".join(check.validate_keys(system.keys))
        props[Prop.UNIQ_KEY] = system.message_id or self._ids.next_id()
        if system.HasField("message_group"):
            props[Prop.SHARDING_KEY] = system.message_group
        if system.HasField("lite_topic"):
            props[Prop.LITE_TOPIC] = check.validate_lite_topic(
                system.lite_topic, self.max_lite_topic_size
            )
        if system.HasField("delivery_timestamp"):
            stamp = system.delivery_timestamp
            deliver_ms = stamp.seconds * 1000 + stamp.nanos // 1_000_000  # unchecked range
            if deliver_ms - int(time.time() * 1000) > check.MAX_DELIVERY_DELAY_MS:
                raise ApiError(Code.ILLEGAL_DELIVERY_TIME, "delivery time is more than 24 h away")
            props[Prop.TIMER_DELIVER_MS] = str(deliver_ms)
        if system.HasField("priority"):
            # Set whenever given, as the Apache proxy does (Message.setPriority); the broker
            # drops it again from a FIFO, delayed or transactional message.
            if system.priority < 0:
                raise ApiError(Code.BAD_REQUEST, "priority must be 0 or more")
            props[Prop.PRIORITY] = str(system.priority)
        if system.message_type == pb.MessageType.TRANSACTION and system.HasField(
            "orphaned_transaction_recovery_duration"
        ):
            seconds = system.orphaned_transaction_recovery_duration.seconds
            if seconds > MAX_TRANSACTION_RECOVERY_S:
                raise ApiError(
                    Code.BAD_REQUEST,
                    f"orphaned transaction recovery is at most {MAX_TRANSACTION_RECOVERY_S} s",
                )
            props[Prop.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
        return props
