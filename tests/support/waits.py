"""Bounded waits: a condition awaited instead of a sleep, and a pop drained until empty."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.remoting.broker_client import BrokerClient
from proxy.remoting.message import MessageExt


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 2.0, step: float = 0.01
) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(step)


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
