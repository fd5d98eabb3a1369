"""Invisible-time renewal for push consumers: the one piece of state the proxy keeps.

A push consumer's ReceiveMessage sets ``auto_renew`` and no invisible duration: the
official clients (Java, Python, Node) never renew a message themselves while their listener
consumes it; they rely on the proxy, as the Apache proxy does it
(``ReceiveMessageActivity`` with ``enableProxyAutoRenew``, ``DefaultReceiptHandleManager``):

- the message is popped with a *slice* of invisible time (``renew_slice_ms``, 30 s);
- every ``period_s`` (5 s) each handle due within ``ahead_ms`` (10 s) of visibility gets
  one slice more (CHANGE_MESSAGE_INVISIBLETIME), for at most ``max_time_ms`` (3 h) from
  delivery, then it is handed back with the retry back-off of its attempt. The Apache
  proxy renews by 1, 3, 5, 10, 30 min then 1 h (``RenewStrategyPolicy``), fewer requests
  for a long consumption, but a message it renewed stays invisible for up to that long
  once the proxy is gone; one slice at a time bounds that to a slice (measured:
  docs/reliability.md, "Push consumers across a proxy crash");
- an ack, a change of invisible time or a forward to the dead-letter queue through this
  proxy ends the renewal and is made with the handle's *current* checkpoint (the client
  still holds the one it received, which the renewals have replaced on the broker); a
  message acked is remembered for ``acked_memory_s`` (60 s), so that the client's retry of
  an ack whose answer it did not wait for is answered OK, not "expired";
- a client that says goodbye (NotifyClientTermination) or is not heard from for
  ``client_idle_s`` has its messages handed back with ``clear_invisible_ms`` (1 s); a
  client that holds a Telemetry stream here is heard (``streams_open``): after its
  connection's age GOAWAY its calls go to another proxy, but its stream stays here.

The state: one entry per message delivered to a push consumer and not yet settled, at most
``max_handles`` (past that a message simply keeps its slice and is redelivered after it if
its consumer is slower). If this proxy dies the renewals stop: each message comes back when
its current slice ends and is delivered again with the attempt counted up: at-least-once,
as with any lost consumer. The client's later ack with its original handle then finds a
checkpoint the renewals replaced: the message is consumed twice. A push consumer's acks
must therefore reach the proxy that delivered to it. One gRPC channel per endpoint (one
connection at a time, gRPC's pick_first) does this, through any L4 balancer too, until
the connection ages or its proxy drains; in a fleet, the handle names this proxy
(``member``) and the proxy the ack reaches borrows the current checkpoint from it
(``proxy/fleet/settle.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from proxy.background import start_background, stop_background
from proxy.processor.consumer import ConsumerProcessor, Popped
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import DELAY_LEVELS_S
from proxy.remoting.popinfo import PopCheckpointInfo

log = logging.getLogger(__name__)

# (group, broker, retry flag, queue id, queue offset, lite topic): a message, whatever its
# handle. Lite messages of one broker all say queue 0 and their own lite queue's offset, so
# their lite topic ("" for others) tells them apart.
HandleKey = tuple[str, str, int, int, int, str]


def handle_key(group: str, ck: PopCheckpointInfo, lite_topic: str | None = None) -> HandleKey:
    return (group, ck.broker_name, ck.retry, ck.queue_id, ck.queue_offset, lite_topic or "")


@dataclass(slots=True, eq=False)
class Renewal:
    """One message a push consumer holds: renewed until it is settled."""

    client_id: str
    popped: Popped  # checkpoint: the current one
    reconsume_times: int
    delivered_ms: int
    handed_pop_time: int  # of the checkpoint the client holds (the one it was delivered)
    failures: int = 0
    renewing: asyncio.Future[None] | None = None
    settling: int = 0  # acks (changes, forwards) in flight with its checkpoint: not renewed

    @property
    def checkpoint(self) -> PopCheckpointInfo:
        return PopCheckpointInfo.parse(self.popped.checkpoint)


class HandleRenewer:
    def __init__(
        self,
        consumer: ConsumerProcessor,
        *,
        slice_ms: int = 30_000,
        ahead_ms: int = 10_000,
        period_s: float = 5.0,
        max_time_ms: int = 3 * 3600 * 1000,
        max_handles: int = 100_000,
        client_idle_s: float = 60.0,
        clear_invisible_ms: int = 1_000,
        max_failures: int = 3,
        acked_memory_s: float = 60.0,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.consumer = consumer
        self.slice_ms = slice_ms
        self.ahead_ms = ahead_ms
        self.period_s = period_s
        self.max_time_ms = max_time_ms
        self.max_handles = max_handles
        self.client_idle_s = client_idle_s
        self.clear_invisible_ms = clear_invisible_ms
        self.max_failures = max_failures
        self.acked_memory_s = acked_memory_s
        self.clock_ms = clock_ms
        self._handles: dict[HandleKey, Renewal] = {}
        # Messages acked through this proxy, oldest first: key -> (loop time of the ack, pop
        # time of the handle its client holds).
        self._acked: OrderedDict[HandleKey, tuple[float, int]] = OrderedDict()
        self._last_seen: dict[str, float] = {}  # client id -> loop time
        self._task: asyncio.Task[None] | None = None
        self._leaving = False  # handing over to an heir: no renewal starts
        # This proxy's fleet address, which the handles it delivers name ("" without a
        # fleet), and whether a client holds a Telemetry stream here: both set by the app.
        self.member = ""
        self.streams_open: Callable[[str], bool] = lambda client_id: False
        self.renewed = 0
        self.dropped = 0  # not tracked: over max_handles

    @property
    def size(self) -> int:
        return len(self._handles)

    def start(self) -> None:
        if self._task is None:
            self._task = start_background(self._run(), name="push-renewal", log=log)

    # -- what the activities tell it ---------------------------------------------------------

    def seen(self, client_id: str) -> None:
        """The client is alive (any RPC of it); only clients with handles are tracked."""
        if client_id in self._last_seen:
            self._last_seen[client_id] = asyncio.get_running_loop().time()

    def add(self, client_id: str, popped: Popped, reconsume_times: int) -> None:
        """A message delivered to a push consumer: keep it invisible until it is settled."""
        checkpoint = PopCheckpointInfo.parse(popped.checkpoint)
        renewal = Renewal(client_id, popped, reconsume_times, self.clock_ms(), checkpoint.pop_time)
        self._hold(handle_key(popped.group, checkpoint, popped.lite_topic), renewal)

    def _hold(self, key: HandleKey, renewal: Renewal) -> bool:
        """Renew ``renewal`` from now on, its client heard now; False (counted as
        ``dropped``) when ``max_handles`` are held already."""
        if key not in self._handles and len(self._handles) >= self.max_handles:
            self.dropped += 1
            return False
        self._handles[key] = renewal
        self._last_seen[renewal.client_id] = asyncio.get_running_loop().time()
        return True

    async def begin_settle(
        self, group: str, checkpoint: PopCheckpointInfo, lite_topic: str | None = None
    ) -> Renewal | None:
        """An ack (change, forward) of the message ``checkpoint`` names is about to be
        made: its renewal, whose ``popped`` holds the current checkpoint to make it with,
        or None when this proxy does not renew it. Waits for a renewal in flight; no
        renewal starts until ``end_settle``. A retry that arrives while the first try is
        still in flight (the client gave up waiting) gets the same checkpoint."""
        key = handle_key(group, checkpoint, lite_topic)
        entry = self._handles.get(key)
        if entry is None:
            return None
        # Counted before the wait, so that no hand-over gives the message away meanwhile.
        entry.settling += 1
        if entry.renewing is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(entry.renewing), self.consumer.broker_timeout_s + 1
                )
        return entry

    def end_settle(self, entry: Renewal, settled: bool, *, by_ack: bool = False) -> None:
        """The ack (change, forward) made with ``entry``'s checkpoint is done: ``settled``,
        the renewal ends; else it goes on, and the client's retry, made with the handle
        it holds (which the renewals replaced on the broker), still finds the current one.
        The Apache proxy drops it when the ack fails, so the retry settles nothing and the
        message comes back (apache/rocketmq#11174).

        ``by_ack``: an ack, remembered once settled (``was_acked``): the client may
        have given up waiting for this answer, and its retry carries a handle that has
        expired by now."""
        entry.settling -= 1
        if not settled:
            return
        popped = entry.popped
        key = handle_key(popped.group, entry.checkpoint, popped.lite_topic)
        if self._handles.get(key) is entry:
            del self._handles[key]
        if by_ack:
            self._remember_ack(key, entry.handed_pop_time)

    def was_acked(
        self, group: str, checkpoint: PopCheckpointInfo, lite_topic: str | None = None
    ) -> bool:
        """Whether this proxy acked, within ``acked_memory_s``, the message ``checkpoint``
        names, delivered with this very checkpoint (not a message a restarted stub stored
        at the same offset since): a retried ack of it is answered OK without the broker."""
        self._forget_old_acks()
        acked = self._acked.get(handle_key(group, checkpoint, lite_topic))
        return acked is not None and acked[1] == checkpoint.pop_time

    def _remember_ack(self, key: HandleKey, handed_pop_time: int) -> None:
        self._acked[key] = (asyncio.get_running_loop().time(), handed_pop_time)
        self._acked.move_to_end(key)
        while len(self._acked) > self.max_handles:
            self._acked.popitem(last=False)
        self._forget_old_acks()

    def _forget_old_acks(self) -> None:
        if not self._acked:
            return
        horizon = asyncio.get_running_loop().time() - self.acked_memory_s
        while self._acked and next(iter(self._acked.values()))[0] < horizon:
            self._acked.popitem(last=False)

    async def hand_over(self) -> list[Renewal]:
        """Every renewal not being settled right now, no longer renewed here: this proxy is
        leaving, and an heir takes them (``adopt``, on that proxy). No renewal starts from
        now on, and those in flight are waited for: the heir must get the checkpoint they
        make, or the one they replace would be renewed and the new one come back."""
        self._leaving = True
        in_flight = [e.renewing for e in self._handles.values() if e.renewing is not None]
        if in_flight:
            await asyncio.wait(in_flight, timeout=self.consumer.broker_timeout_s + 1)
        leaving = [
            (k, e) for k, e in self._handles.items() if e.renewing is None and not e.settling
        ]
        for key, _ in leaving:
            del self._handles[key]
        return [entry for _, entry in leaving]

    def adopt(self, renewal: Renewal) -> bool:
        """Renew from here on a message another proxy renewed until it left (``hand_over``
        there); False when this one holds its most. Its client counts as heard now: it
        may never call this proxy at all."""
        popped = renewal.popped
        return self._hold(handle_key(popped.group, renewal.checkpoint, popped.lite_topic), renewal)

    def client_gone(self, client_id: str) -> None:
        """The client ended its session: hand back whatever it had not settled."""
        self._last_seen.pop(client_id, None)
        gone = [k for k, e in self._handles.items() if e.client_id == client_id]
        self._clear(gone, "client_gone")

    # -- the renewal loop --------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.renew_due()
            except Exception:
                log.exception("renewal round failed")

    async def renew_due(self) -> None:
        """One round: clear idle clients' handles, renew those due."""
        now = asyncio.get_running_loop().time()
        idle = {
            c
            for c, at in self._last_seen.items()
            if now - at > self.client_idle_s and not self.streams_open(c)
        }
        for client_id in idle:
            log.info("push consumer %s not heard from; handing back its messages", client_id)
            self.client_gone(client_id)
        live = {e.client_id for e in self._handles.values()}
        for client_id in list(self._last_seen):
            if client_id not in live:
                del self._last_seen[client_id]
        if self._leaving:
            return
        now_ms = self.clock_ms()
        due = [
            (k, e)
            for k, e in self._handles.items()
            if e.renewing is None
            and not e.settling
            and e.checkpoint.next_visible_time - now_ms <= self.ahead_ms
        ]
        # Marked before the renewals run: a settle or a hand-over that comes in between
        # must wait for them, not take the checkpoint they are about to replace. Each mark
        # is cleared when its renewal's task ends, however it ends: a round cancelled
        # before its tasks started (the proxy closing) never runs their ``finally``, and a
        # mark left set would keep its message from every later round, and every settle
        # of it waiting.
        loop = asyncio.get_running_loop()
        tasks = []
        for key, entry in due:
            renewing = entry.renewing = loop.create_future()
            task = loop.create_task(self._renew(key, entry, now_ms))
            task.add_done_callback(functools.partial(_unmark, entry, renewing))
            tasks.append(task)
        if tasks:
            await asyncio.gather(*tasks)

    async def _renew(self, key: HandleKey, entry: Renewal, now_ms: int) -> None:
        """Renew ``entry``, already marked ``renewing`` by the round."""
        renewing = entry.renewing
        assert renewing is not None
        popped = entry.popped
        try:
            if now_ms - entry.delivered_ms >= self.max_time_ms:
                # Consumed for too long: back with the retry back-off of its attempt.
                delay_s = DELAY_LEVELS_S[min(entry.reconsume_times, len(DELAY_LEVELS_S) - 1)]
                del self._handles[key]
                await self._change(popped, delay_s * 1000)
                return
            # One slice more, never longer: if this proxy dies, what it renewed comes back
            # within a slice (the Apache proxy's 1, 3, 5, 10, 30 min then 1 h left a
            # message consumed for 5 minutes invisible for up to 10 more).
            checkpoint = await self._change(popped, self.slice_ms)
            entry.popped = Popped(
                popped.broker,
                popped.group,
                popped.topic,
                checkpoint,
                popped.commit_log_offset,
                popped.msg_id,
                popped.lite_topic,
            )
            entry.failures = 0
            self.renewed += 1
        except RemotingError as exc:
            entry.failures += 1
            log.info("renewing %s failed (%d): %s", popped.msg_id, entry.failures, exc)
            if entry.failures >= self.max_failures and self._handles.get(key) is entry:
                del self._handles[key]
        finally:
            _unmark(entry, renewing)

    async def _change(self, popped: Popped, invisible_ms: int) -> str:
        client = await self.consumer.broker(popped.broker, popped.topic)
        return await client.change_invisible_time(
            popped.group,
            popped.topic,
            popped.checkpoint,
            invisible_ms,
            timeout=self.consumer.broker_timeout_s,
            lite_topic=popped.lite_topic,
        )

    def _clear(self, keys: list[HandleKey], reason: str) -> None:
        popped = [self._handles.pop(k).popped for k in keys if k in self._handles]
        if popped:
            self.consumer.hand_back(popped, reason, invisible_ms=self.clear_invisible_ms)

    async def close(self) -> None:
        """Stop renewing. Messages still held keep their current invisible time: a client
        that moves to another proxy can still ack those never renewed."""
        task, self._task = self._task, None
        await stop_background(task)
        self._handles.clear()
        self._acked.clear()
        self._last_seen.clear()


def _unmark(entry: Renewal, renewing: asyncio.Future[None], *_: object) -> None:
    """``entry``'s renewal ``renewing`` is over: its waiters go on, and the next round may
    renew it. Idempotent: the renewal's own ``finally`` and its task's end both call it."""
    if not renewing.done():
        renewing.set_result(None)
    if entry.renewing is renewing:
        entry.renewing = None
