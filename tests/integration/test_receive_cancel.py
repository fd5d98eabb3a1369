"""A cancel anywhere in a ReceiveMessage strands nothing: every message the poll popped and
did not write comes back at once (the hand-back's short invisible time), never after its
own invisible time.

The client's going away reaches the proxy as a cancel of the handler task, at whatever await
it is in. The test runs the receive activity in this event loop, as the gRPC server would,
and cancels it after 0, 1, 2, ... turns of the loop, until a run completes uncancelled; so
the cancel lands once at each await on the path (validation, group settings, route, the
first pop, probes, the wake-up pop, the dead-letter check, each write). After each cancel,
the messages it did not write must be poppable again within a few seconds, while the
receive asked for 60 s of invisibility.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from proxy.api.v2 import service_pb2 as api
from testkit.lean_client import receive_request

T, G = "T", "G"
INVISIBLE_MS = 60_000  # what the cancelled receive asks: far longer than the test waits
BACK_WITHIN_S = 5.0  # the hand-back's invisible time is 100 ms; room for a loaded machine
MAX_TURNS = 400  # a receive that needs more turns than this to finish is a bug of its own


class Context:
    """The part of grpc.aio's servicer context the receive activity uses."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.written: list[api.ReceiveMessageResponse] = []

    async def write(self, response: api.ReceiveMessageResponse) -> None:
        await asyncio.sleep(0)  # a real write yields to the loop: a cancel can land here
        self.written.append(response)

    def time_remaining(self) -> float:
        return 10.0

    def invocation_metadata(self):
        return (("x-mq-client-id", self.client_id),)

    def ids(self) -> set[str]:
        return {
            r.message.system_properties.message_id for r in self.written if r.HasField("message")
        }


async def drain(client, want: set[str]) -> set[str]:
    """Receive (and ack) until every id of ``want`` is back, or the bound passes."""
    got: set[str] = set()
    deadline = time.monotonic() + BACK_WITHIN_S
    while not want <= got and time.monotonic() < deadline:
        result = await client.receive(G, T, await_ms=500, batch=32, invisible_ms=10_000)
        if result.messages:
            got |= {m.system_properties.message_id for m in result.messages}
            await client.ack(G, T, result.messages)
    return got


@pytest.mark.parametrize("mode", ["notify", "coupled", "slicing"])
async def test_a_cancel_at_any_await_hands_back_what_was_not_written(start_proxy, lean, mode):
    app = await start_proxy(mode=mode, brokers=2, hand_back_invisible_ms=100)
    producer = lean(app, "cancel-producer")
    checker = lean(app, "cancel-checker")
    landed: list[int] = []  # turns at which a cancel stopped a receive
    for turns in range(MAX_TURNS):
        sent = set()
        for n in range(3):
            answer = await producer.send(T, f"m{turns}-{n}".encode())
            sent.add(answer.entries[0].message_id)
        context = Context(f"cancelled-{turns}")
        request = receive_request(G, T, await_ms=2000, batch=32, invisible_ms=INVISIBLE_MS)
        task = asyncio.ensure_future(app.receive.receive_message(request, context))
        for _ in range(turns):
            await asyncio.sleep(0)  # one loop turn: the cancel lands at turn ``turns``
            if task.done():
                break
        finished = task.done()
        if finished:
            await task
            assert context.ids(), "an uncancelled receive answers with messages"
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            landed.append(turns)

        # Not written: handed back at once, or never popped (a poll answers from one broker).
        missing = sent - context.ids()
        back = await drain(checker, missing)
        assert missing <= back, (
            f"{mode}, cancelled after {turns} turns: {sorted(missing - back)} not handed back "
            f"(written: {sorted(context.ids())})"
        )
        if finished:
            break
    else:
        pytest.fail(f"the receive never finished within {MAX_TURNS} turns")
    assert len(landed) >= 5, f"the cancel landed only at turns {landed}"
