"""A client's session: Heartbeat, the Settings exchange on Telemetry, and termination.

The proxy keeps no session state; it answers what the clients wait for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.errors import ApiError, ok
from proxy.api.settings import answer_settings
from proxy.api.v2 import service_pb2 as api
from proxy.config import ProxyConfig


class SessionActivity:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config

    async def heartbeat(
        self, request: api.HeartbeatRequest, context: Context
    ) -> api.HeartbeatResponse:
        return api.HeartbeatResponse(status=ok())

    async def notify_client_termination(
        self, request: api.NotifyClientTerminationRequest, context: Context
    ) -> api.NotifyClientTerminationResponse:
        return api.NotifyClientTerminationResponse(status=ok())

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
                )
            except ApiError as err:
                yield api.TelemetryCommand(status=err.status)
                continue
            yield api.TelemetryCommand(status=ok(), settings=settings)
