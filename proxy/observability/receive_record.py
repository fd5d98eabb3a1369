"""The one record of each client ReceiveMessage: a metric sample and an event-log line.

The record is filled in as the request goes (arrival, validation, the poll, the writes to
the client's stream) and written once, when the request ends, by ``ReceiveRecorder``.
Nothing is looked up again afterwards: every value was decided before or during the poll.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.config import PollMode
from proxy.observability.eventlog import EventLog
from proxy.observability.metrics import ProxyMetrics
from proxy.observability.receive_event import ReceiveEvent


class Outcome(enum.StrEnum):
    """How a ReceiveMessage ended, for the record (an error carries its code's name)."""

    FOUND = "found"  # messages were written to the client
    EMPTY = "empty"  # answered MESSAGE_NOT_FOUND
    CANCELLED = "cancelled"  # the client went away; what it did not get was handed back
    WRITE_FAILED = "write_failed"  # the stream broke while messages were written
    ERROR = "error"  # answered with an error status (``ReceiveRecord.code_name``)


@dataclass(slots=True)
class ReceiveRecord:
    arrived_at: float  # loop time
    arrived_ms: int  # epoch ms
    mode: PollMode
    group: str = ""  # "" when it failed validation, so label values stay bounded
    topic: str = ""
    is_long_polling: bool = False
    polling_ms: int = 0
    is_short_polling_hit: bool = False
    pops: int = 0
    notifications: int = 0
    messages: int = 0  # messages written to the client
    broker: str | None = None  # the broker that delivered them
    # Until the request says otherwise it failed: an exception nobody expected is recorded
    # as the internal error the client sees.
    outcome: Outcome = Outcome.ERROR
    code_name: str = "internal_server_error"

    def ended(self, outcome: Outcome, code_name: str) -> None:
        """The request ended as ``outcome``, answered with status ``code_name`` (or, when
        the stream ended without a status, the outcome's own name)."""
        self.outcome = outcome
        self.code_name = code_name

    @property
    def result(self) -> str:
        """The event log's ``result``: found / empty / cancelled / write_failed, or the
        name of the error code answered."""
        return self.code_name if self.outcome is Outcome.ERROR else self.outcome.value

    @property
    def metric_result(self) -> str:
        """The metric's ``result`` label: found / empty / error."""
        if self.outcome in (Outcome.FOUND, Outcome.EMPTY):
            return self.outcome.value
        return "error"


class ReceiveRecorder:
    """Writes each ReceiveRecord once: the receive metrics, the gRPC latency sample and,
    when an event log is configured, one event."""

    def __init__(self, proxy_id: str, metrics: ProxyMetrics, events: EventLog | None) -> None:
        self.proxy_id = proxy_id
        self.metrics = metrics
        self.events = events

    def record(self, rec: ReceiveRecord, wait_s: float) -> None:
        """A ReceiveMessage: its RPC sample, then its receive record."""
        self.metrics.rpc(
            "grpc",
            "receive_message",
            rec.code_name,
            wait_s,
            is_long_polling=rec.is_long_polling,
        )
        self.record_receive(rec, wait_s)

    def record_receive(self, rec: ReceiveRecord, wait_s: float) -> None:
        """The receive metrics and event of ``rec`` alone: a remoting pull or pop, whose
        RPC sample the remoting port writes itself."""
        self.metrics.receive_done(
            rec.group,
            rec.topic,
            rec.mode.value,
            rec.is_long_polling,
            rec.is_short_polling_hit,
            rec.metric_result,
            wait_s,
        )
        if self.events is not None:
            self.events.write(
                ReceiveEvent(
                    ts=rec.arrived_ms,
                    proxy=self.proxy_id,
                    group=rec.group,
                    topic=rec.topic,
                    mode=rec.mode.value,
                    is_long_polling=rec.is_long_polling,
                    is_short_polling_hit=rec.is_short_polling_hit,
                    polling_ms=rec.polling_ms,
                    wait_ms=int(wait_s * 1000),
                    messages=rec.messages,
                    result=rec.result,
                    pops=rec.pops,
                    notifications=rec.notifications,
                    broker=rec.broker,
                )
            )
