"""SendMessage: validate each message, translate it into broker properties, and report
what the producer processor did with it, one entry per message."""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.convert import decoded_body
from proxy.api.errors import (
    PROCESSOR_ERROR,
    ApiError,
    Code,
    code_name,
    ok,
    recall_error,
    send_error,
)
from proxy.api.route import topic_route
from proxy.api.transaction import encode_transaction_id
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import BrokerPool, TopicRoute
from proxy.config import LimitsConfig
from proxy.message_types import accepts, message_type_of
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.producer import ProducerProcessor, SendFailure
from proxy.processor.transaction import HalfMessageRef
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import TRANSACTION_NOT_TYPE, TRANSACTION_PREPARED_TYPE
from proxy.remoting.message import Prop
from proxy.remoting.recall import RecallHandle, RecallHandleError
from proxy.security.front import peer_address


class SendActivity:
    def __init__(
        self,
        pool: BrokerPool,
        producer: ProducerProcessor,
        metrics: ProxyMetrics,
        max_body_bytes: int,
        max_lite_topic_size: int,
        limits: LimitsConfig,
    ) -> None:
        self.pool = pool
        self.producer = producer
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_lite_topic_size = max_lite_topic_size
        self.limits = limits
        # The client's address behind a call's gRPC peer (the TLS front's, once it runs).
        self.address_of: Callable[[str], str] = peer_address

    async def send_message(
        self, request: api.SendMessageRequest, context: Context
    ) -> api.SendMessageResponse:
        if not request.messages:
            raise ApiError(Code.MESSAGE_CORRUPTED, "no message to send")
        first = request.messages[0].topic
        topic = check.validate_topic(first.name)
        # The whole Resource, its namespace too (which is otherwise not used), as the
        # Apache proxy compares them.
        if any(m.topic != first for m in request.messages):
            raise ApiError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        # Every message is checked before the topic's route is looked up, as the Apache
        # proxy builds them all first: bad input is told as such, even for a missing topic.
        built: list[tuple[bytes, dict[str, str]] | ApiError] = []
        client = self.address_of(context.peer())
        for message in request.messages:
            try:
                built.append((self._body(message), self._properties(message, client)))
            except ApiError as err:
                built.append(err)
        route = None
        if any(not isinstance(b, ApiError) for b in built):
            route = await topic_route(self.pool, topic)
            if not route.writable:
                raise ApiError(Code.FORBIDDEN, f"no broker accepts writes to {topic!r}")
        entries = []
        for message, message_built in zip(request.messages, built, strict=True):
            if isinstance(message_built, ApiError):
                entries.append(self._failed(topic, message.system_properties, message_built))
            else:
                assert route is not None
                entries.append(await self._send_one(route, message, *message_built))
        codes = {e.status.code for e in entries}
        status = (
            entries[0].status
            if len(codes) == 1
            else pb.Status(code=Code.MULTIPLE_RESULTS, message="MULTIPLE_RESULTS")
        )
        return api.SendMessageResponse(status=status, entries=entries)

    async def _send_one(
        self, route: TopicRoute, message: pb.Message, body: bytes, properties: dict[str, str]
    ) -> api.SendResultEntry:
        system = message.system_properties
        half = system.message_type == pb.MessageType.TRANSACTION
        try:
            if half:
                # The producer group of a gRPC producer is its topic, as in the Apache proxy:
                # the broker's check of this half message goes to a producer of the topic.
                properties[Prop.TRANSACTION_PREPARED] = "true"
                properties[Prop.PRODUCER_GROUP] = route.topic
            self._check_type(route, properties)
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
            raise ApiError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
        if len(body) > self.max_body_bytes:
            raise ApiError(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"message body cannot exceed the max {self.max_body_bytes}",
            )
        return body

    @staticmethod
    def _check_type(route: TopicRoute, properties: dict[str, str]) -> None:
        """Refuse a message its topic's type does not take, as the Apache proxy does
        (ProducerProcessor with DefaultTopicMessageTypeValidator; the broker checks nothing).
        Clients check the route's accepted types first: this catches the rest."""
        message_type = message_type_of(properties)
        if not accepts(route.message_type, message_type):
            expected = route.message_type.value or "NORMAL"  # untyped is NORMAL to Apache
            raise ApiError(
                Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"{PROCESSOR_ERROR}TopicMessageType validate failed, the expected type is "
                f"{expected}, but actual type is {message_type.value}",
            )

    def _properties(self, message: pb.Message, client: str) -> dict[str, str]:
        """The broker properties of a message, each field checked in the Apache proxy's
        order (SendMessageActivity.buildMessageProperty), so that a message with several
        faults is told the same one. Its born host is the one the client names, else the
        client's address (``client``, host:port); the broker's own records the proxy."""
        system = message.system_properties
        limits = self.limits
        props = dict(message.user_properties)
        size = check.user_properties_size(props, limits.max_user_property_count)
        if system.tag:
            props[Prop.TAGS] = check.validate_tag(system.tag)
            size += check.utf8_size(system.tag)
        for key in system.keys:
            check.validate_key(key)
            size += check.utf8_size(key)
        if system.keys:
            props[Prop.KEYS] = " ".join(system.keys)
        check.check_properties_size(size, limits.max_user_property_size)
        props[Prop.UNIQ_KEY] = check.validate_message_id(system.message_id)
        if system.message_type == pb.MessageType.TRANSACTION and system.HasField(
            "orphaned_transaction_recovery_duration"
        ):
            seconds = system.orphaned_transaction_recovery_duration.seconds
            check.validate_transaction_recovery(seconds, limits.max_transaction_recovery_s)
            props[Prop.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
        if system.HasField("delivery_timestamp"):
            stamp = system.delivery_timestamp
            deliver_ms = stamp.seconds * 1000 + stamp.nanos // 1_000_000
            now_ms = int(time.time() * 1000)
            check.validate_delivery_time(deliver_ms, now_ms, limits.max_delay_ms)
            props[Prop.TIMER_DELIVER_MS] = str(deliver_ms)
        if system.HasField("priority"):
            # Set whenever given, as the Apache proxy does (Message.setPriority); the broker
            # drops it again from a FIFO, delayed or transactional message.
            props[Prop.PRIORITY] = str(check.validate_priority(system.priority))
        if system.message_group:
            props[Prop.SHARDING_KEY] = check.validate_message_group(
                system.message_group, limits.max_message_group_size
            )
        if system.lite_topic:
            props[Prop.LITE_TOPIC] = check.validate_lite_topic(
                system.lite_topic, self.max_lite_topic_size
            )
        if system.trace_context:
            props[Prop.TRACE_CONTEXT] = system.trace_context
        born_host = system.born_host if not check.is_blank(system.born_host) else client
        if not check.is_blank(born_host):
            props[Prop.BORN_HOST] = born_host
        return props
