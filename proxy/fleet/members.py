"""Who probes a key: rendezvous (highest random weight) hashing over the live proxies.

Every proxy computes the same owner from the same member list, with no coordination. A
proxy joining or leaving moves only the keys it takes or held (about K / P of them), with
no virtual nodes and no ring to keep.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
from collections.abc import Iterable

log = logging.getLogger(__name__)

DNS_PREFIX = "dns:"


def _weight(member: str, group: str, topic: str) -> bytes:
    return hashlib.blake2b(f"{group}\0{topic}\0{member}".encode(), digest_size=8).digest()


def owner_of(members: Iterable[str], group: str, topic: str) -> str:
    """The member that probes (``group``, ``topic``); ties cannot happen in practice (64-bit
    weights) and break by name, so every proxy agrees."""
    best = max(members, key=lambda m: (_weight(m, group, topic), m), default=None)
    if best is None:
        raise ValueError("no members")
    return best


class Members:
    """Where the member list comes from: each entry of ``peers`` is a proxy's fleet address
    ("host:port"), or "dns:NAME:PORT", a name that resolves to all of them (a Kubernetes
    headless Service: its records follow the ready pods). Resolved again every
    ``refresh_s``."""

    def __init__(self, peers: Iterable[str], refresh_s: float = 5.0) -> None:
        self.peers = list(peers)
        self.refresh_s = refresh_s

    async def resolve(self) -> list[str] | None:
        """Every member's address; None when a name could not be resolved (keep the last
        list: a DNS outage must not empty the fleet)."""
        out: list[str] = []
        for entry in self.peers:
            if not entry.startswith(DNS_PREFIX):
                out.append(entry)
                continue
            name, _, port = entry.removeprefix(DNS_PREFIX).rpartition(":")
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    name, int(port), type=socket.SOCK_STREAM
                )
            except OSError as exc:
                log.warning("fleet members: %s did not resolve: %s", name, exc)
                return None
            out.extend(f"{info[4][0]!s}:{port}" for info in infos)
        return sorted(set(out))
