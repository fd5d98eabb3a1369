"""Settling through the fleet a message another proxy renews (``proxy/fleet/settle.py``):
two members linked by the real fleet transport on loopback, each with a renewer; the
broker behind the renewer is the one of test_renewal.py, which records every change."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from proxy.api.handles import ReceiptHandle, parse_receipt_handle
from proxy.fleet.members import Members
from proxy.fleet.messages import Outcome
from proxy.fleet.settle import FleetSettles, Lent
from proxy.fleet.transport import FleetLinks, PeerHandlers
from proxy.processor.renewal import HandleRenewer
from proxy.remoting.popinfo import PopCheckpointInfo
from testkit.waits import wait_until
from tests.support.ports import free_port
from tests.unit.test_renewal import NOW, _Consumer, popped, renewer


class Member:
    def __init__(self, address: str, peers: list[str], **settle_options: float) -> None:
        self.consumer = _Consumer()
        self.renewer: HandleRenewer = renewer(self.consumer)
        self.links = FleetLinks(Members(peers, 5.0), address)
        self.settles = FleetSettles(self.links, self.renewer, **settle_options)

    async def start(self) -> None:
        await self.links.start(PeerHandlers(None, self.settles))

    async def close(self) -> None:
        await self.links.close()
        await self.settles.close()


@contextlib.asynccontextmanager
async def fleet(
    renewer_options: dict | None = None, settler_options: dict | None = None
) -> AsyncIterator[tuple[Member, Member]]:
    """Two linked members: the one that renews, the one a client's ack reaches."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    renewing = Member(addresses[0], addresses, **(renewer_options or {}))
    settling = Member(addresses[1], addresses, **(settler_options or {}))
    linked = [(renewing, addresses[1]), (settling, addresses[0])]
    for member in (renewing, settling):
        await member.start()
    try:
        await wait_until(lambda: all(m.links.status()["up"] == [other] for m, other in linked), 10)
        yield renewing, settling
    finally:
        for member in (settling, renewing):
            await member.close()


def client_checkpoint(offset: int) -> PopCheckpointInfo:
    return PopCheckpointInfo.parse(popped(offset).checkpoint)


async def renewed_once(member: Member, offset: int) -> None:
    """Deliver the message at ``offset`` to a push consumer and renew it once, so that the
    client's checkpoint no longer settles it."""
    NOW[0] = 1_000_000
    member.renewer.add("c1", popped(offset), 0)
    NOW[0] = 1_000_000 + 51_000
    await member.renewer.renew_due()
    assert len(member.consumer.client.changes) == 1


async def lent_after_a_renewal(renewing: Member, settling: Member, offset: int) -> Lent:
    """The message at ``offset``, renewed once by ``renewing``, lent to ``settling``."""
    await renewed_once(renewing, offset)
    lent = await settling.settles.lend(renewing.links.self_id, "G", client_checkpoint(offset), None)
    assert isinstance(lent, Lent)
    return lent


def test_a_handle_names_its_renewer_and_parses_back():
    ck = client_checkpoint(5)
    tagged = ReceiptHandle(ck, 105, "10.0.0.7:7070").encode()
    assert tagged.endswith(" 105 10.0.0.7:7070")
    parsed = parse_receipt_handle(tagged, allow_expired=True)
    assert parsed == ReceiptHandle(ck, 105, "10.0.0.7:7070")
    plain = parse_receipt_handle(ReceiptHandle(ck, 105).encode(), allow_expired=True)
    assert plain.renewer == "" and plain.commit_log_offset == 105


async def test_an_ack_elsewhere_borrows_the_current_checkpoint_and_ends_the_renewal():
    async with fleet() as (renewing, settling):
        lent = await lent_after_a_renewal(renewing, settling, 5)
        assert lent.checkpoint.pop_time == NOW[0]  # the renewal's, not the client's
        # Lent: not renewed while the settle is under way, however due.
        NOW[0] += 25_000
        await renewing.renewer.renew_due()
        assert len(renewing.consumer.client.changes) == 1
        settling.settles.give_back(lent, True, by_ack=True)
        await wait_until(lambda: renewing.renewer.size == 0, 5)
        assert renewing.renewer.was_acked("G", client_checkpoint(5))
        # The client's retry of that ack, at the second member: acked already.
        again = await settling.settles.lend(renewing.links.self_id, "G", client_checkpoint(5), None)
        assert again is Outcome.ACKED
        assert (renewing.settles.lent, settling.settles.borrowed) == (1, 1)


async def test_a_failed_settle_elsewhere_leaves_the_renewal_going():
    async with fleet() as (renewing, settling):
        lent = await lent_after_a_renewal(renewing, settling, 6)
        settling.settles.give_back(lent, False)
        entry = next(iter(renewing.renewer._handles.values()))
        await wait_until(lambda: entry.settling == 0, 5)
        NOW[0] += 25_000
        await renewing.renewer.renew_due()
        assert len(renewing.consumer.client.changes) == 2
        assert not renewing.renewer.was_acked("G", client_checkpoint(6))


async def test_a_message_not_renewed_there_is_settled_with_the_clients_handle():
    async with fleet() as (renewing, settling):
        unknown = await settling.settles.lend(
            renewing.links.self_id, "G", client_checkpoint(7), None
        )
        assert unknown is Outcome.ABSENT
        # A member not in the fleet (gone, or never a member) is not asked at all.
        gone = await settling.settles.lend("127.0.0.1:1", "G", client_checkpoint(7), None)
        assert gone is Outcome.ABSENT


async def test_a_loan_whose_settler_says_nothing_is_renewed_again():
    async with fleet(renewer_options={"lend_s": 0.3}) as (renewing, settling):
        await lent_after_a_renewal(renewing, settling, 8)
        entry = next(iter(renewing.renewer._handles.values()))
        assert entry.settling == 1
        await wait_until(lambda: entry.settling == 0, 5)  # no RETURN: the loan expired
        assert renewing.settles.expired == 1
        NOW[0] += 25_000
        await renewing.renewer.renew_due()
        assert len(renewing.consumer.client.changes) == 2


async def test_a_loan_that_comes_after_the_settler_gave_up_is_returned_at_once():
    async with fleet(settler_options={"ask_s": 0.0001}) as (renewing, settling):
        await renewed_once(renewing, 9)
        late = await settling.settles.lend(renewing.links.self_id, "G", client_checkpoint(9), None)
        assert late is Outcome.ABSENT
        await wait_until(lambda: renewing.settles.lent == 1, 5)
        entry = next(iter(renewing.renewer._handles.values()))
        await wait_until(lambda: entry.settling == 0, 5)
        assert renewing.settles.expired == 0  # returned KEPT by the settler, not expired
        assert renewing.renewer.size == 1


async def test_a_lost_settler_gives_its_loans_back():
    async with fleet(renewer_options={"lend_s": 60.0}) as (renewing, settling):
        await lent_after_a_renewal(renewing, settling, 10)
        entry = next(iter(renewing.renewer._handles.values()))
        await settling.links.close()  # its links go silent: lost within SILENCE_S
        await wait_until(lambda: entry.settling == 0, 10)
        assert renewing.settles.expired == 0


async def test_a_leaving_renewer_hands_its_messages_to_its_heir_who_lends_them():
    """Three members: the renewer leaves (a drain) and hands what it renews to its heir;
    an ack at the third member, with a handle naming the one that left, borrows from the
    heir."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    members = [Member(a, addresses) for a in addresses]
    for member in members:
        await member.start()
    try:
        await wait_until(
            lambda: all(
                m.links.status()["up"] == sorted(set(addresses) - {m.links.self_id})
                for m in members
            ),
            10,
        )
        leaving = members[0]
        heir_id = leaving.settles.heir(leaving.links.self_id)
        heir = next(m for m in members if m.links.self_id == heir_id)
        settler = next(m for m in members if m not in (leaving, heir))
        await renewed_once(leaving, 11)
        current = next(iter(leaving.renewer._handles.values())).checkpoint
        assert await leaving.settles.hand_over() == 1
        assert leaving.renewer.size == 0
        await wait_until(lambda: heir.renewer.size == 1, 5)
        assert heir.settles.adopted == 1
        # The heir renews it from now on, from its current checkpoint.
        NOW[0] += 25_000
        await heir.renewer.renew_due()
        assert [PopCheckpointInfo.parse(ck) for ck, _ in heir.consumer.client.changes] == [current]
        await leaving.links.close()
        lent = await settler.settles.lend(leaving.links.self_id, "G", client_checkpoint(11), None)
        assert isinstance(lent, Lent) and lent.peer == heir_id
        assert lent.checkpoint.pop_time == NOW[0]  # the heir's renewal
        settler.settles.give_back(lent, True, by_ack=True)
        await wait_until(lambda: heir.renewer.size == 0, 5)
    finally:
        for member in members:
            await member.close()
