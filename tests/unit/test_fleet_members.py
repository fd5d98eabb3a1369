"""Fleet membership and frames (proxy/fleet): rendezvous ownership moves only the keys of a
proxy that joins or leaves; a DNS name that does not resolve keeps the last member list;
a frame that is not a list of messages is refused, not half-read."""

from __future__ import annotations

import asyncio

import pytest

from proxy.fleet.members import Members, owner_of
from proxy.fleet.messages import PeerKind, PeerMessage
from proxy.fleet.transport import decode, encode

KEYS = [(f"group-{i}", f"topic-{i % 7}") for i in range(3000)]


def test_rendezvous_spreads_keys_and_moves_only_those_of_a_proxy_that_leaves():
    members = [f"10.0.0.{i}:8083" for i in range(10)]
    owners = {key: owner_of(members, *key) for key in KEYS}
    per_member = [list(owners.values()).count(m) for m in members]
    assert min(per_member) > 3000 / 10 * 0.8 and max(per_member) < 3000 / 10 * 1.2
    gone = members[3]
    after = {key: owner_of([m for m in members if m != gone], *key) for key in KEYS}
    moved = {key for key in KEYS if after[key] != owners[key]}
    assert moved == {key for key in KEYS if owners[key] == gone}
    # Every proxy computes the same owner whatever order it lists the members in.
    assert all(owner_of(reversed(members), *key) == owners[key] for key in KEYS[:100])


def test_a_name_that_does_not_resolve_keeps_the_last_list():
    async def resolve() -> tuple[list[str] | None, list[str] | None]:
        static = await Members(["127.0.0.1:8083", "127.0.0.2:8083"]).resolve()
        lost = await Members(["127.0.0.1:8083", "dns:no-such-host.invalid:8083"]).resolve()
        return static, lost

    static, lost = asyncio.run(resolve())
    assert static == ["127.0.0.1:8083", "127.0.0.2:8083"]
    assert lost is None  # FleetLinks keeps its members on None


def test_localhost_resolves_to_its_addresses_on_the_port():
    resolved = asyncio.run(Members(["dns:localhost:8083"]).resolve())
    assert resolved and "127.0.0.1:8083" in resolved


def test_frames_carry_every_field_and_refuse_anything_else():
    messages = [
        PeerMessage(PeerKind.WATCH, "g", "t", ("broker-a", "broker-b"), 59.5, order=True),
        PeerMessage(PeerKind.DONE, "g", "t", ("broker-a",), missed=True),
        PeerMessage(PeerKind.WAKE, "g", "t", ("broker-b",)),
    ]
    assert decode(encode(messages)) == messages
    assert decode(b"[]") == []  # a heartbeat
    for bad in (b"{", b'{"kind": "watch"}', b'[["nope", "g", "t", [], 0, 0, 0]]', b"[[1, 2]]"):
        with pytest.raises(ValueError):
            decode(bad)
