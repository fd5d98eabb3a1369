"""Delayed and timed messages.

A message with a delivery time in the future is stored first in the system timer topic
(so the producer gets real offsets) and put into its own topic when it is due. RocketMQ
does the same with its timer wheel; here a loop timer per message is enough.
"""

from __future__ import annotations

import asyncio
import dataclasses

from broker_stub.store import MessageStore, PutResult
from proxy.remoting.codes import DELAY_LEVELS_S
from proxy.remoting.headers import now_ms
from proxy.remoting.message import MessageExt, Prop

TIMER_TOPIC = "rmq_sys_wheel_timer"


def due_time_ms(msg: MessageExt, now: int) -> int | None:
    """When ``msg`` should become visible, or None for at once."""
    props = msg.properties
    for key in (Prop.TIMER_DELIVER_MS, Prop.START_DELIVER_TIME):
        if key in props:
            return int(props[key])
    if "TIMER_DELAY_SEC" in props:
        return now + int(props["TIMER_DELAY_SEC"]) * 1000
    if "TIMER_DELAY_MS" in props:
        return now + int(props["TIMER_DELAY_MS"])
    level = int(props.get(Prop.DELAY, "0") or 0)
    if level > 0:
        return now + DELAY_LEVELS_S[min(level, len(DELAY_LEVELS_S)) - 1] * 1000
    return None


class DeliveryScheduler:
    """Puts messages into the store now, or holds them until their delivery time."""

    def __init__(self, store: MessageStore, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self._held: set[asyncio.TimerHandle] = set()
        # (topic, unique id) -> (timer, due ms) of each held message: what recall cancels.
        self._by_key: dict[tuple[str, str], tuple[asyncio.TimerHandle, int]] = {}

    @property
    def held(self) -> int:
        return len(self._held)

    def put(self, msg: MessageExt) -> PutResult:
        now = now_ms()
        try:
            due = due_time_ms(msg, now)
        except ValueError:
            due = None  # an unreadable delivery time: deliver at once rather than never
        if due is None or due <= now:
            return self.store.put(msg)
        held = dataclasses.replace(
            msg, properties=dict(msg.properties), topic=TIMER_TOPIC, queue_id=0
        )
        held.properties[Prop.REAL_TOPIC] = msg.topic
        held.properties[Prop.REAL_QUEUE_ID] = str(msg.queue_id)
        result = self.store.put(held)

        key = (msg.topic, msg.properties.get(Prop.UNIQ_KEY, ""))

        def deliver() -> None:
            self._held.discard(handle)
            if self._by_key.get(key, (None, 0))[0] is handle:
                del self._by_key[key]
            self.store.put(msg)

        handle = self.loop.call_later((due - now) / 1000, deliver)
        self._held.add(handle)
        self._by_key[key] = (handle, due)
        return result

    def due_ms(self, topic: str, msg_id: str) -> int | None:
        """When a held message is due, or None when nothing of that id is held."""
        held = self._by_key.get((topic, msg_id))
        return None if held is None else held[1]

    def recall(self, topic: str, msg_id: str) -> bool:
        """Never deliver the held message ``msg_id`` of ``topic``; False if none is held."""
        held = self._by_key.pop((topic, msg_id), None)
        if held is None:
            return False
        held[0].cancel()
        self._held.discard(held[0])
        return True

    def close(self) -> None:
        for handle in self._held:
            handle.cancel()
        self._held.clear()
        self._by_key.clear()
