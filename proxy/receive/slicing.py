"""Slicing, the MNS strategy: the poll cut into short time slices over the brokers in turn.

The first slice is a plain pop. Each further slice is a pop held by one broker for
``slice_ms``, moving to the next broker each time, until ``quota`` slices are spent; the
last slice is a long poll on the next broker for whatever time is left.
"""

from __future__ import annotations

from proxy.receive.context import PollContext
from proxy.receive.types import PolledMessage


async def slicing_poll(ctx: PollContext, slice_ms: int, quota: int) -> list[PolledMessage]:
    first = ctx.first_broker()
    if first is None:
        return []
    order = ctx.brokers_from(first)
    messages = await ctx.pop(first)
    ctx.first_pop_done(bool(messages))
    if messages:
        return messages
    turn = 1
    while ctx.remaining_ms > 0:
        broker = order[turn % len(order)]
        last = turn >= quota or ctx.remaining_ms <= slice_ms
        messages = await ctx.pop(broker, poll_ms=ctx.remaining_ms if last else slice_ms)
        if messages or last:
            return messages
        turn += 1
    return []
