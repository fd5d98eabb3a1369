"""What a client long poll asks for and what it gets."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import PollMode
from proxy.groups import DEFAULT_RETRY_MAX_TIMES
from proxy.processor.consumer import Popped
from proxy.receive.timeline import Timeline
from proxy.remoting.filter import ExpressionType
from proxy.remoting.message import MessageExt, Prop


@dataclass(slots=True)
class ReceiveRequest:
    group: str
    topic: str
    expression: str  # a validated tag expression, or a SQL92 one (the broker parses it)
    batch_size: int
    invisible_ms: int
    polling_ms: int  # the long-polling time granted (0 for a short poll)
    answer_by: float  # loop time by which the answer must be on its way
    arrived_at: float  # loop time
    expression_type: ExpressionType = ExpressionType.TAG
    broker_hint: str | None = None  # the broker the client's message queue names
    # A FIFO group: every pop and probe is orderly; a retried receive repeats attempt_id.
    fifo: bool = False
    attempt_id: str | None = None
    # The group's deliveries: a message popped past them goes to %DLQ%<group> instead.
    max_attempts: int = DEFAULT_RETRY_MAX_TIMES + 1
    # Served on the broker it names only (a push consumer's poll, with
    # receive.push_named_broker_only; docs/design.md).
    named_broker_only: bool = False
    # Decided once, by the engine, before anything else; it travels with the request to
    # the poll and to the record.
    mode: PollMode | None = None


@dataclass(slots=True)
class PolledMessage:
    """A message popped from ``broker`` for a client of ``group``."""

    broker: str
    group: str
    message: MessageExt
    lite: bool = False  # popped by POP_LITE_MESSAGE (RocketMQ 5.5 lite topics)

    @property
    def receipt_handle(self) -> str:
        """POP_CK plus the commit-log offset: nine fields, as the RocketMQ proxy forms it."""
        ck = self.message.properties[Prop.POP_CK]
        return f"{ck} {self.message.commit_log_offset}"

    @property
    def popped(self) -> Popped:
        """What the consumer processor needs to ack, hand back or dead-letter it."""
        msg = self.message
        return Popped(
            self.broker,
            self.group,
            msg.topic,
            msg.properties[Prop.POP_CK],
            msg.commit_log_offset,
            msg.msg_id,
            msg.properties.get(Prop.LITE_TOPIC) if self.lite else None,
        )


@dataclass(slots=True)
class ReceiveResult:
    messages: list[PolledMessage]
    is_short_polling_hit: bool
    pops: int
    probes: int  # NOTIFICATION requests (the record's ``notifications``)
    timeline: Timeline | None = None  # the poll's stages, when the timeline log is on

    @property
    def broker(self) -> str | None:
        """The broker that delivered (one poll pops from one broker)."""
        return self.messages[0].broker if self.messages else None
