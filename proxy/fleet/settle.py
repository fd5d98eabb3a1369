"""Settling, through the fleet, a message that another proxy of it renews.

A push consumer's message is renewed by the proxy that delivered it
(``proxy/processor/renewal.py``), and each renewal replaces its checkpoint on the broker:
the handle the client holds names a checkpoint that no longer settles anything. Only that
proxy knows the current one. A client whose connection moves (its age GOAWAY, a drain)
sends its ack, or its change of invisible time, to another proxy, which on its own would
settle nothing, and the message would be consumed twice.

So in a fleet the proxy that renews a message names itself in the handle it delivers
(``ReceiptHandle.renewer``: its fleet address), and a proxy that is asked to settle a
handle that names another member borrows the current checkpoint over the fleet link:

1. LEND: the settler sends the member the client's checkpoint;
2. LENT: the member answers with the current one and renews the message no more until it
   hears back (``HandleRenewer.begin_settle``), or ABSENT (it does not renew it: never
   did, settled it, gave up) or ACKED (it acked it lately: a client's retry);
3. the settler makes the ack, change or forward with that checkpoint, and
4. RETURN: tells the member how it ended: settled (the renewal ends, an ack is
   remembered) or KEPT (failed: the renewal goes on, and the client's retry finds it).

Nothing waits long on a peer. The settler waits ``ASK_S`` for LENT, then settles with the
client's own handle as a proxy without a fleet would (the renewer may be gone: crashed,
drained). A lend whose RETURN does not come in ``LEND_S`` (the settler died, its link
broke) is given back as KEPT, so the member renews the message again before its slice
ends. A LENT that arrives after the settler gave up is returned KEPT at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass

from proxy.background import start_background, stop_background
from proxy.fleet.links import PeerLinks
from proxy.fleet.messages import Outcome, PeerKind, PeerMessage
from proxy.processor.renewal import HandleRenewer, Renewal
from proxy.remoting.popinfo import PopCheckpointInfo

log = logging.getLogger(__name__)

# How long a settler waits for LENT before it settles with the client's handle: a peer on
# the same network answers in a millisecond, unless a renewal of the message is in flight
# (one broker request).
ASK_S = 1.0
# How long a member keeps a message lent, unrenewed, without news of its settle: the
# settler's broker request and more. Under the renewal's lead (``ahead_ms``, 10 s) so that
# a message whose settler vanished is renewed again before its slice ends.
LEND_S = 6.0


@dataclass(frozen=True, slots=True)
class Lent:
    """A message's current checkpoint, lent by ``peer`` for one settle (``ref``)."""

    peer: str
    ref: int
    checkpoint: PopCheckpointInfo


@dataclass(slots=True)
class _Loan:
    renewal: Renewal
    expiry: asyncio.TimerHandle


class FleetSettles:
    """Both sides of a settle through the fleet: the settler's ``lend`` and ``give_back``,
    and the renewer's answers to its peers (``receive``, from the links)."""

    def __init__(
        self, links: PeerLinks, renewer: HandleRenewer, *, ask_s: float = ASK_S,
        lend_s: float = LEND_S,
    ) -> None:  # fmt: skip
        self.links = links
        self.renewer = renewer
        self.ask_s = ask_s
        self.lend_s = lend_s
        self._refs = itertools.count(1)
        self._asks: dict[int, tuple[str, asyncio.Future[Lent | Outcome]]] = {}
        self._loans: dict[tuple[str, int], _Loan] = {}  # (settler, ref) -> loan
        self._answering: set[asyncio.Task[None]] = set()
        self.lent = 0  # messages lent to a settler
        self.borrowed = 0  # checkpoints borrowed from a renewer
        self.expired = 0  # loans given back for want of news

    # -- the settler ----------------------------------------------------------------------

    async def lend(
        self, member: str, group: str, checkpoint: PopCheckpointInfo, lite_topic: str | None
    ) -> Lent | Outcome:
        """Borrow from ``member`` the current checkpoint of the message the client's
        ``checkpoint`` names: ``Lent`` (then ``give_back`` it, whatever happens), ACKED
        (the member acked it lately), or ABSENT (settle with the client's own handle:
        not renewed there, or no answer in ``ask_s``)."""
        if member == self.links.self_id or member not in self.links.members():
            return Outcome.ABSENT
        ref = next(self._refs)
        answer: asyncio.Future[Lent | Outcome] = asyncio.get_running_loop().create_future()
        asked = PeerMessage(
            PeerKind.LEND, group, lite_topic or "", ref=ref, handle=checkpoint.encode()
        )
        if not self.links.send(member, asked):
            return Outcome.ABSENT
        self._asks[ref] = (member, answer)
        try:
            result = await asyncio.wait_for(answer, self.ask_s)
        except TimeoutError:
            log.info(
                "no LENT from %s in %.1f s: settling with the client's handle", member, self.ask_s
            )
            return Outcome.ABSENT
        finally:
            self._asks.pop(ref, None)
        if isinstance(result, Lent):
            self.borrowed += 1
        return result

    def give_back(self, lent: Lent, settled: bool, *, by_ack: bool = False) -> None:
        """The settle made with ``lent`` ended: tell its renewer (``HandleRenewer.end_settle``
        on that side). A RETURN that cannot be sent is made good by the loan's expiry."""
        outcome = (Outcome.ACKED if by_ack else Outcome.SETTLED) if settled else Outcome.KEPT
        self.links.send(lent.peer, _returned(lent.ref, outcome))

    # -- what the links deliver -----------------------------------------------------------

    def receive(self, peer: str, message: PeerMessage) -> None:
        if message.kind is PeerKind.LEND:
            task = start_background(self._answer(peer, message), name=f"lend to {peer}", log=log)
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        elif message.kind is PeerKind.LENT:
            self._lent(peer, message)
        elif message.kind is PeerKind.RETURN:
            loan = self._loans.pop((peer, message.ref), None)
            if loan is not None:
                self._end(loan, message.outcome)

    def peer_lost(self, peer: str) -> None:
        """What ``peer`` borrowed comes back unsettled; what was asked of it gets no answer."""
        for key in [k for k in self._loans if k[0] == peer]:
            self._end(self._loans.pop(key), Outcome.KEPT)
        for member, answer in self._asks.values():
            if member == peer and not answer.done():
                answer.set_result(Outcome.ABSENT)

    def members_changed(self) -> None:
        """Nothing to do: a member that left was also lost (``peer_lost``)."""

    async def close(self) -> None:
        for task in list(self._answering):
            await stop_background(task)
        for loan in self._loans.values():
            self._end(loan, Outcome.KEPT)
        self._loans.clear()
        for _, answer in self._asks.values():
            if not answer.done():
                answer.set_result(Outcome.ABSENT)

    # -- the renewer ----------------------------------------------------------------------

    async def _answer(self, peer: str, asked: PeerMessage) -> None:
        """A LEND: lend the current checkpoint, or say why not."""
        answer = PeerMessage(PeerKind.LENT, asked.group, asked.topic, ref=asked.ref)
        try:
            checkpoint = PopCheckpointInfo.parse(asked.handle)
        except ValueError:
            self.links.send(peer, _with(answer, Outcome.ABSENT))
            return
        lite = asked.topic or None
        if self.renewer.was_acked(asked.group, checkpoint, lite):
            self.links.send(peer, _with(answer, Outcome.ACKED))
            return
        renewal = await self.renewer.begin_settle(asked.group, checkpoint, lite)
        if renewal is None:
            self.links.send(peer, _with(answer, Outcome.ABSENT))
            return
        current = _with(answer, Outcome.LENT, renewal.popped.checkpoint)
        if not self.links.send(peer, current):
            self.renewer.end_settle(renewal, settled=False)
            return
        key = (peer, asked.ref)
        expiry = asyncio.get_running_loop().call_later(self.lend_s, self._expire, key)
        self._loans[key] = _Loan(renewal, expiry)
        self.lent += 1

    def _lent(self, peer: str, message: PeerMessage) -> None:
        ask = self._asks.get(message.ref)
        if ask is None or ask[0] != peer or ask[1].done():
            if message.outcome is Outcome.LENT:  # asked too late: the settle went on without it
                self.links.send(peer, _returned(message.ref, Outcome.KEPT))
            return
        if message.outcome is Outcome.LENT:
            try:
                lent = Lent(peer, message.ref, PopCheckpointInfo.parse(message.handle))
            except ValueError:
                ask[1].set_result(Outcome.ABSENT)
                return
            ask[1].set_result(lent)
        else:
            acked = message.outcome is Outcome.ACKED
            ask[1].set_result(Outcome.ACKED if acked else Outcome.ABSENT)

    def _expire(self, key: tuple[str, int]) -> None:
        loan = self._loans.pop(key, None)
        if loan is not None:
            self.expired += 1
            log.info("no RETURN from %s in %.1f s: renewing its loan again", key[0], self.lend_s)
            self._end(loan, Outcome.KEPT)

    def _end(self, loan: _Loan, outcome: Outcome) -> None:
        loan.expiry.cancel()
        settled = outcome in (Outcome.ACKED, Outcome.SETTLED)
        self.renewer.end_settle(loan.renewal, settled, by_ack=outcome is Outcome.ACKED)


def _returned(ref: int, outcome: Outcome) -> PeerMessage:
    return PeerMessage(PeerKind.RETURN, "", "", ref=ref, outcome=outcome)


def _with(message: PeerMessage, outcome: Outcome, handle: str = "") -> PeerMessage:
    return PeerMessage(
        message.kind, message.group, message.topic, ref=message.ref, handle=handle, outcome=outcome
    )
