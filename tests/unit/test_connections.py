"""The connections a drain waits for (proxy/api/connections.py), on a clock the test moves:
busy while a call is open or just ended, until the connection has aged."""

from __future__ import annotations

from proxy.api.connections import AGED_MARGIN_S, CONNECTION_AGE_JITTER, IDLE_S, Connections

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
