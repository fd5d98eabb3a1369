"""The messages proxies exchange about the keys they share (``proxy/receive/shared.py``).

A subscription is per (group, topic): one WATCH names every broker its polls watch, so a
proxy sends one per key it waits on, not one per broker (B = 50 times fewer). A wake and
its answer are per broker, since a broker's hasMsg is what they are about. Times travel as
seconds remaining, not as instants: the proxies' clocks are not the same clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PeerKind(enum.Enum):
    WATCH = "watch"  # subscriber -> owner: probe these brokers for me for remaining_s
    WATCHING = "watching"  # owner -> subscriber: the WATCH arrived, the brokers are probed
    UNWATCH = "unwatch"  # subscriber -> owner: no poll of mine waits any more
    WAKE = "wake"  # owner -> subscriber: the broker has a message; one poll of yours pops
    DONE = "done"  # subscriber -> owner: the woken poll popped (missed: it found nothing)


@dataclass(frozen=True, slots=True)
class PeerMessage:
    kind: PeerKind
    group: str
    topic: str
    brokers: tuple[str, ...] = ()  # WATCH: every broker; WAKE, DONE: the one
    remaining_s: float = 0.0  # WATCH
    order: bool = False  # WATCH: a FIFO group's key
    missed: bool = False  # DONE

    @property
    def broker(self) -> str:
        """The broker of a WAKE or a DONE."""
        return self.brokers[0]

    def size(self) -> int:
        """Bytes on the wire, about: the names, a kind, a float and two flags, framed."""
        return 16 + len(self.group) + len(self.topic) + sum(len(b) + 2 for b in self.brokers)
