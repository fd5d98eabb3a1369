"""A client's session: Heartbeat, the Settings exchange on Telemetry, termination, and the
transaction checks a producer's Telemetry stream carries.

The proxy keeps no session state beyond the open Telemetry streams of producers, which it
names to the brokers so that their transaction checks reach a producer
(``processor/transaction.py``). A consumer's settings say whether its group is FIFO
(``subscription.fifo``, from the group's config on the brokers). Heartbeats and
termination tell the handle renewer whether a push consumer is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from proxy.api import validation as check
from proxy.api.context import Context
from proxy.api.convert import half_message_to_api
from proxy.api.errors import ApiError, ok
from proxy.api.settings import answer_settings
from proxy.api.transaction import encode_transaction_id
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.config import ProxyConfig
from proxy.groups import GroupSettings
from proxy.processor.renewal import HandleRenewer
from proxy.processor.transaction import TransactionCheck, TransactionProcessor

# Commands queued for one Telemetry stream; a check that does not fit is dropped (the
# broker asks again), so a client that does not read costs bounded memory.
OUTBOX_LIMIT = 256


class SessionActivity:
    def __init__(
        self,
        config: ProxyConfig,
        groups: GroupSettings,
        renewer: HandleRenewer,
        transactions: TransactionProcessor | None = None,
    ) -> None:
        self.config = config
        self.groups = groups
        self.renewer = renewer
        self.transactions = transactions

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
        """Answer each Settings the client writes with the completed settings, status OK;
        while a producer's stream is open, write it the transaction checks of its topics."""
        try:
            check.require_client_id(context)
        except ApiError as err:
            yield api.TelemetryCommand(status=err.status)
            return
        outbox: asyncio.Queue[api.TelemetryCommand | None] = asyncio.Queue(OUTBOX_LIMIT)
        unregister: list[Callable[[], None]] = []
        reader = asyncio.get_running_loop().create_task(self._read(commands, outbox, unregister))
        try:
            while True:
                command = await outbox.get()
                if command is None:
                    break
                yield command
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader  # the client's stream may have failed; nothing to tell it
            for forget in unregister:
                forget()

    async def _read(
        self,
        commands: AsyncIterator[api.TelemetryCommand],
        outbox: asyncio.Queue[api.TelemetryCommand | None],
        unregister: list[Callable[[], None]],
    ) -> None:
        try:
            async for command in commands:
                if command.WhichOneof("command") != "settings":
                    continue  # results of commands we sent (nothing to do with them)
                try:
                    settings = answer_settings(
                        command.settings,
                        max_body_bytes=self.config.max_body_bytes,
                        max_polling_ms=self.config.receive.max_polling_ms,
                        max_attempts=self.config.receive.max_delivery_attempts,
                        fifo=await self._fifo(command.settings),
                    )
                except ApiError as err:
                    await outbox.put(api.TelemetryCommand(status=err.status))
                    continue
                if not unregister and self.transactions is not None:
                    topics = [t.name for t in command.settings.publishing.topics]
                    if topics:
                        unregister.append(self.transactions.register(topics, _sink(outbox)))
                await outbox.put(api.TelemetryCommand(status=ok(), settings=settings))
        finally:
            # The client closed its side (or the stream failed): end ours. A full outbox
            # means the writer is gone too; it is cancelled with the stream.
            with contextlib.suppress(asyncio.QueueFull):
                outbox.put_nowait(None)


def _sink(
    outbox: asyncio.Queue[api.TelemetryCommand | None],
) -> Callable[[TransactionCheck], bool]:
    def deliver(check_: TransactionCheck) -> bool:
        command = api.TelemetryCommand(
            recover_orphaned_transaction_command=api.RecoverOrphanedTransactionCommand(
                message=half_message_to_api(check_.message),
                transaction_id=encode_transaction_id(check_.ref),
            )
        )
        try:
            outbox.put_nowait(command)
        except asyncio.QueueFull:
            return False
        return True

    return deliver
