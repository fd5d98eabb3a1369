"""``apache.rocketmq.v2.MessagingService``: each RPC handed to the activity of its family.

| family | activity |
|---|---|
| QueryRoute, QueryAssignment | ``route.RouteActivity`` |
| Heartbeat, Telemetry, NotifyClientTermination | ``session.SessionActivity`` |
| SendMessage, RecallMessage | ``send.SendActivity`` |
| EndTransaction | ``transaction.TransactionActivity`` |
| ReceiveMessage | ``receive.ReceiveActivity`` |
| AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue | ``ack.AckActivity`` |
| SyncLiteSubscription | ``lite.LiteActivity`` |

Every unary RPC goes through ``_unary``: the guard (authentication and authorization, when
security is on), the client-id check, an ``ApiError`` turned into the response's status
(the clients read that, not the gRPC status), and the latency sample. ReceiveMessage and
Telemetry are streams: ``_guard`` checks them here, the activities do the rest; each
Settings a Telemetry stream carries is authorized for the stream's user as it comes
(``_settings_guard``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Protocol, TypeVar

from proxy.api import validation as check
from proxy.api.ack import AckActivity
from proxy.api.connections import Connections
from proxy.api.context import Context
from proxy.api.errors import ApiError, Code, code_name, denied_error
from proxy.api.lite import LiteActivity
from proxy.api.receive import ReceiveActivity
from proxy.api.route import RouteActivity
from proxy.api.send import SendActivity
from proxy.api.session import SessionActivity, SettingsGuard
from proxy.api.transaction import TransactionActivity
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.observability.metrics import ProxyMetrics
from proxy.security.front import peer_address
from proxy.security.guard import Denied, Guard
from proxy.security.users import User


class _Answer(Protocol):
    """Every unary response: it carries the status the clients read."""

    @property
    def status(self) -> pb.Status: ...


RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT", bound=_Answer)


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
        guard: Guard | None = None,
        transaction: TransactionActivity | None = None,
        lite: LiteActivity | None = None,
        connections: Connections | None = None,
    ) -> None:
        self.guard = guard
        self.lite = lite
        self.route = route
        self.session = session
        self.send = send
        self.receive = receive
        self.ack = ack
        self.transaction = transaction
        self.metrics = metrics
        # Calls being served, by RPC: what a drain that runs out of its grace cancels, named
        # in its log line (``Drain.run``).
        self.open_calls: Counter[str] = Counter()
        # The connections the calls come on: a drain waits until the busy ones have aged
        # (``Drain._let_clients_move``).
        self.connections = Connections(0) if connections is None else connections
        # The client's address behind a call's gRPC peer (the TLS front's, once it runs):
        # what the guard checks a user's source_ips against.
        self.address_of: Callable[[str], str] = peer_address

    def _open(self, rpc: str, context: Context) -> _OpenCall:
        """The call counted open, on its connection, while the block runs."""
        return _OpenCall(self.open_calls, rpc, self.connections.call(context))

    async def _unary(
        self,
        rpc: str,
        handler: Callable[[RequestT, Context], Awaitable[ResponseT]],
        request: RequestT,
        context: Context,
    ) -> ResponseT:
        start = time.perf_counter()
        try:
            await self._guard(rpc, request, context)
            check.require_client_id(context)
            with self._open(rpc, context):
                response = await handler(request, context)
        except ApiError as err:
            response = getattr(api, f"{rpc}Response")(status=err.status)
        self._observe(rpc, response.status.code, time.perf_counter() - start)
        return response

    async def _guard(self, rpc: str, request: object, context: Context) -> User | None:
        """The user of a request the guard allows, or the ApiError of one it refuses (None
        without security). A user of the cluster's (auth_source "cluster") is read first
        if it is not cached."""
        guard = self.guard
        if guard is None:
            return None
        metadata = context.invocation_metadata()
        try:
            await guard.load_signed(rpc, metadata)
            return guard.check(rpc, request, metadata, self.address_of(context.peer()))
        except Denied as denied:
            raise denied_error(denied) from None

    def _settings_guard(self, user: User | None, context: Context) -> SettingsGuard | None:
        """How each Settings of a Telemetry stream of ``user`` is authorized: by the guard,
        for the user the stream's start authenticated, from where it connected (None
        without security: every Settings is allowed, within the registrations' bounds)."""
        guard = self.guard
        if guard is None or user is None:
            return None
        source = self.address_of(context.peer())

        def authorize(settings: pb.Settings) -> None:
            try:
                guard.authorize("Telemetry", user, settings, source)
            except Denied as denied:
                raise denied_error(denied) from None

        return authorize

    def _observe(self, rpc: str, code: int, seconds: float) -> None:
        self.metrics.rpc("grpc", _snake(rpc), code_name(code), seconds)

    # -- route and session ----------------------------------------------------------------

    async def QueryRoute(
        self, request: api.QueryRouteRequest, context: Context
    ) -> api.QueryRouteResponse:
        return await self._unary("QueryRoute", self.route.query_route, request, context)

    async def QueryAssignment(
        self, request: api.QueryAssignmentRequest, context: Context
    ) -> api.QueryAssignmentResponse:
        return await self._unary("QueryAssignment", self.route.query_assignment, request, context)

    async def Heartbeat(
        self, request: api.HeartbeatRequest, context: Context
    ) -> api.HeartbeatResponse:
        return await self._unary("Heartbeat", self.session.heartbeat, request, context)

    async def NotifyClientTermination(
        self, request: api.NotifyClientTerminationRequest, context: Context
    ) -> api.NotifyClientTerminationResponse:
        return await self._unary(
            "NotifyClientTermination", self.session.notify_client_termination, request, context
        )

    async def Telemetry(
        self, request_iterator: AsyncIterator[api.TelemetryCommand], context: Context
    ) -> AsyncIterator[api.TelemetryCommand]:
        try:
            user = await self._guard("Telemetry", None, context)
        except ApiError as err:
            yield api.TelemetryCommand(status=err.status)
            return
        authorize = self._settings_guard(user, context)
        with self._open("Telemetry", context):
            async for command in self.session.telemetry(request_iterator, context, authorize):
                yield command

    # -- messages -------------------------------------------------------------------------

    async def SendMessage(
        self, request: api.SendMessageRequest, context: Context
    ) -> api.SendMessageResponse:
        return await self._unary("SendMessage", self.send.send_message, request, context)

    async def ReceiveMessage(self, request: api.ReceiveMessageRequest, context: Context) -> None:
        try:
            await self._guard("ReceiveMessage", request, context)
        except ApiError as err:
            self._observe("ReceiveMessage", err.code, 0.0)
            await context.write(api.ReceiveMessageResponse(status=err.status))
            return
        with self._open("ReceiveMessage", context):
            await self.receive.receive_message(request, context)

    async def AckMessage(
        self, request: api.AckMessageRequest, context: Context
    ) -> api.AckMessageResponse:
        return await self._unary("AckMessage", self.ack.ack_message, request, context)

    async def ChangeInvisibleDuration(
        self, request: api.ChangeInvisibleDurationRequest, context: Context
    ) -> api.ChangeInvisibleDurationResponse:
        return await self._unary(
            "ChangeInvisibleDuration", self.ack.change_invisible_duration, request, context
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: api.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> api.ForwardMessageToDeadLetterQueueResponse:
        return await self._unary(
            "ForwardMessageToDeadLetterQueue",
            self.ack.forward_message_to_dead_letter_queue,
            request,
            context,
        )

    async def SyncLiteSubscription(
        self, request: api.SyncLiteSubscriptionRequest, context: Context
    ) -> api.SyncLiteSubscriptionResponse:
        if self.lite is None:
            return await self._not_supported(
                "SyncLiteSubscription", api.SyncLiteSubscriptionResponse
            )
        return await self._unary(
            "SyncLiteSubscription", self.lite.sync_lite_subscription, request, context
        )

    # -- what this proxy does not serve ---------------------------------------------------

    async def _not_supported(self, rpc: str, answer: Callable[..., ResponseT]) -> ResponseT:
        err = ApiError(Code.NOT_IMPLEMENTED, f"{rpc} is not supported by this proxy")
        self._observe(rpc, err.code, 0.0)
        return answer(status=err.status)

    async def UpdateOffset(
        self, request: api.UpdateOffsetRequest, context: Context
    ) -> api.UpdateOffsetResponse:
        return await self._not_supported("UpdateOffset", api.UpdateOffsetResponse)

    async def GetOffset(
        self, request: api.GetOffsetRequest, context: Context
    ) -> api.GetOffsetResponse:
        return await self._not_supported("GetOffset", api.GetOffsetResponse)

    async def QueryOffset(
        self, request: api.QueryOffsetRequest, context: Context
    ) -> api.QueryOffsetResponse:
        return await self._not_supported("QueryOffset", api.QueryOffsetResponse)

    async def EndTransaction(
        self, request: api.EndTransactionRequest, context: Context
    ) -> api.EndTransactionResponse:
        if self.transaction is None:
            return await self._not_supported("EndTransaction", api.EndTransactionResponse)
        return await self._unary(
            "EndTransaction", self.transaction.end_transaction, request, context
        )

    async def RecallMessage(
        self, request: api.RecallMessageRequest, context: Context
    ) -> api.RecallMessageResponse:
        return await self._unary("RecallMessage", self.send.recall_message, request, context)

    async def PullMessage(self, request: api.PullMessageRequest, context: Context) -> None:
        err = ApiError(Code.NOT_IMPLEMENTED, "PullMessage is not supported by this proxy")
        await context.write(api.PullMessageResponse(status=err.status))


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")


class _OpenCall:
    """``MessagingService._open``: a slotted object rather than a generator, as a parked
    long poll holds one for as long as it waits."""

    __slots__ = ("counts", "on_connection", "rpc")

    def __init__(
        self, counts: Counter[str], rpc: str, on_connection: AbstractContextManager[None]
    ) -> None:
        self.counts = counts
        self.rpc = rpc
        self.on_connection = on_connection

    def __enter__(self) -> None:
        self.counts[self.rpc] += 1
        try:
            self.on_connection.__enter__()
        except BaseException:
            self.counts[self.rpc] -= 1
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.on_connection.__exit__(kind, exc, tb)
        finally:
            self.counts[self.rpc] -= 1
