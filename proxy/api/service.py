"""``apache.rocketmq.v2.MessagingService``: validate, translate, call the engine or a broker.

Each RPC answers with a RocketMQ status in its response (the clients read that, not the
gRPC status); errors inside become ``ApiError`` with the code a client expects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Callable

import grpc

from proxy.api import validation as check
from proxy.api.convert import decoded_body, timestamp, to_api_message
from proxy.api.errors import ApiError, Code, code_name, ok
from proxy.api.handles import ReceiptHandle, parse_receipt_handle
from proxy.api.settings import answer_settings
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.brokers import BrokerPool, TopicNotFound, TopicRoute
from proxy.config import ProxyConfig
from proxy.observability.eventlog import ReceiveEvent
from proxy.receive.engine import ReceiveEngine, TooManyRequests
from proxy.receive.types import ReceiveRequest, ReceiveResult
from proxy.remoting.broker_client import BrokerClient, BrokerError
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import ResponseCode
from proxy.remoting.message import Prop, UniqueIdGenerator

log = logging.getLogger(__name__)

CLIENT_ID_HEADER = "x-mq-client-id"
# Recorded for a ReceiveMessage the client cancelled; not a code the API defines, so it
# never reaches a client.
CLIENT_CANCELLED = -1
# FIFO needs ordered pops and transactions need half messages; neither is offered.
ACCEPTED_TYPES = [pb.MessageType.NORMAL, pb.MessageType.DELAY]
# Broker errors that another broker may not have (the producer's retry list).
_RETRY_ELSEWHERE = {
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.TOPIC_NOT_EXIST,
    ResponseCode.NO_PERMISSION,
}


def unary(rpc: str):
    """Wrap a unary handler: client-id check, ApiError -> status, latency metric."""

    def wrap(handler: Callable):
        @functools.wraps(handler)
        async def run(self: MessagingService, request, context: grpc.aio.ServicerContext):
            start = time.perf_counter()
            try:
                self.require_client_id(context)
                response = await handler(self, request, context)
            except ApiError as err:
                response = self.error_response(rpc, err)
            self.observe(rpc, response.status.code, time.perf_counter() - start)
            return response

        return run

    return wrap


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(
        self,
        config: ProxyConfig,
        pool: BrokerPool,
        engine: ReceiveEngine,
        metrics=None,
        events=None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.engine = engine
        self.metrics = metrics
        self.events = events
        self.advertise = config.advertise_address or f"{config.grpc_host}:{config.grpc_port}"
        self._send_turn = itertools.count()
        self._ids = UniqueIdGenerator()
        self.accepting = True

    # -- shared pieces --------------------------------------------------------------------

    @staticmethod
    def require_client_id(context: grpc.aio.ServicerContext) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_ID_HEADER and value.strip():
                return value
        raise ApiError(Code.CLIENT_ID_REQUIRED, f"metadata {CLIENT_ID_HEADER} is required")

    @staticmethod
    def error_response(rpc: str, err: ApiError):
        response_type = getattr(api, f"{rpc}Response")
        return response_type(status=err.status)

    def observe(self, rpc: str, code: int, seconds: float, long_polling: bool = False) -> None:
        if self.metrics is not None:
            self.metrics.rpc(
                "grpc", _snake(rpc), code_name(code), seconds, is_long_polling=long_polling
            )

    async def route(self, topic: str) -> TopicRoute:
        try:
            return await self.pool.route(topic)
        except (TopicNotFound, RemotingError) as exc:
            raise route_error(topic, exc) from None

    async def broker_for(self, name: str, topic: str) -> BrokerClient:
        client = await self.pool.broker_by_name(name, topic)
        if client is None:
            raise ApiError(Code.INVALID_RECEIPT_HANDLE, f"broker {name!r} is unknown to this proxy")
        return client

    # -- metadata RPCs --------------------------------------------------------------------

    def _endpoints(self) -> pb.Endpoints:
        """This proxy's address: clients reach every broker through it."""
        host, _, port = self.advertise.rpartition(":")
        return pb.Endpoints(
            scheme=pb.AddressScheme.IPv4 if _is_ipv4(host) else pb.AddressScheme.DOMAIN_NAME,
            addresses=[pb.Address(host=host, port=int(port))],
        )

    @unary("QueryRoute")
    async def QueryRoute(self, request: api.QueryRouteRequest, context):
        topic = check.validate_topic(request.topic.name)
        route = await self.route(topic)
        endpoints = self._endpoints()
        queues = [
            pb.MessageQueue(
                topic=request.topic,
                id=position,  # SendMessage maps it back to the broker and its queue
                permission=_permission(queue.readable, queue.writable),
                broker=pb.Broker(name=queue.broker.name, id=0, endpoints=endpoints),
                accept_message_types=ACCEPTED_TYPES,
            )
            for position, queue in enumerate(route.queues)
        ]
        return api.QueryRouteResponse(status=ok(), message_queues=queues)

    @unary("Heartbeat")
    async def Heartbeat(self, request, context):
        return api.HeartbeatResponse(status=ok())

    @unary("NotifyClientTermination")
    async def NotifyClientTermination(self, request, context):
        return api.NotifyClientTerminationResponse(status=ok())

    @unary("QueryAssignment")
    async def QueryAssignment(self, request: api.QueryAssignmentRequest, context):
        """Push consumers: one assignment per readable broker, any queue (queue id -1)."""
        topic = check.validate_topic(request.topic.name)
        check.validate_group(request.group.name)
        route = await self.route(topic)
        endpoints = self._endpoints()
        assignments = [
            pb.Assignment(
                message_queue=pb.MessageQueue(
                    topic=request.topic,
                    id=-1,
                    permission=pb.Permission.READ_WRITE,
                    broker=pb.Broker(name=b.name, id=0, endpoints=endpoints),
                    accept_message_types=ACCEPTED_TYPES,
                )
            )
            for b in route.readable
        ]
        return api.QueryAssignmentResponse(status=ok(), assignments=assignments)

    async def Telemetry(self, request_iterator, context):
        """Answer each Settings the client writes with the completed settings, status OK."""
        try:
            self.require_client_id(context)
        except ApiError as err:
            yield api.TelemetryCommand(status=err.status)
            return
        async for command in request_iterator:
            if command.WhichOneof("command") != "settings":
                continue  # results of commands we never send
            try:
                settings = answer_settings(
                    command.settings,
                    max_body_bytes=self.config.max_body_bytes,
                    max_polling_ms=self.config.receive.max_polling_ms,
                    max_attempts=self.config.receive.max_delivery_attempts,
                )
            except ApiError as err:
                yield api.TelemetryCommand(status=err.status)
                continue
            yield api.TelemetryCommand(status=ok(), settings=settings)

    # -- send -----------------------------------------------------------------------------

    @unary("SendMessage")
    async def SendMessage(self, request: api.SendMessageRequest, context):
        if not request.messages:
            raise ApiError(Code.BAD_REQUEST, "no message to send")
        topic = check.validate_topic(request.messages[0].topic.name)
        if any(m.topic.name != topic for m in request.messages):
            raise ApiError(Code.BAD_REQUEST, "messages of one request must share a topic")
        route = await self.route(topic)
        if not route.writable:
            raise ApiError(Code.FORBIDDEN, f"no broker accepts writes to {topic!r}")
        entries = [await self._send_one(topic, message, route) for message in request.messages]
        codes = {e.status.code for e in entries}
        status = (
            entries[0].status
            if len(codes) == 1
            else pb.Status(code=Code.MULTIPLE_RESULTS, message="messages have different results")
        )
        return api.SendMessageResponse(status=status, entries=entries)

    async def _send_one(
        self, topic: str, message: pb.Message, route: TopicRoute
    ) -> api.SendResultEntry:
        system = message.system_properties
        try:
            properties = self._send_properties(message)
            body = decoded_body(message)
            if not body:
                raise ApiError(Code.MESSAGE_BODY_EMPTY, "message body is empty")
            if len(body) > self.config.max_body_bytes:
                raise ApiError(
                    Code.MESSAGE_BODY_TOO_LARGE,
                    f"body of {len(body)} bytes exceeds {self.config.max_body_bytes}",
                )
        except ApiError as err:
            self._count_send(topic, err.code)
            return api.SendResultEntry(status=err.status, message_id=system.message_id)
        last_error: ApiError | None = None
        for broker, queue_id in self._send_targets(route, system.queue_id):
            client = self.pool.broker(broker.name)
            if client is None:
                continue
            try:
                result = await client.send(
                    topic,
                    body,
                    properties=properties,
                    queue_id=queue_id,
                    timeout=self.config.receive.broker_timeout_s,
                )
            except BrokerError as exc:
                last_error = ApiError(_send_error_code(exc.code), f"{broker.name}: {exc.remark}")
                if exc.code not in _RETRY_ELSEWHERE:
                    break
                continue
            except RemotingError as exc:
                last_error = ApiError(Code.PROXY_TIMEOUT, f"{broker.name}: {exc}")
                continue
            self._count_send(topic, Code.OK)
            return api.SendResultEntry(
                status=ok(),
                message_id=properties[Prop.UNIQ_KEY],
                transaction_id=properties[Prop.UNIQ_KEY],
                offset=result.queue_offset,
            )
        err = last_error or ApiError(Code.INTERNAL_SERVER_ERROR, "no broker could take it")
        self._count_send(topic, err.code)
        return api.SendResultEntry(status=err.status, message_id=system.message_id)

    def _send_targets(self, route: TopicRoute, position: int) -> list[tuple]:
        """The queue the client chose (its position in our route listing), then one other
        broker, any queue, should the first fail."""
        queues = route.queues
        writable = route.writable
        turn = next(self._send_turn)
        if 0 <= position < len(queues) and queues[position].writable:
            first = (queues[position].broker, queues[position].queue_id)
        else:
            first = (writable[turn % len(writable)], -1)
        others = [b for b in writable if b != first[0]]
        return [first, (others[turn % len(others)], -1)] if others else [first]

    def _send_properties(self, message: pb.Message) -> dict[str, str]:
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

    def _count_send(self, topic: str, code: int) -> None:
        if self.metrics is not None:
            self.metrics.sent(topic, code_name(code))

    # -- receive --------------------------------------------------------------------------

    async def ReceiveMessage(self, request: api.ReceiveMessageRequest, context):
        """Stream: status first, then one response per message, then delivery_timestamp."""
        loop = asyncio.get_running_loop()
        arrived_at, arrived_ms = loop.time(), int(time.time() * 1000)
        req: ReceiveRequest | None = None
        result: ReceiveResult | None = None
        code = Code.OK
        try:
            self.require_client_id(context)
            if not self.accepting:
                raise ApiError(Code.TOO_MANY_REQUESTS, "proxy is shutting down")
            req = self._receive_request(request, context, arrived_at, arrived_ms)
            try:
                result = await self.engine.receive(req)
            except TooManyRequests as exc:
                raise ApiError(Code.TOO_MANY_REQUESTS, str(exc)) from None
            except (TopicNotFound, RemotingError) as exc:
                raise route_error(req.topic, exc) from None
        except ApiError as err:
            code = err.code
            await context.write(api.ReceiveMessageResponse(status=err.status))
        except asyncio.CancelledError:
            code = CLIENT_CANCELLED  # the client went away; the engine handed messages back
            raise
        else:
            code = await self._deliver(result, req, context)
        finally:
            if req is None:  # refused before it became a poll: record what it asked for
                req = self._refused_request(request, arrived_at, arrived_ms)
            self._record_receive(req, result, code, loop.time() - arrived_at)

    def _receive_request(
        self, request, context, arrived_at: float, arrived_ms: int
    ) -> ReceiveRequest:
        rc = self.config.receive
        group = check.validate_group(request.group.name)
        topic = check.validate_topic(request.message_queue.topic.name)
        expression = check.validate_filter(
            request.filter_expression.expression, request.filter_expression.type
        )
        batch = check.validate_batch_size(request.batch_size)
        if not request.HasField("invisible_duration"):
            raise ApiError(Code.ILLEGAL_INVISIBLE_TIME, "invisible duration is required")
        invisible = check.validate_invisible(check.duration_ms(request.invisible_duration))
        # Polling time, as the RocketMQ proxy grants it.
        remaining = context.time_remaining()
        remaining_ms = None if remaining is None else int(remaining * 1000)
        if request.HasField("long_polling_timeout"):
            asked = check.duration_ms(request.long_polling_timeout)
        else:
            asked = rc.min_polling_ms if remaining_ms is None else remaining_ms - 1_500
        polling = min(max(asked, rc.min_polling_ms), rc.max_polling_ms)
        if remaining_ms is not None and polling > remaining_ms - rc.reserve_ms:
            if remaining_ms - rc.reserve_ms < rc.min_polling_ms:
                raise ApiError(
                    Code.ILLEGAL_POLLING_TIME,
                    "the deadline time remaining is not enough for polling",
                )
            polling = remaining_ms - rc.reserve_ms
        broker_hint = request.message_queue.broker.name or None
        return ReceiveRequest(
            group=group,
            topic=topic,
            expression=expression,
            batch_size=batch,
            invisible_ms=invisible,
            polling_ms=polling,
            answer_by=arrived_at + polling / 1000,
            arrived_at=arrived_at,
            arrived_ms=arrived_ms,
            is_long_polling=asked >= rc.min_polling_ms,
            broker_hint=broker_hint,
        )

    async def _deliver(self, result: ReceiveResult, req: ReceiveRequest, context) -> int:
        """Write the messages; hand back every one the client did not get."""
        if not result.messages:
            await context.write(
                api.ReceiveMessageResponse(
                    status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message")
                )
            )
            return Code.MESSAGE_NOT_FOUND
        written = 0
        try:
            await context.write(api.ReceiveMessageResponse(status=ok()))
            for polled in result.messages:
                await context.write(api.ReceiveMessageResponse(message=to_api_message(polled)))
                written += 1
            await context.write(
                api.ReceiveMessageResponse(delivery_timestamp=timestamp(int(time.time() * 1000)))
            )
        except BaseException:
            self.engine.nack(result.messages[written:], "write_failed")
            raise
        return Code.OK

    def _refused_request(self, request, arrived_at: float, arrived_ms: int) -> ReceiveRequest:
        """A ReceiveRequest for the record of a refused call. Names that failed validation
        are recorded as "" so that label values stay bounded."""

        def valid(validate, name: str) -> str:
            try:
                return validate(name)
            except ApiError:
                return ""

        asked = (
            check.duration_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else 0
        )
        return ReceiveRequest(
            group=valid(check.validate_group, request.group.name),
            topic=valid(check.validate_topic, request.message_queue.topic.name),
            expression="",
            batch_size=0,
            invisible_ms=0,
            polling_ms=0,
            answer_by=arrived_at,
            arrived_at=arrived_at,
            arrived_ms=arrived_ms,
            is_long_polling=asked >= self.config.receive.min_polling_ms,
        )

    def _record_receive(self, req: ReceiveRequest, result, code: int, wait_s: float) -> None:
        """One metric sample and one event per ReceiveMessage, as DESIGN.md specifies."""
        long_polling = req.is_long_polling
        self.observe("ReceiveMessage", code, wait_s, long_polling=long_polling)
        if code == Code.OK:
            outcome = "found"
        elif code == Code.MESSAGE_NOT_FOUND:
            outcome = "empty"
        elif code == CLIENT_CANCELLED:
            outcome = "cancelled"
        else:
            outcome = code_name(code)
        mode = result.mode if result else self.engine.current_mode(req.group, req.topic)
        hit = bool(result and result.is_short_polling_hit)
        if self.metrics is not None:
            metric_result = outcome if outcome in ("found", "empty") else "error"
            self.metrics.receive_done(
                req.group, req.topic, mode, long_polling, hit, metric_result, wait_s
            )
        if self.events is not None:
            self.events.write(
                ReceiveEvent(
                    ts=req.arrived_ms,
                    proxy=self.config.proxy_id,
                    group=req.group,
                    topic=req.topic,
                    mode=mode,
                    is_long_polling=long_polling,
                    is_short_polling_hit=hit,
                    polling_ms=req.polling_ms,
                    wait_ms=int(wait_s * 1000),
                    messages=len(result.messages) if result else 0,
                    result=outcome,
                    pops=result.pops if result else 0,
                    notifications=result.notifications if result else 0,
                    broker=result.broker if result else None,
                )
            )

    # -- ack, invisible time, dead letters --------------------------------------------------

    @unary("AckMessage")
    async def AckMessage(self, request: api.AckMessageRequest, context):
        group = check.validate_group(request.group.name)
        topic = check.validate_topic(request.topic.name)
        if not request.entries:
            raise ApiError(Code.BAD_REQUEST, "no entry to ack")
        statuses = await self._ack_entries(group, topic, list(request.entries))
        entries = [
            api.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=status
            )
            for e, status in zip(request.entries, statuses, strict=True)
        ]
        codes = {status.code for status in statuses}
        status = (
            statuses[0]
            if len(codes) == 1
            else pb.Status(code=Code.MULTIPLE_RESULTS, message="entries have different results")
        )
        return api.AckMessageResponse(status=status, entries=entries)

    async def _ack_entries(self, group: str, topic: str, entries: list) -> list[pb.Status]:
        """Ack every entry, each broker's share in one batch, all brokers at once; return a
        status per entry."""
        statuses: list[pb.Status | None] = [None] * len(entries)
        by_broker: dict[str, list[tuple[int, ReceiptHandle]]] = {}
        now_ms = int(time.time() * 1000)
        acked = ok()  # one object for every entry: the response copies it into each
        for i, entry in enumerate(entries):
            try:
                handle = parse_receipt_handle(entry.receipt_handle, now_ms=now_ms)
            except ApiError as err:
                statuses[i] = err.status
                continue
            by_broker.setdefault(handle.broker, []).append((i, handle))

        async def ack_on(broker: str, handles: list[tuple[int, ReceiptHandle]]) -> None:
            try:
                client = await self.broker_for(broker, topic)
            except ApiError as err:
                for i, _ in handles:
                    statuses[i] = err.status
                return
            errors = await client.ack_all(
                group,
                topic,
                [handle.checkpoint for _, handle in handles],
                timeout=self.config.receive.broker_timeout_s,
            )
            for (i, _), error in zip(handles, errors, strict=True):
                statuses[i] = acked if error is None else _ack_error(broker, error).status

        await asyncio.gather(*(ack_on(b, handles) for b, handles in by_broker.items()))
        return [status or acked for status in statuses]

    @unary("ChangeInvisibleDuration")
    async def ChangeInvisibleDuration(self, request: api.ChangeInvisibleDurationRequest, context):
        group = check.validate_group(request.group.name)
        topic = check.validate_topic(request.topic.name)
        invisible = check.validate_invisible(check.duration_ms(request.invisible_duration), 0)
        handle = parse_receipt_handle(request.receipt_handle)
        client = await self.broker_for(handle.broker, topic)
        try:
            extra = await client.change_invisible_time(
                group,
                topic,
                handle.extra_info,
                invisible,
                timeout=self.config.receive.broker_timeout_s,
            )
        except RemotingError as exc:
            raise _ack_error(handle.broker, exc) from None
        return api.ChangeInvisibleDurationResponse(
            status=ok(), receipt_handle=f"{extra} {handle.commit_log_offset}"
        )

    @unary("ForwardMessageToDeadLetterQueue")
    async def ForwardMessageToDeadLetterQueue(self, request, context):
        group = check.validate_group(request.group.name)
        topic = check.validate_topic(request.topic.name)
        handle = parse_receipt_handle(request.receipt_handle)
        client = await self.broker_for(handle.broker, topic)
        max_attempts = request.max_delivery_attempts or self.config.receive.max_delivery_attempts
        try:
            await client.send_to_dead_letter(
                group, handle.commit_log_offset, request.message_id, topic, max_attempts - 1
            )
            await client.ack(group, topic, handle.extra_info)
        except BrokerError as exc:
            raise ApiError(Code.INTERNAL_SERVER_ERROR, f"{handle.broker}: {exc.remark}") from None
        except RemotingError as exc:
            raise ApiError(Code.PROXY_TIMEOUT, f"{handle.broker}: {exc}") from None
        return api.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # -- what this proxy does not serve -----------------------------------------------------

    async def _not_supported(self, rpc: str, context):
        err = ApiError(Code.NOT_IMPLEMENTED, f"{rpc} is not supported by this proxy")
        self.observe(rpc, err.code, 0.0)
        return self.error_response(rpc, err)

    async def UpdateOffset(self, request, context):
        return await self._not_supported("UpdateOffset", context)

    async def GetOffset(self, request, context):
        return await self._not_supported("GetOffset", context)

    async def QueryOffset(self, request, context):
        return await self._not_supported("QueryOffset", context)

    async def EndTransaction(self, request, context):
        return await self._not_supported("EndTransaction", context)

    async def RecallMessage(self, request, context):
        return await self._not_supported("RecallMessage", context)

    async def PullMessage(self, request, context):
        err = ApiError(Code.NOT_IMPLEMENTED, "PullMessage is not supported by this proxy")
        await context.write(api.PullMessageResponse(status=err.status))


def route_error(topic: str, exc: Exception) -> ApiError:
    """The status for a topic whose route could not be had."""
    if isinstance(exc, TopicNotFound):
        return ApiError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} not found")
    return ApiError(Code.INTERNAL_SERVER_ERROR, f"no route for {topic!r}: {exc}")


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


def _permission(readable: bool, writable: bool) -> int:
    if readable and writable:
        return pb.Permission.READ_WRITE
    if readable:
        return pb.Permission.READ
    return pb.Permission.WRITE if writable else pb.Permission.NONE


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)


def _send_error_code(broker_code: int) -> int:
    return {
        ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
        ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
        ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
        ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
        ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    }.get(broker_code, Code.INTERNAL_SERVER_ERROR)


def _ack_error(broker: str, error: RemotingError) -> ApiError:
    """The client's error for a failed ack or invisible-time change: a handle the broker
    refuses is invalid; a broker that does not answer is a timeout."""
    if isinstance(error, BrokerError):
        return ApiError(_ack_error_code(error.code), f"{broker}: {error.remark}")
    return ApiError(Code.PROXY_TIMEOUT, f"{broker}: {error}")


def _ack_error_code(broker_code: int) -> int:
    return {
        ResponseCode.NO_MESSAGE: Code.INVALID_RECEIPT_HANDLE,
        ResponseCode.MESSAGE_ILLEGAL: Code.INVALID_RECEIPT_HANDLE,
        ResponseCode.INVALID_PARAMETER: Code.INVALID_RECEIPT_HANDLE,
        ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    }.get(broker_code, Code.INTERNAL_SERVER_ERROR)
