"""ConsumerProcessor.divert_exhausted: messages past their last attempt go to the dead-letter
queue; a cancel while it moves one strands nothing."""

from __future__ import annotations

import asyncio

import pytest

from proxy.processor.consumer import ConsumerProcessor, Popped
from testkit.waits import wait_until


def popped(msg_id: str) -> Popped:
    return Popped("a", "G", "T", "ck", 0, msg_id)


class Recording(ConsumerProcessor):
    """The processor with the broker calls replaced: dead-lettering waits until released."""

    def __init__(self) -> None:
        super().__init__(None, broker_timeout_s=1.0, hand_back_invisible_ms=100)  # type: ignore[arg-type]
        self.back: list[tuple[str, str]] = []
        self.moved: list[str] = []
        self.moving: list[str] = []
        self.release = asyncio.Event()

    def hand_back(self, messages, reason, invisible_ms=None):
        self.back.extend((m.msg_id, reason) for m in messages)

    async def dead_letter(self, message, max_reconsume_times):
        self.moving.append(message.msg_id)
        await self.release.wait()
        self.moved.append(message.msg_id)


async def test_exhausted_messages_go_to_the_dead_letter_queue_the_rest_to_the_client():
    consumer = Recording()
    consumer.release.set()
    batch = [(popped("m1"), 0), (popped("m2"), 3), (popped("m3"), 1)]

    deliver = await consumer.divert_exhausted(batch, max_attempts=3)

    assert deliver == [True, False, True]
    assert consumer.moved == ["m2"] and consumer.back == []


async def test_a_cancel_while_moving_one_hands_back_every_message_not_moved():
    consumer = Recording()
    batch = [(popped("m1"), 0), (popped("m2"), 5), (popped("m3"), 0), (popped("m4"), 5)]
    task = asyncio.ensure_future(consumer.divert_exhausted(batch, max_attempts=3))
    await wait_until(lambda: consumer.moving == ["m2"], what="m2's move")  # waiting on release

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert consumer.moved == []
    assert sorted(consumer.back) == [(f"m{i}", "cancelled") for i in range(1, 5)]
