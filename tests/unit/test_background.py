"""proxy.background: a failed background task is logged when it fails, not when its owner
closes; stopping one cancels it and waits for it to end; a task that should have ended can
say where it waits, and a proxy's stop that hangs says so while it hangs."""

from __future__ import annotations

import asyncio
import logging

from proxy import app as app_module
from proxy.background import start_background, stop_background, waiting_at
from proxy.config import ProxyConfig
from testkit.waits import wait_until


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
            await asyncio.sleep(3600)  # a loop that runs until it is cancelled
        finally:
            await asyncio.sleep(0.01)  # clean-up that takes a moment
            ended.set()

    with caplog.at_level(logging.ERROR):
        task = start_background(loops(), name="loop", log=logging.getLogger("test.background"))
        await asyncio.sleep(0)  # one loop turn: the task starts, so it has a clean-up to run
        await asyncio.wait_for(stop_background(task), 1)
    assert task.cancelled() and ended.is_set()
    assert caplog.records == []  # a cancellation is not a failure
    await stop_background(None)


async def test_waiting_at_names_each_await_of_a_task_down_to_what_it_waits_for():
    released, parked = asyncio.Event(), asyncio.Event()

    async def inner() -> None:
        parked.set()
        await released.wait()

    async def middle() -> None:
        await asyncio.gather(start_background(inner(), name="inner", log=logging.getLogger()))

    async def outer() -> None:
        await middle()

    task = asyncio.ensure_future(outer())
    await asyncio.wait_for(parked.wait(), 1)  # inner is at released.wait() once this returns
    where = waiting_at(task)
    names = [place.split(" ")[0] for place in where.split(" -> ")]
    assert names == ["outer", "middle", "inner", "wait", "a"], where
    assert where.endswith("a future"), where
    assert "test_background.py:" in where
    released.set()
    await asyncio.wait_for(task, 1)
    assert waiting_at(task) == "nothing: it has ended"


async def test_a_stop_that_hangs_is_named_with_where_it_waits_while_it_waits(caplog, monkeypatch):
    monkeypatch.setattr(app_module, "STUCK_STOP_S", 0.05)
    app = app_module.ProxyApp(ProxyConfig())
    released = asyncio.Event()

    async def close_links() -> None:
        await released.wait()

    async def nothing() -> None:
        pass

    step = app_module.Step("fleet links", nothing, close_links)
    with caplog.at_level(logging.WARNING, logger="proxy.app"):
        stopping = asyncio.ensure_future(app._timed_stop(step))
        await wait_until(lambda: bool(caplog.records), timeout=1, what="the stuck stop's warning")
        assert not stopping.done()
        [record] = caplog.records  # logged while the stop still waits
        message = record.getMessage()
        assert "still stopping the fleet links" in message and "close_links" in message, message
        released.set()
        await asyncio.wait_for(stopping, 1)
    # A stop that is cancelled cancels the part's stop with it.
    never, hanging = asyncio.Event(), asyncio.Event()

    async def hangs() -> None:
        hanging.set()
        await never.wait()

    hung = asyncio.ensure_future(app._timed_stop(app_module.Step("renewer", nothing, hangs)))
    await asyncio.wait_for(hanging.wait(), 1)
    hung.cancel()
    await asyncio.gather(hung, return_exceptions=True)
    assert hung.cancelled()
    assert not [t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__name__", "") == "hangs"]
