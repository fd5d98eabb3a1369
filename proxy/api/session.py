"""A client's session: Heartbeat, the Settings exchange on Telemetry, and termination.

The proxy keeps no session state; it answers what the clients wait for. A consumer's
settings say whether its group is FIFO (``subscription.fifo``, from the group's config on
the brokers). Heartbeats and termination tell the handle renewer whether a push consumer
is still there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, ok
from proxy.api.settings import answer_settings
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import ProxyConfig
from proxy.groups import GroupSettings
from proxy.processor.renewal import HandleRenewer


class SessionActivity:
    def __init__(self, config: ProxyConfig, groups: GroupSettings, renewer: HandleRenewer) -> None:
        self.config = config
        self.groups = groups
        self.renewer = renewer

    async def heartbeat(
        self, request: api.HeartbeatRequest, context: Context
    ) -> api.HeartbeatResponse:
        self.renewer.seen(check.require_client_id(context))
        return api.HeartbeatResponse(status=ok())

    async def notify_client_termination(
        self, request: api.NotifyClientTerminationRequest, context: Context
    ) -> api.NotifyClientTerminationResponse:
        self.renewer.client_gone(check.require_client_id(context))
        return api.NotifyClientTerminationResponse(status=ok())

    async def _fifo(self, settings: pb.Settings) -> bool:
        """Whether a consumer's group is FIFO (asked of a broker of its first topic)."""
        if settings.WhichOneof("pub_sub") != "subscription":
            return False
        sub = settings.subscription
        if not sub.group.name or not sub.subscriptions:
            return False
        return await self.groups.fifo(sub.group.name, sub.subscriptions[0].topic.name)

    async def telemetry(
        self,
        commands: AsyncIterator[api.TelemetryCommand],
        context: Context,
    ) -> AsyncIterator[api.TelemetryCommand]:
        """Answer each Settings the client writes with the completed settings, status OK."""
        try:
            check.require_client_id(context)
        except ApiError as err:
            yield api.TelemetryCommand(status=err.status)
            return
        async for command in commands:
            if command.WhichOneof("command") != "settings":
                continue  # results of commands we never send
            try:
                settings = answer_settings(
                    command.settings,
                    max_body_bytes=self.config.max_body_bytes,
                    max_polling_ms=self.config.receive.max_polling_ms,
                    max_attempts=self.config.receive.max_delivery_attempts,
                    fifo=await self._fifo(command.settings),
                )
            except ApiError as err:
                yield api.TelemetryCommand(status=err.status)
                continue
            yield api.TelemetryCommand(status=ok(), settings=settings)
