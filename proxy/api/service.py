"""``apache.rocketmq.v2.MessagingService``: each RPC handed to the activity of its family.

| family | activity |
|---|---|
| QueryRoute, QueryAssignment | ``route.RouteActivity`` |
| Heartbeat, Telemetry, NotifyClientTermination | ``session.SessionActivity`` |
| SendMessage | ``send.SendActivity`` |
| ReceiveMessage | ``receive.ReceiveActivity`` |
| AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue | ``ack.AckActivity`` |

Every unary RPC goes through ``_unary``: the client-id check, an ``ApiError`` turned into
the response's status (the clients read that, not the gRPC status), and the latency
sample. ReceiveMessage and Telemetry are streams and do the same themselves.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from proxy.api import validation as check
from proxy.api.ack import AckActivity
from proxy.api.errors import ApiError, Code, code_name
from proxy.api.receive import ReceiveActivity
from proxy.api.route import RouteActivity
from proxy.api.send import SendActivity
from proxy.api.session import SessionActivity
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.observability.metrics import ProxyMetrics

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(
        self,
        *,
        route: RouteActivity,
        session: SessionActivity,
        send: SendActivity,
        receive: ReceiveActivity,
        ack: AckActivity,
        metrics: ProxyMetrics,
    ) -> None:
        self.route = route
        self.session = session
        self.send = send
        self.receive = receive
        self.ack = ack
        self.metrics = metrics

    async def _unary(
        self, rpc: str, handler: Handler, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        start = time.perf_counter()
        try:
            check.require_client_id(context)
            response = await handler(request, context)
        except ApiError as err:
            response = getattr(api, f"{rpc}Response")(status=err.status)
        self._observe(rpc, response.status.code, time.perf_counter() - start)
        return response

    def _observe(self, rpc: str, code: int, seconds: float) -> None:
        self.metrics.rpc("grpc", _snake(rpc), code_name(code), seconds)

    # -- route and session ----------------------------------------------------------------

    async def QueryRoute(self, request, context):
        return await self._unary("QueryRoute", self.route.query_route, request, context)

    async def QueryAssignment(self, request, context):
        return await self._unary("QueryAssignment", self.route.query_assignment, request, context)

    async def Heartbeat(self, request, context):
        return await self._unary("Heartbeat", self.session.heartbeat, request, context)

    async def NotifyClientTermination(self, request, context):
        return await self._unary(
            "NotifyClientTermination", self.session.notify_client_termination, request, context
        )

    async def Telemetry(self, request_iterator, context) -> AsyncIterator[api.TelemetryCommand]:
        async for command in self.session.telemetry(request_iterator, context):
            yield command

    # -- messages -------------------------------------------------------------------------

    async def SendMessage(self, request, context):
        return await self._unary("SendMessage", self.send.send_message, request, context)

    async def ReceiveMessage(self, request, context):
        await self.receive.receive_message(request, context)

    async def AckMessage(self, request, context):
        return await self._unary("AckMessage", self.ack.ack_message, request, context)

    async def ChangeInvisibleDuration(self, request, context):
        return await self._unary(
            "ChangeInvisibleDuration", self.ack.change_invisible_duration, request, context
        )

    async def ForwardMessageToDeadLetterQueue(self, request, context):
        return await self._unary(
            "ForwardMessageToDeadLetterQueue",
            self.ack.forward_message_to_dead_letter_queue,
            request,
            context,
        )

    # -- what this proxy does not serve ---------------------------------------------------

    async def _not_supported(self, rpc: str) -> Any:
        err = ApiError(Code.NOT_IMPLEMENTED, f"{rpc} is not supported by this proxy")
        self._observe(rpc, err.code, 0.0)
        return getattr(api, f"{rpc}Response")(status=err.status)

    async def UpdateOffset(self, request, context):
        return await self._not_supported("UpdateOffset")

    async def GetOffset(self, request, context):
        return await self._not_supported("GetOffset")

    async def QueryOffset(self, request, context):
        return await self._not_supported("QueryOffset")

    async def EndTransaction(self, request, context):
        return await self._not_supported("EndTransaction")

    async def RecallMessage(self, request, context):
        return await self._not_supported("RecallMessage")

    async def PullMessage(self, request, context):
        err = ApiError(Code.NOT_IMPLEMENTED, "PullMessage is not supported by this proxy")
        await context.write(api.PullMessageResponse(status=err.status))


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
