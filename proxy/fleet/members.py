"""Who probes a key: rendezvous (highest random weight) hashing over the live proxies.

Every proxy computes the same owner from the same member list, with no coordination. A
proxy joining or leaving moves only the keys it takes or held (about K / P of them), with
no virtual nodes and no ring to keep.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def _weight(member: str, group: str, topic: str) -> bytes:
    return hashlib.blake2b(f"{group}\0{topic}\0{member}".encode(), digest_size=8).digest()


def owner_of(members: Iterable[str], group: str, topic: str) -> str:
    """The member that probes (``group``, ``topic``); ties cannot happen in practice (64-bit
    weights) and break by name, so every proxy agrees."""
    best = max(members, key=lambda m: (_weight(m, group, topic), m), default=None)
    if best is None:
        raise ValueError("no members")
    return best
