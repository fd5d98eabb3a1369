"""Bounded waits shared by the conformance tests."""

from __future__ import annotations

from proxy.remoting.answers import PopResult
from proxy.remoting.broker_client import BrokerClient
from rocketmq_local.admin import max_offset
from testkit.waits import wait_until

#: How long a test waits for an unacked message to come back. A stub revives at the
#: invisible time; a real broker's revive service scans its revive queue in rounds and
#: takes 2-3 s more here (more on a loaded machine): generous, never slept through.
REDELIVERY_DEADLINE_S = 30.0
#: Invisible time for messages a test lets come back: short, so redeliveries take seconds.
SHORT_INVISIBLE_MS = 1000


async def pop_eventually(
    client: BrokerClient,
    group: str,
    topic: str,
    *,
    deadline_s: float = REDELIVERY_DEADLINE_S,
    step_s: float = 0.1,
    **kwargs,
) -> PopResult:
    """Pop (without parking: a real broker does not reliably wake a parked pop on a
    revival) until something comes; fail after ``deadline_s``."""
    last: list[PopResult] = []

    async def found() -> bool:
        last[:] = [await client.pop(group, topic, **kwargs)]
        return last[0].found

    await wait_until(found, timeout=deadline_s, step=step_s, what=f"a pop for {group} on {topic}")
    return last[0]


async def wait_offset(client: BrokerClient, topic: str, offset: int, timeout_s: float = 10.0):
    """Wait until queue 0 of ``topic`` reaches ``offset`` (see ``wait_visible``)."""

    async def reached() -> bool:
        return await max_offset(client, topic, 0) >= offset

    await wait_until(reached, timeout=timeout_s, step=0.01, what=f"{topic}:0 at offset {offset}")
