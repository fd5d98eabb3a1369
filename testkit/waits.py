"""Bounded waits: a condition awaited instead of a sleep, and a pop drained until empty.

``wait_until`` is for coroutines (its predicate may itself be a coroutine function);
``wait_for`` is its twin for synchronous tests and threads. Both fail the test with
``what`` (a text, or a callable that says what was seen at the end) and the time they
waited when the condition does not come true in time.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.message import MessageExt


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 2.0,
    step: float = 0.01,
    what: str | Callable[[], str] = "condition",
) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds.

    ``predicate`` may return an awaitable (an ``async def`` check), which is awaited.
    """
    loop = asyncio.get_running_loop()  # its clock: simulated on bench.sim's loop
    deadline = loop.time() + timeout
    while True:
        met = predicate()
        if inspect.isawaitable(met):
            met = await met
        if met:
            return
        if loop.time() > deadline:
            raise AssertionError(_failed(what, timeout))
        await asyncio.sleep(step)  # the poll's step: the loop runs what we wait on


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 2.0,
    step: float = 0.01,
    what: str | Callable[[], str] = "condition",
) -> None:
    """``wait_until`` for synchronous code: poll ``predicate`` from this thread."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(_failed(what, timeout))
        time.sleep(step)  # the poll's step: another thread or process makes it true


def _failed(what: str | Callable[[], str], timeout: float) -> str:
    return f"{what() if callable(what) else what} not met within {timeout}s"


async def pop_all(
    client: BrokerClient, group: str, topic: str, *, max_nums: int = 32, **kwargs
) -> list[MessageExt]:
    """Pop until the broker has nothing more for ``group``; everything popped."""
    got: list[MessageExt] = []
    for _ in range(1000):
        result = await client.pop(group, topic, max_nums=max_nums, **kwargs)
        if not result.found:
            return got
        got.extend(result.messages)
    raise AssertionError("pop never ran dry")
