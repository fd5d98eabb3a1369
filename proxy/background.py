"""Tasks no single request owns: long-lived background loops (reloads, heartbeats,
renewals) with their owners, and look-ups that concurrent callers share.

Every such task belongs to one object that starts it in ``start()`` and stops it in
``close()``. Between the two, nobody awaits the task, so a failure would go unseen until
the owner closes; ``start_background`` therefore attaches a callback that logs a failure
the moment it happens. ``stop_background`` cancels and waits, so nothing of the task
outlives its owner. The broker stub uses the same two calls.

A shared look-up (``shared_lookup``: a topic's route, a group's settings) is owned by its
callers together: the first starts it, the others join it, and the last answer removes it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


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


def waiting_at(task: asyncio.Future[Any]) -> str:
    """Where ``task`` waits now: each coroutine of its await chain, outermost first, as
    ``function (file:line)``, through the tasks it awaits, directly or by ``gather``.
    For a log line about a task that should have ended (a traceback shows only where a
    task failed, and ``Task.get_stack`` only its outermost coroutine)."""
    places: list[str] = []
    awaited: Any = task
    for _ in range(64):  # a chain longer than this is cut: the line is for a human
        if isinstance(awaited, asyncio.Task):
            awaited = awaited.get_coro()
        if type(awaited).__name__ == "FutureIter":  # ``await future``: that future
            awaited = next(
                (r for r in gc.get_referents(awaited) if isinstance(r, asyncio.Future)), None
            )
            continue
        frame = getattr(awaited, "cr_frame", None)
        if frame is not None:
            code = frame.f_code
            places.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
            awaited = awaited.cr_await
        elif children := getattr(awaited, "_children", None):  # gather's own future
            awaited = next((child for child in children if not child.done()), None)
        else:
            if isinstance(awaited, asyncio.Future):
                places.append("a future")  # an event's waiter, a call's answer, a sleep
            break
    return " -> ".join(places) or "nothing: it has ended"


def shared_lookup(
    in_flight: dict[K, asyncio.Future[V]], key: K, start: Callable[[], Coroutine[Any, Any, V]]
) -> asyncio.Future[V]:
    """The look-up of ``key`` in ``in_flight``, started with ``start()`` if none is: callers
    asking at the same time share one request. Shielded, so a caller that gives up
    (cancelled) does not cancel the look-up the others wait on."""
    lookup = in_flight.get(key)
    if lookup is None:
        lookup = asyncio.ensure_future(start())
        in_flight[key] = lookup
        lookup.add_done_callback(lambda _f: in_flight.pop(key, None))
    return asyncio.shield(lookup)


def _log_failure(log: logging.Logger, task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background task %s stopped: %r", task.get_name(), exc, exc_info=exc)
