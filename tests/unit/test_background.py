"""proxy.background: a failed background task is logged when it fails, not when its owner
closes; stopping one cancels it and waits for it to end."""

from __future__ import annotations

import asyncio
import logging

from proxy.background import start_background, stop_background


async def test_a_failure_is_logged_at_once(caplog):
    async def fails() -> None:
        raise RuntimeError("reload broke")

    with caplog.at_level(logging.ERROR, logger="test.background"):
        task = start_background(fails(), name="reload", log=logging.getLogger("test.background"))
        await asyncio.wait_for(asyncio.wait({task}), 1)
        await asyncio.sleep(0)  # done callbacks run on the next loop turn
    [record] = caplog.records
    assert "reload" in record.getMessage() and "reload broke" in record.getMessage()
    await stop_background(task)  # the owner's close still works on a failed task


async def test_stop_cancels_and_waits(caplog):
    ended = asyncio.Event()

    async def loops() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.01)  # clean-up that takes a moment
            ended.set()

    with caplog.at_level(logging.ERROR):
        task = start_background(loops(), name="loop", log=logging.getLogger("test.background"))
        await asyncio.sleep(0)
        await asyncio.wait_for(stop_background(task), 1)
    assert task.cancelled() and ended.is_set()
    assert caplog.records == []  # a cancellation is not a failure
    await stop_background(None)
