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
    # No answer within SHORT_HIT_S: the broker parked the pop, a miss, known from then on.
    missed = ctx.loop.call_later(SHORT_HIT_S, ctx.first_pop_done, False)
    try:
        messages = await ctx.pop(broker, poll_ms=ctx.remaining_ms)
    finally:
        missed.cancel()
    ctx.first_pop_done(bool(messages) and ctx.loop.time() - started < SHORT_HIT_S)
    return messages
