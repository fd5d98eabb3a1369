"""A Telemetry stream's outbox and pace: the commands queued for one client, how fast the
client may send its own, and how a drain ends the stream.

The session (``proxy.api.session``) owns the streams; this module holds what each stream
carries apart from the session's bookkeeping.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable

import grpc

from proxy.api.context import Context
from proxy.api.convert import half_message_to_api
from proxy.api.transaction import encode_transaction_id
from proxy.api.v2 import service_pb2 as api
from proxy.processor.transaction import TransactionCheck

Outbox = asyncio.Queue[api.TelemetryCommand | None]

# Commands queued for one Telemetry stream; a check that does not fit is dropped (the
# broker asks again), so a client that does not read costs bounded memory.
OUTBOX_LIMIT = 256

# Commands one stream may send at once, then per second. The official clients send their
# settings when they open the stream and again every few minutes, and answer the server's
# commands (this proxy sends none that ask for an answer). A stream past its rate is
# answered TOO_MANY_REQUESTS and ended, where a flood would otherwise take the proxy's CPU
# from every other client. Not slowed down instead: a stream whose commands are read late
# lets its client fill gRPC's receive window, which grows to megabytes per stream
# (bench/hostile.py measured 5 MB each), in the proxy's memory.
COMMAND_BURST = 20
COMMANDS_PER_S = 1.0


class CommandPace:
    """A token bucket for the commands of one Telemetry stream: ``burst`` at once, then
    ``per_s`` a second."""

    def __init__(self, burst: int, per_s: float) -> None:
        self.burst = burst
        self.per_s = per_s
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> bool:
        """Take a token; False when there is none (the stream is past its pace)."""
        now = time.monotonic()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.per_s)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class DrainEnd(enum.Enum):
    """How a drain ends a client's Telemetry stream, by the client's ``x-mq-language``.

    - COMMAND (Java, and any other): a ReconnectEndpointsCommand, then an OK end. The Java
      client logs the command and reopens its stream a second after the end, by then on
      a new connection (the server's GOAWAY left 0.2 s before).
    - UNAVAILABLE (Python, "PYTHON"): the command (dropped without a word), then an
      UNAVAILABLE end (``end_for_drain``).
    - QUIET (Node, which says "HTTP"): no command, an OK end. The Node client answers the
      command by reopening its stream at once on the same channel, whose connection is the
      one being drained: gRPC's core holds that new call, which no handler takes any more,
      until the server's grace ends, then cancels it ("UNAVAILABLE: Cancelling all calls",
      an ERROR in the client's log), and the drain lasts its whole grace. After an OK end
      it reopens a second later, on a new connection.
    """

    COMMAND = "command"
    UNAVAILABLE = "unavailable"
    QUIET = "quiet"

    @classmethod
    def of(cls, language: str | None) -> DrainEnd:
        return {"PYTHON": cls.UNAVAILABLE, "HTTP": cls.QUIET}.get(language or "", cls.COMMAND)


async def end_for_drain(context: Context) -> None:
    """End a Python client's stream with UNAVAILABLE rather than OK. Each client logs one
    of the two ends as an error: the Java and Node clients an error status (ERROR), and
    reopen after a second on both; the Python client (5.1.2) an OK end (it reads the end
    as a message, an ERROR), a status only at WARN, and reopens on neither (its stream
    comes back with its next settings sync, within 5 minutes)."""
    await context.abort(grpc.StatusCode.UNAVAILABLE, "the proxy is draining")


def end_with(outbox: Outbox, last: api.TelemetryCommand) -> None:
    """End a stream with ``last`` as soon as what is being written is: what is still
    queued is dropped (a transaction check the broker asks again)."""
    while not outbox.empty():
        outbox.get_nowait()
    outbox.put_nowait(last)
    outbox.put_nowait(None)


def offer(outbox: Outbox, command: api.TelemetryCommand) -> bool:
    """Queue a command for the client's stream without waiting; False when it is full."""
    try:
        outbox.put_nowait(command)
    except asyncio.QueueFull:
        return False
    return True


def lite_unsubscribe_sink(
    outbox: Outbox,
) -> Callable[[str], bool]:
    def deliver(lite_topic: str) -> bool:
        command = api.TelemetryCommand(
            notify_unsubscribe_lite_command=api.NotifyUnsubscribeLiteCommand(lite_topic=lite_topic)
        )
        return offer(outbox, command)

    return deliver


def transaction_check_sink(
    outbox: Outbox,
) -> Callable[[TransactionCheck], bool]:
    def deliver(check_: TransactionCheck) -> bool:
        command = api.TelemetryCommand(
            recover_orphaned_transaction_command=api.RecoverOrphanedTransactionCommand(
                message=half_message_to_api(check_.message),
                transaction_id=encode_transaction_id(check_.ref),
            )
        )
        return offer(outbox, command)

    return deliver
