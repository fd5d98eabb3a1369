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
import json
import logging
from dataclasses import dataclass
from typing import Protocol

from proxy.background import start_background, stop_background
from proxy.fleet.links import PeerLinks
from proxy.fleet.members import owner_of
from proxy.fleet.messages import Outcome, PeerKind, PeerMessage
from proxy.processor.consumer import Popped
from proxy.processor.renewal import HandleRenewer, Renewal
from proxy.remoting.popinfo import PopCheckpointInfo

log = logging.getLogger(__name__)

# How long a settler waits for LENT, from all the members it asks, before it settles with
# the client's handle: a peer on the same network answers in a millisecond, unless a
# renewal of the message is in flight (one broker request). The client's deadline (3 s in
# the official clients) leaves the rest to the broker's ack.
ASK_S = 1.0
# How long a member keeps a message lent, unrenewed, without news of its settle: the
# settler's broker request and more. Under the renewal's lead (``ahead_ms``, 10 s) so that
# a message whose settler vanished is renewed again before its slice ends.
LEND_S = 6.0
# How long a leaving proxy waits for its ADOPTs to be written to its heir's stream.
HAND_OVER_S = 2.0
# What rendezvous hashing names an heir by (a member's renewals, not a key's probes).
HEIRS = "renewals of"
# Members asked for a message at most: the one its handle names, its heir, that one's heir.
HOPS = 3


class SettleLinks(PeerLinks, Protocol):
    """What settles need of the transport: the probes' links, and a flush for the ADOPTs
    of a proxy about to close them."""

    async def flush(self, peer: str, timeout_s: float) -> bool:
        """Wait until what was queued for ``peer`` is written; False if it was not."""
        ...


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
        self, links: SettleLinks, renewer: HandleRenewer, *, ask_s: float = ASK_S,
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
        self.adopted = 0  # renewals taken over from a member that left (and held)

    # -- the settler ----------------------------------------------------------------------

    def heir(self, member: str) -> str | None:
        """The member that takes ``member``'s renewals when it leaves: one for all of them,
        by rendezvous hashing over the others, so that every member names the same."""
        others = [m for m in self.links.members() if m != member]
        return owner_of(others, HEIRS, member) if others else None

    async def lend(
        self, member: str, group: str, checkpoint: PopCheckpointInfo, lite_topic: str | None
    ) -> Lent | Outcome:
        """Borrow the current checkpoint of the message the client's ``checkpoint`` names
        from the renewer its handle names, ``member``, or else from that member's heir (it
        left, and handed its renewals over), and so on for ``HOPS`` members (a rolling
        restart passes a message on at each drain): ``Lent`` (then ``give_back`` it,
        whatever happens), ACKED (acked there lately), or ABSENT (settle with the client's
        own handle: renewed by none of them, or no answer in ``ask_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ask_s  # for all of them: the broker's ack comes after
        asked: set[str] = set()
        renewer: str | None = member
        while renewer is not None and renewer not in asked and len(asked) < HOPS:
            asked.add(renewer)
            left = deadline - loop.time()
            if left <= 0:
                log.info("no LENT in %.1f s: settling with the client's handle", self.ask_s)
                break
            got = await self._lend(renewer, group, checkpoint, lite_topic, left)
            if got is not Outcome.ABSENT:
                return got
            renewer = self.heir(renewer)
        return Outcome.ABSENT

    async def _lend(
        self, member: str, group: str, checkpoint: PopCheckpointInfo, lite_topic: str | None,
        timeout_s: float,
    ) -> Lent | Outcome:  # fmt: skip
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
            result = await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            log.info("no LENT from %s in %.2f s", member, timeout_s)
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

    async def hand_over(self, timeout_s: float = HAND_OVER_S) -> int:
        """This proxy is leaving (its gRPC server has stopped, its links are about to
        close): send every message it renews to its heir, which renews them from now on,
        so that they do not come back after their slice while their clients consume them.
        The number handed over; what the heir did not get comes back after its slice, as
        after a crash."""
        heir = self.heir(self.links.self_id)
        if heir is None:
            return 0
        handed = 0
        for renewal in await self.renewer.hand_over():
            adopt = PeerMessage(
                PeerKind.ADOPT, renewal.popped.group, renewal.popped.topic,
                handle=_renewal_json(renewal),
            )  # fmt: skip
            handed += self.links.send(heir, adopt)
        if handed and not await self.links.flush(heir, timeout_s):
            log.warning("renewals handed over to %s may not have reached it", heir)
        if handed:
            log.info("%d renewals handed over to %s", handed, heir)
        return handed

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
        elif message.kind is PeerKind.ADOPT:
            try:
                renewal = _renewal_from_json(message.handle)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("an ADOPT from %s refused: %s", peer, exc)
                return
            self.adopted += self.renewer.adopt(renewal)

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


def _renewal_json(renewal: Renewal) -> str:
    popped = renewal.popped
    return json.dumps(
        {
            "client": renewal.client_id, "broker": popped.broker, "group": popped.group,
            "topic": popped.topic, "checkpoint": popped.checkpoint,
            "commit_log_offset": popped.commit_log_offset, "msg_id": popped.msg_id,
            "lite_topic": popped.lite_topic, "reconsume_times": renewal.reconsume_times,
            "delivered_ms": renewal.delivered_ms, "handed_pop_time": renewal.handed_pop_time,
        },
        separators=(",", ":"),
    )  # fmt: skip


def _renewal_from_json(text: str) -> Renewal:
    d = json.loads(text)
    popped = Popped(
        str(d["broker"]), str(d["group"]), str(d["topic"]), str(d["checkpoint"]),
        int(d["commit_log_offset"]), str(d["msg_id"]),
        str(d["lite_topic"]) if d["lite_topic"] is not None else None,
    )  # fmt: skip
    PopCheckpointInfo.parse(popped.checkpoint)  # ValueError if it is not one
    return Renewal(
        str(d["client"]), popped, int(d["reconsume_times"]), int(d["delivered_ms"]),
        int(d["handed_pop_time"]),
    )  # fmt: skip
