"""Transactional (half) messages, as a RocketMQ broker keeps them.

A half message is stored in the system half topic, invisible to consumers, until the
producer ends it: END_TRANSACTION commits it (it goes to its own topic, through the
delivery scheduler, so a timed half message still waits for its time) or rolls it back.
One left open longer than ``transaction_timeout_ms`` (or its own
CHECK_IMMUNITY_TIME_IN_SECONDS) is checked: every ``transaction_check_interval_ms`` a
CHECK_TRANSACTION_STATE goes, one-way, to a connection whose last HEART_BEAT named the
message's producer group (``PGROUP``); after ``transaction_check_max`` checks the message
is dropped, as RocketMQ discards it. Each check counts, whether a producer could be asked or
not, and a message committed after checks carries ``TRANSACTION_CHECK_TIMES``: the number of
the check it was ended on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from dataclasses import dataclass

import orjson

from broker_stub.store import MessageStore, PutResult
from broker_stub.timers import DeliveryScheduler
from proxy.background import start_background, stop_background
from proxy.remoting.codes import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    RequestCode,
)
from proxy.remoting.command import RemotingCommand
from proxy.remoting.connection import RemotingConnection
from proxy.remoting.headers import CheckTransactionStateHeader, EndTransactionHeader, now_ms
from proxy.remoting.message import MessageExt, Prop, encode_message

log = logging.getLogger(__name__)

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
# A producer connection not heard from for this long is forgotten (RocketMQ: 120 s).
PRODUCER_EXPIRY_MS = 120_000


@dataclass
class HalfMessage:
    message: MessageExt  # as the producer sent it, in its own topic
    stored: MessageExt  # as stored in the half topic (offsets filled in)
    born_ms: int
    checks: int = 0
    next_check_ms: int = 0


class TransactionService:
    def __init__(
        self,
        store: MessageStore,
        scheduler: DeliveryScheduler,
        loop: asyncio.AbstractEventLoop,
        *,
        check_interval_ms: int,
        timeout_ms: int,
        check_max: int,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.loop = loop
        self.check_interval_ms = check_interval_ms
        self.timeout_ms = timeout_ms
        self.check_max = check_max
        self.half: dict[int, HalfMessage] = {}  # by commit-log offset
        self.producers: dict[str, dict[RemotingConnection, int]] = {}  # group -> last seen
        self._turn = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self.checks_sent = 0

    def start(self) -> None:
        self._task = start_background(self._check_loop(), name="transaction-check", log=log)

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop_background(task)

    # -- producers --------------------------------------------------------------------------

    def heartbeat(self, body: bytes, conn: RemotingConnection) -> None:
        """Remember the producer groups a HEART_BEAT names, for this connection."""
        try:
            data = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            return
        now = now_ms()
        for producer in data.get("producerDataSet") or []:
            group = producer.get("groupName") if isinstance(producer, dict) else None
            if isinstance(group, str) and group:
                self.producers.setdefault(group, {})[conn] = now

    def _producer(self, group: str) -> RemotingConnection | None:
        conns = self.producers.get(group, {})
        now = now_ms()
        for conn, seen in list(conns.items()):
            if conn.closed or now - seen > PRODUCER_EXPIRY_MS:
                del conns[conn]
        if not conns:
            return None
        live = list(conns)
        return live[next(self._turn) % len(live)]

    # -- half messages ----------------------------------------------------------------------

    def put_half(self, msg: MessageExt) -> PutResult:
        held = dataclasses.replace(
            msg, properties=dict(msg.properties), topic=HALF_TOPIC, queue_id=0
        )
        held.properties[Prop.REAL_TOPIC] = msg.topic
        held.properties[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
        held.sys_flag |= TRANSACTION_PREPARED_TYPE
        result = self.store.put(held)
        stored = dataclasses.replace(
            msg,
            properties=dict(msg.properties),
            commit_log_offset=result.physical_offset,
            queue_offset=result.queue_offset,
            sys_flag=msg.sys_flag | TRANSACTION_PREPARED_TYPE,
            store_timestamp=now_ms(),
        )
        self.half[result.physical_offset] = HalfMessage(msg, stored, now_ms())
        return result

    def end(self, header: EndTransactionHeader) -> bool:
        """Commit or roll back; False when no such half message is open."""
        if header.commit_or_rollback not in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE):
            return True  # NOT_TYPE: nothing to do yet
        entry = self.half.pop(header.commit_log_offset, None)
        if entry is None:
            return False
        if header.commit_or_rollback == TRANSACTION_COMMIT_TYPE:
            msg = dataclasses.replace(entry.message, properties=dict(entry.message.properties))
            msg.properties.pop(Prop.TRANSACTION_PREPARED, None)
            if entry.checks:  # as RocketMQ: the committed message says which check ended it
                msg.properties[Prop.TRANSACTION_CHECK_TIMES] = str(entry.checks)
            msg.sys_flag &= ~TRANSACTION_PREPARED_TYPE
            self.scheduler.put(msg)
        return True

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(min(self.check_interval_ms, 1000) / 1000)
            try:
                self.check_once()
            except Exception:  # the loop must outlive one bad message
                log.exception("transaction check round failed")

    def check_once(self) -> None:
        now = now_ms()
        for offset, entry in list(self.half.items()):
            immunity_s = entry.message.properties.get(Prop.CHECK_IMMUNITY_TIME_IN_SECONDS, "")
            wait_ms = int(immunity_s) * 1000 if immunity_s.isdigit() else self.timeout_ms
            if now - entry.born_ms < wait_ms or now < entry.next_check_ms:
                continue
            if entry.checks >= self.check_max:
                log.info(
                    "half message %s dropped after %d checks", entry.stored.msg_id, entry.checks
                )
                del self.half[offset]
                continue
            entry.checks += 1
            entry.next_check_ms = now + self.check_interval_ms
            group = entry.message.properties.get(Prop.PRODUCER_GROUP, "")
            conn = self._producer(group)
            if conn is None:
                continue
            stored = entry.stored
            stored.properties[Prop.TRANSACTION_CHECK_TIMES] = str(entry.checks)
            header = CheckTransactionStateHeader(
                tran_state_table_offset=stored.queue_offset,
                commit_log_offset=stored.commit_log_offset,
                msg_id=stored.msg_id,
                transaction_id=stored.msg_id,
                offset_msg_id=stored.offset_msg_id,
                topic=stored.topic,
            )
            request = RemotingCommand(
                RequestCode.CHECK_TRANSACTION_STATE, header.encode(), encode_message(stored)
            )
            request.opaque = next(_opaques)
            request.flag |= 0x2  # one-way, as Broker2Client sends it
            if conn.send(request):
                self.checks_sent += 1


_opaques = itertools.count(1)
