"""SendMessage: validate each message, translate it into broker properties, and report
what the producer processor did with it, one entry per message."""

from __future__ import annotations

import time

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.convert import decoded_body
from proxy.api.errors import ApiError, Code, code_name, ok, send_error
from proxy.api.route import topic_route
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import BrokerPool, TopicRoute
from proxy.observability.metrics import ProxyMetrics
from proxy.processor.producer import ProducerProcessor, SendFailure
from proxy.remoting.message import Prop, UniqueIdGenerator


class SendActivity:
    def __init__(
        self,
        pool: BrokerPool,
        producer: ProducerProcessor,
        metrics: ProxyMetrics,
        max_body_bytes: int,
    ) -> None:
        self.pool = pool
        self.producer = producer
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
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
        try:
            properties = self._properties(message)
            body = self._body(message)
            result = await self.producer.send(route, system.queue_id, body, properties)
        except SendFailure as failure:
            return self._failed(route.topic, system, send_error(failure.broker, failure.error))
        except ApiError as err:
            return self._failed(route.topic, system, err)
        self.metrics.sent(route.topic, code_name(Code.OK))
        return api.SendResultEntry(
            status=ok(),
            message_id=properties[Prop.UNIQ_KEY],
            transaction_id=properties[Prop.UNIQ_KEY],
            offset=result.queue_offset,
        )

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
        if system.HasField("delivery_timestamp"):
            deliver_ms = system.delivery_timestamp.ToMilliseconds()
            if deliver_ms - int(time.time() * 1000) > check.MAX_DELIVERY_DELAY_MS:
                raise ApiError(Code.ILLEGAL_DELIVERY_TIME, "delivery time is more than 24 h away")
            props[Prop.TIMER_DELIVER_MS] = str(deliver_ms)
        if system.message_type == pb.MessageType.TRANSACTION:
            raise ApiError(Code.UNSUPPORTED, "transactional messages are not supported")
        return props
