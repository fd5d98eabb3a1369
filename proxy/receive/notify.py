"""Pop-with-notify: the long-polling task of DESIGN.md.

1. First pop: pop (no broker-side wait) from the broker the client named, or the next in
   turn. Messages: answer at once; that is a short-polling hit.
2. Notify: watch every broker serving the topic; the probe hub sends the NOTIFICATION
   probes and puts each broker that answers ``hasMsg`` into this poll's result queue.
3. Consume: take a broker from the queue and pop from it. Messages: done. Empty (another
   consumer got there first): probe that broker again while time remains. The loop below
   is the one consumption step of the task, so at most one pop runs at a time.
4. End: messages, or the deadline; release every watch so nothing is left behind.
"""

from __future__ import annotations

from proxy.receive.context import PollContext
from proxy.receive.probes import ProbeHub, Watch
from proxy.receive.types import PolledMessage


async def notify_poll(ctx: PollContext, hub: ProbeHub, max_probes: int) -> list[PolledMessage]:
    first = ctx.first_broker()
    if first is None:
        return []
    messages = await ctx.pop(first)
    if messages:
        ctx.short_polling_hit = True
        return messages
    if ctx.remaining_s <= 0:
        return []

    req = ctx.request
    ready: list[str] = []  # the result queue: brokers that said hasMsg (a few at most)
    deadline = req.answer_by

    def has_msg(broker: str) -> None:
        ready.append(broker)
        ctx.notice()

    def watch(broker: str) -> Watch:
        return hub.watch((broker, req.group, req.topic), deadline, has_msg, ctx.count_probe)

    watches = {broker.name: watch(broker.name) for broker in ctx.brokers}
    try:
        while True:
            if not ready and not await ctx.wait_notice():
                return []  # the deadline: answer empty
            if not ready:
                continue
            broker_name = ready.pop(0)
            broker = ctx.broker(broker_name)
            messages = await ctx.pop(broker) if broker is not None else []
            hub.release(watches[broker_name])
            if messages:
                return messages
            if ctx.notifications < max_probes and ctx.remaining_s > 0:
                watches[broker_name] = watch(broker_name)
    finally:
        for w in watches.values():
            hub.release(w)
