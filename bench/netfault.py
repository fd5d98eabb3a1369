"""Faults between one proxy and one broker on one machine: nftables rules that drop the
packets one proxy sends to one broker, all of them (the broker is unreachable from that
proxy) or a share (a lossy, slow link), while every other proxy reaches it as before.

The kernel here has no netem (``CONFIG_NET_SCH_NETEM`` is not set; ``tc qdisc add ... netem``
answers "Specified qdisc kind is unknown"), so a slow link is made of loss: TCP sends a
dropped segment again after its retransmission timeout (200 ms at least, doubling each
time), which is how a congested link looks to the proxy.

The rules live in a network namespace of the run's own (``enter_own_network``): the
machine's tables are never touched, and everything the run starts (brokers, proxies,
clients) inherits the namespace and its loopback. A proxy's packets are told from the
others by the group id it runs under (``meta skgid``; ``proxy_gid``): a run as root keeps
its user, so every file stays readable, and only the group differs.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess

CLONE_NEWNET = 0x40000000
TABLE = "soak_faults"
# Proxy i of a run runs under group PROXY_GID_BASE + i (no such group need exist).
PROXY_GID_BASE = 47000

_own_network = False


def enter_own_network() -> None:
    """Move this process into a new network namespace with its loopback up. Call it before
    any thread or socket exists: what it starts later inherits the namespace, and the
    process never leaves it. Needs root (CAP_SYS_ADMIN); fails loudly otherwise.

    A default route over loopback, from 127.0.0.1, stands in for the host's network: the
    Python client finds its own address by connecting a UDP socket to 8.8.8.8, and with no
    route at all it logs an ERROR four times a second. Nothing leaves the namespace."""
    global _own_network
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)} (needs root)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["ip", "route", "add", "default", "dev", "lo", "src", "127.0.0.1"], check=True)
    _own_network = True


def in_own_network() -> bool:
    """Whether ``enter_own_network`` ran in this process (rules may be added)."""
    return _own_network


def proxy_gid(index: int) -> int:
    return PROXY_GID_BASE + index


async def drop(gid: int, port: int, percent: int) -> None:
    """Drop ``percent`` % of the packets that processes of group ``gid`` send to ``port``
    on loopback (100: every one). Replaces any rule set before."""
    if not _own_network:
        raise RuntimeError("network faults need the run's own namespace (enter_own_network)")
    if not 0 < percent <= 100:
        raise ValueError(f"percent out of range: {percent}")
    share = "" if percent == 100 else f"numgen random mod 100 < {percent} "
    rules = (
        f"table inet {TABLE} {{\n"
        "  chain out {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"    meta skgid {gid} tcp dport {port} {share}drop\n"
        "  }\n"
        "}\n"
    )
    await heal()
    await _nft(["-f", "-"], rules)


async def heal() -> None:
    """Remove every rule ``drop`` set (none set: nothing to do)."""
    if _own_network:
        await _nft(["delete", "table", "inet", TABLE], check=False)


async def _nft(args: list[str], stdin: str = "", check: bool = True) -> None:
    proc = await asyncio.create_subprocess_exec(
        "nft", *args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 10)
    if check and proc.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {err.decode().strip()}")
