"""Long-lived background tasks (reload loops, heartbeats, renewals) and their owners.

Every such task belongs to one object that starts it in ``start()`` and stops it in
``close()``. Between the two, nobody awaits the task, so a failure would go unseen until
the owner closes; ``start_background`` therefore attaches a callback that logs a failure
the moment it happens. ``stop_background`` cancels and waits, so nothing of the task
outlives its owner. The broker stub uses the same two calls.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any


def start_background(
    coro: Coroutine[Any, Any, None], *, name: str, log: logging.Logger
) -> asyncio.Task[None]:
    """Run ``coro`` as a task named ``name``; a failure is logged on ``log`` at once."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(functools.partial(_log_failure, log))
    return task


async def stop_background(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait for it to end (its failure, if any, was logged already).
    A cancellation of the caller itself still propagates."""
    if task is None:
        return
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _log_failure(log: logging.Logger, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background task %s stopped: %r", task.get_name(), exc, exc_info=exc)
