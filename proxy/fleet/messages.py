"""The messages proxies exchange: about the keys they share (``proxy/receive/shared.py``),
and about the push consumers' messages they renew (``proxy/fleet/settle.py``).

A subscription is per (group, topic): one WATCH names every broker its polls watch, so a
proxy sends one per key it waits on, not one per broker (B = 50 times fewer). A wake and
its answer are per broker, since a broker's hasMsg is what they are about. Times travel as
seconds remaining, not as instants: the proxies' clocks are not the same clock.

A settle is three messages: LEND asks the proxy that renews a message for its current
checkpoint, LENT answers (and stops renewing it meanwhile), RETURN says how the ack, change
or forward made with it ended. ``ref`` pairs them; ``handle`` carries a checkpoint. A
proxy that leaves sends each message it renews to its heir in an ADOPT (``handle``: the
renewal, as JSON).
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
    LEND = "lend"  # settler -> renewer: this handle is being settled; its current checkpoint?
    LENT = "lent"  # renewer -> settler: the checkpoint (outcome LENT), or why not
    RETURN = "return"  # settler -> renewer: the settle ended so (SETTLED, ACKED or KEPT)
    ADOPT = "adopt"  # a renewer leaving -> its heir: renew this message from now on


# The kinds about renewals; the others are about shared probes.
SETTLE_KINDS = frozenset({PeerKind.LEND, PeerKind.LENT, PeerKind.RETURN, PeerKind.ADOPT})


class Outcome(enum.Enum):
    """A LENT's answer, or a RETURN's news."""

    NONE = ""
    LENT = "lent"  # LENT: ``handle`` is the current checkpoint; no renewal until the RETURN
    ABSENT = "absent"  # LENT: not renewed there (never, settled, or given up)
    ACKED = "acked"  # LENT: acked there lately (a retry); RETURN: settled by an ack
    SETTLED = "settled"  # RETURN: settled by a change of invisible time or a forward
    KEPT = "kept"  # RETURN: not settled (failed, or the settler gave up): renew on


@dataclass(frozen=True, slots=True)
class PeerMessage:
    kind: PeerKind
    group: str
    topic: str  # LEND: the lite topic of a lite message, else ""
    brokers: tuple[str, ...] = ()  # WATCH: every broker; WAKE, DONE: the one
    remaining_s: float = 0.0  # WATCH
    order: bool = False  # WATCH: a FIFO group's key
    missed: bool = False  # DONE
    ref: int = 0  # LEND, LENT, RETURN: which settle
    handle: str = ""  # LEND: the client's checkpoint; LENT: the current one; ADOPT: the renewal
    outcome: Outcome = Outcome.NONE  # LENT, RETURN

    @property
    def broker(self) -> str:
        """The broker of a WAKE or a DONE."""
        return self.brokers[0]

    def size(self) -> int:
        """Bytes on the wire, about: the names, a kind, a float and two flags, framed."""
        names = len(self.group) + len(self.topic) + len(self.handle)
        return 16 + names + sum(len(b) + 2 for b in self.brokers)
