"""What happens to a message after it was popped: ack, a new invisible time, hand-back when
the client never got it, and the dead-letter queue.

Every message names its broker (a receipt handle carries the broker name, a popped message
the broker it came from), so each operation goes to that broker through the pool, whichever
proxy popped it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from proxy.brokers import BrokerPool
from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.client import RemotingError
from proxy.remoting.popinfo import PopCheckpointInfo

log = logging.getLogger(__name__)


class UnknownBroker(RemotingError):
    """A handle names a broker that no route of this proxy lists."""


@dataclass(frozen=True, slots=True)
class Popped:
    """What the processor needs to settle one popped message: where it came from, its
    checkpoint (POP_CK) and the commit-log offset (for the dead-letter queue)."""

    broker: str
    group: str
    topic: str
    checkpoint: str
    commit_log_offset: int
    msg_id: str
    # A lite message (RocketMQ 5.5): its lite topic, which every ack and invisible-time
    # change of it names; ``topic`` is then the parent.
    lite_topic: str | None = None


class ConsumerProcessor:
    def __init__(
        self,
        pool: BrokerPool,
        *,
        broker_timeout_s: float,
        hand_back_invisible_ms: int,
        on_hand_back: Callable[[str, int], None] | None = None,  # (reason, count)
    ) -> None:
        self.pool = pool
        self.broker_timeout_s = broker_timeout_s
        self.hand_back_invisible_ms = hand_back_invisible_ms
        self.on_hand_back = on_hand_back
        self.handed_back = 0
        # Hand-backs run after the poll that made them has answered; owned here, awaited
        # (with a grace) on close.
        self._hand_backs: set[asyncio.Task[None]] = set()

    async def broker(self, name: str, topic: str) -> BrokerClient:
        client = await self.pool.broker_by_name(name, topic)
        if client is None:
            raise UnknownBroker(f"broker {name!r} is unknown to this proxy")
        return client

    # -- ack ------------------------------------------------------------------------------

    async def ack(
        self,
        group: str,
        topic: str,
        checkpoints: list[PopCheckpointInfo],
        lite_topics: list[str | None] | None = None,
    ) -> list[RemotingError | None]:
        """Ack each checkpoint; per checkpoint None or its error. Each broker's share goes
        in one batch, all brokers at once. A lite message (its entry in ``lite_topics`` set)
        is acked alone: brokers refuse lite messages in a batch ack."""
        errors: list[RemotingError | None] = [None] * len(checkpoints)
        by_broker: dict[str, list[int]] = {}
        lite: list[int] = []
        for i, ck in enumerate(checkpoints):
            if lite_topics is not None and lite_topics[i]:
                lite.append(i)
            else:
                by_broker.setdefault(ck.broker_name, []).append(i)

        async def ack_lite(i: int) -> None:
            ck = checkpoints[i]
            try:
                client = await self.broker(ck.broker_name, topic)
                await client.ack(
                    group,
                    topic,
                    ck.encode(),
                    self.broker_timeout_s,
                    lite_topic=lite_topics[i] if lite_topics is not None else None,
                )
            except RemotingError as exc:
                errors[i] = exc

        async def ack_on(broker: str, indexes: list[int]) -> None:
            try:
                client = await self.broker(broker, topic)
            except UnknownBroker as exc:
                for i in indexes:
                    errors[i] = exc
                return
            answers = await client.ack_all(
                group, topic, [checkpoints[i] for i in indexes], timeout=self.broker_timeout_s
            )
            for i, error in zip(indexes, answers, strict=True):
                errors[i] = error

        await asyncio.gather(
            *(ack_on(b, idx) for b, idx in by_broker.items()), *(ack_lite(i) for i in lite)
        )
        return errors

    async def change_invisible(
        self,
        group: str,
        topic: str,
        checkpoint: PopCheckpointInfo,
        invisible_ms: int,
        *,
        lite_topic: str | None = None,
        suspend: bool = False,
    ) -> str:
        """A new invisible time from now; the message's new checkpoint. Raises RemotingError."""
        client = await self.broker(checkpoint.broker_name, topic)
        return await client.change_invisible_time(
            group,
            topic,
            checkpoint.encode(),
            invisible_ms,
            timeout=self.broker_timeout_s,
            lite_topic=lite_topic,
            suspend=suspend,
        )

    # -- hand-back ------------------------------------------------------------------------

    def hand_back(
        self, messages: list[Popped], reason: str, invisible_ms: int | None = None
    ) -> None:
        """Messages a client did not get become visible again shortly (``hand_back_invisible_ms``,
        or ``invisible_ms``) rather than at the end of their invisible time. Runs in the
        background."""
        if not messages:
            return
        self.handed_back += len(messages)
        if self.on_hand_back is not None:
            self.on_hand_back(reason, len(messages))
        invisible = self.hand_back_invisible_ms if invisible_ms is None else invisible_ms
        task = asyncio.ensure_future(self._hand_back(messages, invisible))
        self._hand_backs.add(task)
        task.add_done_callback(self._hand_back_done)

    async def _hand_back(self, messages: list[Popped], invisible_ms: int) -> None:
        for popped in messages:
            client = self.pool.broker(popped.broker)
            if client is None:
                continue
            try:
                await client.change_invisible_time(
                    popped.group,
                    popped.topic,
                    popped.checkpoint,
                    invisible_ms,
                    timeout=self.broker_timeout_s,
                    lite_topic=popped.lite_topic,
                )
            except RemotingError as exc:
                # It becomes visible at the end of its invisible time instead.
                log.warning("could not hand back %s: %s", popped.msg_id, exc)

    def _hand_back_done(self, task: asyncio.Task[None]) -> None:
        self._hand_backs.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("hand-back failed", exc_info=task.exception())

    # -- dead letters ---------------------------------------------------------------------

    async def dead_letter(self, popped: Popped, max_reconsume_times: int) -> None:
        """Move the message to ``%DLQ%<group>`` and ack it: the one path for a client's
        ForwardMessageToDeadLetterQueue and for a message past its last attempt. Raises
        RemotingError."""
        client = await self.broker(popped.broker, popped.topic)
        await client.send_to_dead_letter(
            popped.group,
            popped.commit_log_offset,
            popped.msg_id,
            popped.topic,
            max_reconsume_times,
            timeout=self.broker_timeout_s,
        )
        await client.ack(
            popped.group,
            popped.topic,
            popped.checkpoint,
            self.broker_timeout_s,
            lite_topic=popped.lite_topic,
        )

    async def divert_exhausted(
        self, messages: list[tuple[Popped, int]], max_attempts: int
    ) -> list[bool]:
        """For each (message, its reconsume times): whether it goes to the client (True),
        or was past its last attempt and goes to ``%DLQ%<group>`` instead; one that cannot
        be moved is handed back, to be tried again. Cancelled (the client went away), it
        hands back every message it has not moved: none of them will be written."""
        deliver: list[bool] = []
        for i, (popped, reconsume_times) in enumerate(messages):
            if reconsume_times + 1 <= max_attempts:
                deliver.append(True)
                continue
            deliver.append(False)
            try:
                await self.dead_letter(popped, max_attempts - 1)
            except RemotingError as exc:
                log.warning("dead-lettering %s failed: %s", popped.msg_id, exc)
                self.hand_back([popped], "dead_letter_failed")
            except asyncio.CancelledError:
                # This one may be in the dead-letter queue already, unacked: handed back,
                # it comes again and is moved again (at least once, never lost).
                kept = [m for (m, _), keep in zip(messages, deliver[:-1], strict=False) if keep]
                self.hand_back(kept + [m for m, _ in messages[i:]], "cancelled")
                raise
        return deliver

    async def close(self, grace_s: float = 5.0) -> None:
        """Give hand-backs in flight up to ``grace_s``, then cancel what is left."""
        if self._hand_backs:
            await asyncio.wait(set(self._hand_backs), timeout=grace_s)
        for task in list(self._hand_backs):
            task.cancel()
        if self._hand_backs:
            await asyncio.gather(*self._hand_backs, return_exceptions=True)
