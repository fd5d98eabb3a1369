"""The connections a drain waits for (proxy/api/connections.py), on a clock the test moves:
busy while open (the kernel's table) or, without the table, while a call is open or just
ended, until the connection has aged; and the kernel's table, read for real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.api.connections import (
    AGED_MARGIN_S,
    CONNECTION_AGE_JITTER,
    IDLE_S,
    PRUNE_EVERY_S,
    Connections,
    open_peers,
)
from testkit.waits import wait_for

NOW = [100.0]


def connections(max_age_s: float = 10.0) -> Connections:
    return Connections(max_age_s, clock=lambda: NOW[0])


def test_a_stream_keeps_its_connection_busy_until_the_connection_has_aged():
    NOW[0] = 100.0
    c = connections()
    lifetime = 10.0 * (1 + CONNECTION_AGE_JITTER) + AGED_MARGIN_S
    assert c.lifetime_s == lifetime
    with c.on("ipv4:10.0.0.1:5000"):  # a Telemetry stream, open for good
        NOW[0] += IDLE_S * 4
        assert c.busy() == 1  # open: busy, however long since it started
        NOW[0] = 100.0 + lifetime - 0.01
        assert c.busy() == 1
        NOW[0] = 100.0 + lifetime + 0.001
        assert c.busy() == 0  # aged: its GOAWAY has gone; no new call comes on it


def test_a_connection_whose_calls_ended_is_idle_after_a_moment():
    NOW[0] = 100.0
    c = connections()
    with c.on("ipv4:10.0.0.1:5000"):
        NOW[0] += 1.0
    assert c.busy() == 1  # just ended: its client may send again at once
    NOW[0] += IDLE_S
    assert c.busy() == 0  # a closed client's connection, or a quiet one
    with c.on("ipv4:10.0.0.1:5000"):
        pass
    assert c.busy() == 1  # heard from again


def test_a_connection_ages_from_its_first_call_not_its_last():
    NOW[0] = 100.0
    c = connections(max_age_s=1.0)
    for _ in range(10):
        with c.on("ipv4:10.0.0.1:5000"):
            NOW[0] += 0.1
    assert c.busy() == 1
    NOW[0] = 100.0 + c.lifetime_s + 0.001
    with c.on("ipv4:10.0.0.2:6000"):
        pass
    assert c.busy() == 1  # the second connection only: the first has aged


def test_a_port_used_again_after_its_connection_aged_is_a_new_connection():
    NOW[0] = 100.0
    c = connections(max_age_s=1.0)
    with c.on("ipv4:10.0.0.1:5000"):
        pass
    NOW[0] += c.lifetime_s + 1
    with c.on("ipv4:10.0.0.1:5000"):
        pass
    NOW[0] += c.lifetime_s - 0.1  # aged, were it the old connection
    with c.on("ipv4:10.0.0.1:5000"):
        assert c.busy() == 1


def test_aged_connections_are_forgotten():
    NOW[0] = 100.0
    c = connections(max_age_s=1.0)
    for port in range(100):
        with c.on(f"ipv4:10.0.0.1:{port}"):
            pass
    assert len(c) == 100
    NOW[0] += c.lifetime_s + 0.001
    with c.on("ipv4:10.0.0.2:1"):
        pass
    assert len(c) == 1


class _Context:
    """The one thing ``Connections.call`` reads of a servicer context: its peer."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.asked = 0

    def peer(self) -> str:
        self.asked += 1
        return self._peer


def test_a_call_is_noted_on_the_connection_its_context_names():
    NOW[0] = 100.0
    c = connections()
    context = _Context("ipv4:10.0.0.1:5000")
    with c.call(context):  # type: ignore[arg-type]
        assert c.busy() == 1 and len(c) == 1
    assert context.asked == 1


def test_connections_that_never_age_are_not_tracked():
    NOW[0] = 100.0
    c = connections(max_age_s=0)
    context = _Context("ipv4:10.0.0.1:5000")
    with c.call(context):  # type: ignore[arg-type]
        assert c.busy() == 0 and len(c) == 0
    assert c.lifetime_s == 0
    assert context.asked == 0  # not even the peer asked for: every call pays for this


# With the kernel's table of open connections (Linux): what is open and has not aged.


def test_a_quiet_connection_still_open_is_busy_until_it_has_aged():
    """A client whose stream has ended and that sends once a second: between its calls it
    holds none, but its connection is open, and its next call would cross the server's
    stop. Without the table it looks idle."""
    NOW[0] = 100.0
    c = connections()
    with c.on("ipv4:10.0.0.1:5000"):
        pass
    NOW[0] += IDLE_S * 4
    assert c.busy() == 0  # the guess without the table
    assert c.busy({"ipv4:10.0.0.1:5000"}) == 1
    assert c.busy(set()) == 0  # closed: gone from the table
    NOW[0] = 100.0 + c.lifetime_s + 0.001
    assert c.busy({"ipv4:10.0.0.1:5000"}) == 0  # aged: no new call comes on it


def test_an_open_connection_no_call_has_named_ages_from_when_it_was_first_seen():
    NOW[0] = 100.0
    c = connections()
    assert c.busy({"ipv4:10.0.0.9:7000"}) == 1
    NOW[0] += 5.0
    with c.on("ipv4:10.0.0.9:7000"):  # its first call, taken up late
        pass
    NOW[0] = 100.0 + c.lifetime_s + 0.001
    assert c.busy({"ipv4:10.0.0.9:7000"}) == 0  # from when first seen, not its first call
    NOW[0] = 200.0
    assert c.busy(set()) == 0
    assert c.busy({"ipv4:10.0.0.9:7000"}) == 0  # the call's record: aged long ago


def test_an_aged_connection_holding_a_stream_is_not_taken_for_a_new_one():
    NOW[0] = 100.0
    c = connections(max_age_s=1.0)
    with c.on("ipv4:10.0.0.1:5000"):  # a Telemetry stream outliving its connection's age
        NOW[0] += c.lifetime_s + PRUNE_EVERY_S + 1
        with c.on("ipv4:10.0.0.2:6000"):  # prunes
            pass
        assert c.busy({"ipv4:10.0.0.1:5000"}) == 0
    NOW[0] += PRUNE_EVERY_S + c.lifetime_s
    with c.on("ipv4:10.0.0.3:6000"):
        pass
    assert len(c) == 1  # forgotten once it held no call


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the kernel's table is Linux's")
def test_open_peers_names_this_process_s_connections_to_a_port_as_grpc_names_peers():
    listener = socket.socket(socket.AF_INET6)
    listener.bind(("::", 0))
    listener.listen()
    port = listener.getsockname()[1]
    held = []
    try:
        v4 = socket.create_connection(("127.0.0.1", port))
        v4_side, v4_address = listener.accept()
        v6 = socket.create_connection(("::1", port))
        v6_side, v6_address = listener.accept()
        held += [v4, v4_side, v6, v6_side]
        assert open_peers(port) == frozenset(
            {
                f"ipv4:127.0.0.1:{v4_address[1]}",  # an IPv4 client of an IPv6 listener
                f"ipv6:[::1]:{v6_address[1]}",
            }
        )
        v4.close()
        v4_side.close()
        assert open_peers(port) == frozenset({f"ipv6:[::1]:{v6_address[1]}"})
    finally:
        for s in held:
            s.close()
        listener.close()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the kernel's table is Linux's")
def test_open_peers_leaves_out_another_process_s_connections():
    """/proc/net/tcp lists every socket of the network namespace: a proxy's other workers
    accept on the same port, and their connections are not this worker's to wait for."""
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import socket, sys\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\n"
            "a, _ = s.accept(); print('accepted', flush=True); sys.stdin.read()\n"
        )],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)):
            assert child.stdout.readline().strip() == "accepted"
            assert open_peers(port) == frozenset()
    finally:
        child.kill()
        child.wait(10)


def test_a_drain_names_the_open_connections_it_waits_for():
    NOW[0] = 100.0
    c = connections()
    with c.on("ipv4:10.0.0.1:5000"):
        NOW[0] += 2.0
        c.busy({"ipv4:10.0.0.1:5000", "ipv4:10.0.0.2:6000"})
        NOW[0] += 1.0
        assert c.describe({"ipv4:10.0.0.2:6000", "ipv4:10.0.0.1:5000"}) == [
            "ipv4:10.0.0.1:5000 (opened 3.0 s ago or more, 1 calls open)",
            "ipv4:10.0.0.2:6000 (opened 1.0 s ago or more, no call seen)",
        ]
        NOW[0] += c.lifetime_s - 2.0  # the first has aged, the second not yet
        assert c.describe({"ipv4:10.0.0.2:6000", "ipv4:10.0.0.1:5000"}, busy_only=True) == [
            f"ipv4:10.0.0.2:6000 (opened {c.lifetime_s - 1.0:.1f} s ago or more, no call seen)",
        ]


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="the kernel's table is Linux's")
def test_a_connection_its_client_closed_is_not_open_but_can_still_be_named():
    """Closed by its client and not yet by this side (CLOSE_WAIT): no new call comes on
    it, but it can still hold gRPC's stop, and the drain's last log line names it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    server_side, address = listener.accept()
    try:
        client.close()
        peer = f"ipv4:127.0.0.1:{address[1]}"
        # The FIN, on loopback: at once, but bounded.
        wait_for(lambda: open_peers(port) == frozenset(), timeout=1, what="the client's FIN")
        assert open_peers(port, closing=True) == frozenset({peer})
    finally:
        server_side.close()
        listener.close()
