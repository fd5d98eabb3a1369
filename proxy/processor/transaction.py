"""Transactions: end a half message on its broker, and route a broker's transaction-state
check to a producer of the message's group that holds a Telemetry stream on this proxy.

The proxy keeps no transaction state. What EndTransaction needs (broker, commit-log offset,
offset in the half queue) travels in the transaction id the client was given, so any proxy
can end any transaction.

What it does keep is soft and tied to live connections: the producer groups (a producer's
group is its topic, as in Apache RocketMQ's proxy) of the Telemetry streams open on this
proxy. Every ``heartbeat_s`` (and at once when a group first appears) it names them to
the brokers of each group's topic in a HEART_BEAT on its one connection per broker (and
again at once on a new connection: a broker that restarted knows no producer, and it counts
every check it could not send against the message's ``transactionCheckMax``); a
broker's check of a half message goes to a connection that named the message's group,
i.e. to a proxy with a live producer of that group, and that proxy writes it to one of its
streams for the group. When a proxy dies its broker connections close, the brokers forget
it, and their next check of the same half message goes to another proxy that named the
group (brokers check again every ``transactionCheckInterval`` until ``transactionCheckMax``).

A broker picks one of the channels that named the group, in turn, for each check; with
registrations on, a producer's slot connection (``processor/registrations.py``) names its
group as well. So every connection the pool makes hands its checks here
(``BrokerPool.extra_connection``): a check that reached this proxy on any of them goes to a
producer, and each check's outcome is counted (``CheckOutcome``, on /metrics as
``rocketmq_proxy_transaction_checks_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from proxy.background import start_background, stop_background
from proxy.brokers import BrokerPool, TopicNotFound
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import RequestCode
from proxy.remoting.command import RemotingCommand
from proxy.remoting.headers import CheckTransactionStateHeader, EndTransactionHeader, HeaderError
from proxy.remoting.message import MessageExt, Prop, decode_messages

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HalfMessageRef:
    """Where a half message is: what END_TRANSACTION names."""

    broker: str
    commit_log_offset: int
    tran_state_table_offset: int
    msg_id: str


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """A broker's question about a half message, for a producer of ``group``."""

    group: str
    ref: HalfMessageRef
    message: MessageExt


# A producer's Telemetry stream: takes a check, False when it cannot (stream full or gone).
CheckSink = Callable[[TransactionCheck], bool]


class CheckOutcome(enum.StrEnum):
    """What became of a broker's transaction check on this proxy."""

    RELAYED = "relayed"  # written to a producer stream of the message's group
    NO_PRODUCER = "no_producer"  # no stream of the group here took it
    UNREADABLE = "unreadable"  # a header or body the proxy could not read


class TransactionProcessor:
    def __init__(
        self,
        pool: BrokerPool,
        client_id: str,
        heartbeat_s: float = 10.0,
        broker_timeout_s: float = 3.0,
        on_check: Callable[[CheckOutcome], None] | None = None,
    ) -> None:
        """``on_check`` is told the outcome of every check a broker sent (the metric)."""
        self.pool = pool
        self.client_id = client_id
        self.heartbeat_s = heartbeat_s
        self.broker_timeout_s = broker_timeout_s
        self._sinks: dict[str, dict[int, CheckSink]] = {}
        self._ids = itertools.count()
        self._turn = itertools.count()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.checks: dict[CheckOutcome, int] = dict.fromkeys(CheckOutcome, 0)
        self._on_check = on_check

    def start(self) -> None:
        self.pool.serve(RequestCode.CHECK_TRANSACTION_STATE, self.on_broker_request)
        self.pool.on_connect(self._on_broker_connected)
        self._task = start_background(self._heartbeats(), name="producer-heartbeats", log=log)

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_background(task)

    # -- producers on this proxy ------------------------------------------------------------

    def register(self, groups: list[str], sink: CheckSink) -> Callable[[], None]:
        """A producer stream of ``groups``; returns the call that forgets it."""
        key = next(self._ids)
        new = False
        for group in groups:
            sinks = self._sinks.setdefault(group, {})
            new = new or not sinks
            sinks[key] = sink
        if new:
            self._kick.set()

        def unregister() -> None:
            for group in groups:
                sinks = self._sinks.get(group)
                if sinks is not None:
                    sinks.pop(key, None)
                    if not sinks:
                        del self._sinks[group]

        return unregister

    def _on_broker_connected(self, broker: str) -> None:
        # A restarted broker checks its half messages before our next round would name
        # the groups to it, and a check with no producer to go to still counts: with a
        # check every second (the soak's brokers), a message's 15 can run out in the gap,
        # and it is dropped unresolved. The round starts now instead.
        if self._sinks:
            self._kick.set()

    @property
    def groups(self) -> list[str]:
        return sorted(self._sinks)

    async def _heartbeats(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.heartbeat_s)
            self._kick.clear()
            try:
                await self.heartbeat_once()
            except Exception:  # never let one bad round end the loop
                log.exception("producer heartbeat round failed")

    async def heartbeat_once(self) -> None:
        """Name every group with a live producer here to the brokers of its topic, and to
        those that served it lately (``BrokerPool.recent_brokers``): a broker back from a
        crash checks its half messages as soon as it runs, and counts each check that
        finds no producer, while the route lists it again only at its next refresh."""
        per_broker: dict[str, list[str]] = {}
        for group in self.groups:
            try:
                route = await self.pool.route(group)
            except (TopicNotFound, RemotingError):
                continue
            names = {b.name for b in route.brokers} | set(self.pool.recent_brokers(group))
            for name in sorted(names):
                per_broker.setdefault(name, []).append(group)
        for name, groups in per_broker.items():
            client = self.pool.broker(name)
            if client is None:
                continue
            try:
                await client.heartbeat(self.client_id, groups, self.broker_timeout_s)
            except RemotingError as exc:
                log.info("producer heartbeat to %s failed: %s", name, exc)

    # -- the broker's side ------------------------------------------------------------------

    def on_broker_request(self, broker: str, cmd: RemotingCommand) -> RemotingCommand | None:
        """A request a broker sent on our connection; only CHECK_TRANSACTION_STATE is
        served (one-way: nothing to answer)."""
        if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        try:
            header = CheckTransactionStateHeader.decode(cmd.ext_fields)
            messages = decode_messages(cmd.body)
        except (HeaderError, ValueError) as exc:
            self._count(CheckOutcome.UNREADABLE)
            log.warning("bad CHECK_TRANSACTION_STATE from %s: %s", broker, exc)
            return None
        if not messages:
            self._count(CheckOutcome.UNREADABLE)
            log.warning("CHECK_TRANSACTION_STATE from %s carried no message", broker)
            return None
        message = messages[0]
        group = message.properties.get(Prop.PRODUCER_GROUP, "")
        ref = HalfMessageRef(
            broker,
            header.commit_log_offset,
            header.tran_state_table_offset,
            header.msg_id or message.msg_id,
        )
        self.deliver(TransactionCheck(group, ref, message))
        return None

    def deliver(self, check: TransactionCheck) -> bool:
        """Hand the check to one producer stream of its group (round-robin); False when
        none here takes it (the broker asks again at its next check)."""
        sinks = list(self._sinks.get(check.group, {}).values())
        start = next(self._turn)
        for i in range(len(sinks)):
            if sinks[(start + i) % len(sinks)](check):
                self._count(CheckOutcome.RELAYED)
                return True
        self._count(CheckOutcome.NO_PRODUCER)
        log.info("no producer of %r on this proxy for a transaction check", check.group)
        return False

    def _count(self, outcome: CheckOutcome) -> None:
        self.checks[outcome] += 1
        if self._on_check is not None:
            self._on_check(outcome)

    async def end(
        self,
        ref: HalfMessageRef,
        group: str,
        topic: str,
        resolution: int,
        transaction_id: str,
        from_check: bool,
    ) -> None:
        """Send END_TRANSACTION (commit or rollback type) for the half message. Raises
        BrokerError/RemotingError, LookupError when the broker is not known."""
        client = await self.pool.broker_by_name(ref.broker, topic)
        if client is None:
            raise LookupError(f"broker {ref.broker!r} is not in the route of {topic!r}")
        header = EndTransactionHeader(
            producer_group=group,
            tran_state_table_offset=ref.tran_state_table_offset,
            commit_log_offset=ref.commit_log_offset,
            commit_or_rollback=resolution,
            msg_id=ref.msg_id,
            topic=topic,
            from_transaction_check=from_check,
            transaction_id=transaction_id,
        )
        await client.end_transaction(header)
