"""QueryRoute and QueryAssignment: every queue and assignment points clients at this proxy."""

from __future__ import annotations

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ok, route_error
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.brokers import BrokerPool, TopicNotFound, TopicRoute
from proxy.message_types import MessageType, accepted_types
from proxy.remoting.client import RemotingError

_API_TYPES = {
    MessageType.NORMAL: pb.MessageType.NORMAL,
    MessageType.FIFO: pb.MessageType.FIFO,
    MessageType.DELAY: pb.MessageType.DELAY,
    MessageType.TRANSACTION: pb.MessageType.TRANSACTION,
    MessageType.PRIORITY: pb.MessageType.PRIORITY,
    MessageType.LITE: pb.MessageType.LITE,
    MessageType.UNSPECIFIED: pb.MessageType.MESSAGE_TYPE_UNSPECIFIED,
}


def accept_message_types(route: TopicRoute) -> list[pb.MessageType]:
    """What a queue of ``route`` accepts, from its topic's message.type (clients refuse to
    send another type there). FIFO messages go to the queue their group hashes to (the
    client picks it from this route) and are popped orderly; transactional ones are sent
    as half messages; a priority message's broker picks its queue by its priority."""
    return sorted((_API_TYPES[t] for t in accepted_types(route.message_type)), key=int)


async def topic_route(pool: BrokerPool, topic: str) -> TopicRoute:
    """The route of ``topic``, or the ApiError a client expects when there is none."""
    try:
        return await pool.route(topic)
    except (TopicNotFound, RemotingError) as exc:
        raise route_error(topic, exc) from None


class RouteActivity:
    def __init__(self, pool: BrokerPool, advertise: str) -> None:
        self.pool = pool
        self.configured = bool(advertise)  # an operator's address wins over the client's
        self.advertise = advertise

    def _endpoints(self, asked: pb.Endpoints) -> pb.Endpoints:
        """Where clients reach every broker: the configured advertise address (a load
        balancer's, say); without one, the endpoints the client itself dialled (the
        request's ``endpoints``, its access point), as the Apache proxy answers. A client
        given every proxy of a fleet ("p1;p2;p3") so keeps one channel over all of them,
        and gRPC moves its calls to another proxy when one stops or dies, instead of
        pinning it to the proxy that answered its first route. Our own bound address when
        the request names none."""
        if not self.configured and asked.addresses:
            return asked
        host, _, port = self.advertise.rpartition(":")
        return pb.Endpoints(
            scheme=pb.AddressScheme.IPv4 if _is_ipv4(host) else pb.AddressScheme.DOMAIN_NAME,
            addresses=[pb.Address(host=host, port=int(port))],
        )

    async def query_route(
        self, request: api.QueryRouteRequest, context: Context
    ) -> api.QueryRouteResponse:
        topic = check.validate_topic(request.topic.name)
        route = await topic_route(self.pool, topic)
        endpoints = self._endpoints(request.endpoints)
        accepted = accept_message_types(route)
        queues = [
            pb.MessageQueue(
                topic=request.topic,
                id=position,  # SendMessage maps it back to the broker and its queue
                permission=_permission(queue.readable, queue.writable),
                broker=pb.Broker(name=queue.broker.name, id=0, endpoints=endpoints),
                accept_message_types=accepted,
            )
            for position, queue in enumerate(route.queues)
        ]
        return api.QueryRouteResponse(status=ok(), message_queues=queues)

    async def query_assignment(
        self, request: api.QueryAssignmentRequest, context: Context
    ) -> api.QueryAssignmentResponse:
        """Push consumers: one assignment per readable broker, any queue (queue id -1)."""
        topic = check.validate_topic(request.topic.name)
        check.validate_group(request.group.name)
        route = await topic_route(self.pool, topic)
        endpoints = self._endpoints(request.endpoints)
        accepted = accept_message_types(route)
        assignments = [
            pb.Assignment(
                message_queue=pb.MessageQueue(
                    topic=request.topic,
                    id=-1,
                    permission=pb.Permission.READ_WRITE,
                    broker=pb.Broker(name=b.name, id=0, endpoints=endpoints),
                    accept_message_types=accepted,
                )
            )
            for b in route.readable
        ]
        return api.QueryAssignmentResponse(status=ok(), assignments=assignments)


def _permission(readable: bool, writable: bool) -> pb.Permission:
    if readable and writable:
        return pb.Permission.READ_WRITE
    if readable:
        return pb.Permission.READ
    return pb.Permission.WRITE if writable else pb.Permission.NONE


def _is_ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 for p in parts)
