"""Coupled long polling, the open-source proxy's way: one pop on one broker, held by the
broker for the client's remaining time."""

from __future__ import annotations

from proxy.receive.context import PollContext
from proxy.receive.types import PolledMessage

# A coupled pop cannot tell us whether the broker parked it, so a hit is an answer that
# came back about as fast as an unparked pop does.
SHORT_HIT_S = 0.010


async def coupled_poll(ctx: PollContext) -> list[PolledMessage]:
    broker = ctx.first_broker()
    if broker is None:
        return []
    started = ctx.loop.time()
    messages = await ctx.pop(broker, poll_ms=ctx.remaining_ms)
    if messages and ctx.loop.time() - started < SHORT_HIT_S:
        ctx.short_polling_hit = True
    return messages
