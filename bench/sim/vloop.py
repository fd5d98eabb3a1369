"""An asyncio event loop on simulated time.

The loop's clock is a number, not the machine's: when no callback is ready, the loop asks
its selector to wait until the next timer, and the selector, instead of sleeping, moves
the clock to that timer at once. Everything scheduled with ``call_later``, ``sleep``,
``wait_for`` and futures runs in the same order as on a real loop, with no real waiting,
so minutes of a fleet's life take as long as the Python code in them takes to run.

Real sockets still work (the selector is polled without waiting), but nothing in the
simulator uses them.
"""

from __future__ import annotations

import asyncio
import selectors


class _JumpingSelector(selectors.BaseSelector):
    """A real selector that never sleeps: a wait of ``timeout`` moves the clock instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._real = selectors.DefaultSelector()

    def register(self, fileobj, events, data=None):
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self._real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self._real.modify(fileobj, events, data)

    def get_map(self):
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout=None):
        ready = self._real.select(0)
        if ready:
            return ready
        if timeout is None:
            # Nothing ready and no timer: on a real loop this waits for I/O forever.
            raise RuntimeError("simulated loop: nothing scheduled, the simulation would hang")
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 1_000.0) -> None:
        self._virtual_now = start
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


def run(coro, start: float = 1_000.0):
    """Run ``coro`` to completion on a fresh simulated loop; its result."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
