"""A flood of Telemetry Settings naming new groups and client ids, on broker stubs, with
the user file on (the Settings a user may not make register nothing) and off (everything
is allowed, and the bounds alone hold): 10,000 Settings, over 1,000 streams on four
connections, in waves of 250 streams held open at once, each writing ten Settings. At the
peak of each wave the registrations, their slot connections, the process's open files and
the /metrics series are within their bounds, each bound reached, while a real client
sends, receives and acks throughout.

The bounds, made small enough to reach in seconds: ``max_registered_clients`` 150,
``max_registered_per_group`` 30, and a process budget of 160 descriptors, of which the
registrations' connections may hold a quarter (40: 20 slots on the two brokers).
"""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

from proxy import descriptors
from proxy.api.v2 import definition_pb2 as pb
from proxy.descriptors import DescriptorBudget
from proxy.processor.registrations import Refusal
from proxy.security import signing
from proxy.security.config import SecurityConfig, TlsMode
from testkit.lean_client import LeanClient, TelemetryStream, consumer_settings
from testkit.metrics_text import every_sample, total
from testkit.waits import wait_until
from tests.support.secure_client import SecureLeanClient

MAX_CLIENTS = 150
MAX_PER_GROUP = 30
BUDGET = 160
CONNECTIONS = BUDGET // 4  # the registrations' share: 20 slots of 2 brokers
WAVES = 4
SETTINGS_PER_STREAM = 10
# Streams of one wave, by what their Settings name: "hot" one group on T (each client a
# slot, two connections, of its own: the connections' bound), "lost" one group on a topic
# no broker serves (no connection: the group's bound), "denied" a new group the flood's
# user may not subscribe (FORBIDDEN with the user file; with none, new groups like the
# rest), "fresh" a new group on T in each Settings (the clients' bound).
HOT, LOST, DENIED, FRESH = 40, 40, 20, 150
CHANNELS = 4
# Descriptors the process may open during a wave beyond the slot connections and their
# stub ends (the proxy's own: name server look-ups, gRPC's wake-ups).
FD_SLACK = 24
# Label sets (histogram buckets aside) /metrics may gain beyond the lag pairs: broker
# request codes by broker and answer, a fixed set.
SERIES_SLACK = 64

USERS = """
[[users]]
access_key = "flood"
secret_key = "flood-secret"
subscribe = [{ group = "g-*", topic = "T" }, { group = "hot", topic = "T" },
             { group = "lost", topic = "*" }]

[[users]]
access_key = "real"
secret_key = "real-secret"
publish = ["T"]
subscribe = [{ group = "real", topic = "T" }]
"""


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _signed(access_key: str | None, secret_key: str) -> tuple[tuple[str, str], ...]:
    if access_key is None:
        return ()
    date_time = signing.now_date_time()
    header = signing.authorization_header(access_key, secret_key, date_time)
    return ((signing.DATE_TIME, date_time), (signing.AUTHORIZATION, header))


def _settings(group: str, topic: str = "T") -> pb.Settings:
    return consumer_settings(pb.ClientType.PUSH_CONSUMER, group, topic, 1000)


def _next_settings(kind: str, wave: int, n: int, users: bool) -> tuple[pb.Settings, bool]:
    """A stream's next Settings by its kind, and whether the flood's user may make them."""
    if kind == "hot":
        return _settings("hot"), True
    if kind == "lost":
        return _settings("lost", "Nowhere"), True
    if kind == "denied":
        return _settings(f"x-{wave}-{n}"), not users
    return _settings(f"g-{wave}-{n}"), True


def _label_sets(text: str) -> set[tuple[str, frozenset]]:
    """Every series of the exposition, a histogram's buckets counted once."""
    return {
        (name, frozenset((k, v) for k, v in labels.items() if k != "le"))
        for name, labels, _ in every_sample(text)
    }


class _RealClient:
    """A consumer and producer of its own on T: holds its Telemetry stream (registered in
    group "real") and, until stopped, sends, receives and acks, one message a round."""

    def __init__(self, endpoint: str, users: bool) -> None:
        if users:
            self.client: LeanClient = SecureLeanClient(
                endpoint, "real-client", access_key="real", secret_key="real-secret"
            )
        else:
            self.client = LeanClient(endpoint, "real-client", own_connection=True)
        self.signed = _signed("real", "real-secret") if users else ()
        self.stream = TelemetryStream(self.client, "real-client", self.signed)
        self.rounds = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def round(self) -> None:
        body = f"real-{self.rounds}".encode()
        sent = await self.client.send("T", body)
        assert sent.status.code == pb.Code.OK, sent.status
        for _ in range(20):
            got = await self.client.receive("real", "T", await_ms=1000, batch=32)
            assert got.status in (pb.Code.OK, pb.Code.MESSAGE_NOT_FOUND), got
            if got.messages:
                acked = await self.client.ack("real", "T", got.messages)
                assert acked.status.code == pb.Code.OK, acked.status
            if body in {m.body for m in got.messages}:
                self.rounds += 1
                return
        raise AssertionError(f"{body!r} was never received")

    def start(self) -> None:
        async def run() -> None:
            while not self._stop.is_set():
                await self.round()

        self._task = asyncio.ensure_future(run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)  # raises what a round raised

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.stream.close()
        await self.client.close()


class _Flood:
    """The flood's streams, on ``CHANNELS`` connections, signed as the flood's user when
    there is a user file; each stream a client id of its own."""

    def __init__(self, endpoint: str, users: bool) -> None:
        self.users = users
        self.channels = [LeanClient(endpoint, None, connection=i + 1) for i in range(CHANNELS)]
        self.key = ("flood", "flood-secret") if users else (None, "")
        self.streams: list[TelemetryStream] = []
        self.denied_sent = 0  # Settings answered FORBIDDEN
        self._names = itertools.count()

    def open(self, channel: int | None = None, client_id: str | None = None) -> TelemetryStream:
        n = len(self.streams)
        on = self.channels[n % CHANNELS if channel is None else channel]
        stream = TelemetryStream(on, client_id or f"flood-{n}", _signed(*self.key))
        self.streams.append(stream)
        return stream

    async def settle(self, kind: str, stream: TelemetryStream, times: int, wave: int) -> None:
        """Write ``times`` Settings of ``kind``, each answer as the user file says."""
        for _ in range(times):
            settings, allowed = _next_settings(kind, wave, next(self._names), self.users)
            answer = await stream.settle(settings)
            if allowed:
                assert answer.status.code == pb.Code.OK, answer.status
                assert answer.HasField("settings")
            else:
                self.denied_sent += 1
                assert answer.status.code == pb.Code.FORBIDDEN, answer.status
                assert not answer.HasField("settings")

    async def wave(self, wave: int) -> list[TelemetryStream]:
        """One wave's streams, each having written its ``SETTINGS_PER_STREAM``: the groups'
        bounds first, then the clients', then every stream's later Settings at once (each
        replacing its stream's registration). They stay open."""
        sizes = {"hot": HOT, "lost": LOST, "denied": DENIED, "fresh": FRESH}
        streams = {kind: [self.open() for _ in range(n)] for kind, n in sizes.items()}

        async def each(kinds: tuple[str, ...], times: int) -> None:
            await asyncio.gather(
                *(self.settle(k, s, times, wave) for k in kinds for s in streams[k])
            )

        await each(("hot", "lost"), 1)
        await each(("denied", "fresh"), 1)
        await each(tuple(sizes), SETTINGS_PER_STREAM - 1)
        return [s for group in streams.values() for s in group]

    async def close(self) -> None:
        for stream in self.streams:
            stream.close()
        for channel in self.channels:
            await channel.close()


@pytest.mark.parametrize("users", [True, False], ids=["users_file", "no_users_file"])
async def test_a_flood_of_settings_stays_within_every_bound(
    monkeypatch, tmp_path, start_proxy, users
):
    budget = DescriptorBudget(BUDGET)
    monkeypatch.setattr(descriptors, "_process", budget)  # the process's, for this proxy
    security = SecurityConfig(tls_mode=TlsMode.DISABLED)
    if users:
        path = tmp_path / "users.toml"
        path.write_text(USERS)
        security = SecurityConfig(tls_mode=TlsMode.DISABLED, users_file=str(path))
    app = await start_proxy(
        mode="notify",
        brokers=2,
        topics=("T",),
        security=security,
        proxy_options={
            "max_registered_clients": MAX_CLIENTS,
            "max_registered_per_group": MAX_PER_GROUP,
        },
    )
    registrations = app.registrations
    assert registrations is not None and app.lag is not None and app.front is not None
    assert registrations.budget is budget is app.front.budget  # one budget, shared
    assert registrations.max_connections == CONNECTIONS
    endpoint = f"127.0.0.1:{app.grpc_port}"
    real = _RealClient(endpoint, users)
    flood = _Flood(endpoint, users)

    def peak() -> str:
        return f"registrations {registrations.status()}, budget {budget.status()}"

    try:
        assert (await real.stream.settle(_settings("real"))).status.code == pb.Code.OK
        for _ in range(2):
            await real.round()
        for channel in range(CHANNELS):  # each connection open, and its relay
            warm = flood.open(channel, "warm-up")
            assert (await warm.settle(_settings("g-warm"))).status.code == pb.Code.OK
            warm.close()
        await wait_until(lambda: registrations.status()["clients"] == 1, timeout=10)
        await wait_until(lambda: app.session.status()["streams"] == 1, timeout=10)
        idle_fds = _fds()
        idle_series = _label_sets(await _metrics_text(app))
        real.start()
        for wave in range(WAVES):
            streams = await flood.wave(wave)
            status = registrations.status()
            assert status["clients"] == MAX_CLIENTS, peak()  # reached, not passed
            assert registrations.clients_of("hot") == CONNECTIONS // 2, peak()
            assert registrations.clients_of("lost") == MAX_PER_GROUP, peak()
            assert status["reserved"] == CONNECTIONS, peak()
            assert status["connections"] <= CONNECTIONS, peak()
            assert budget.held <= budget.total, peak()
            refused_by = status["refused_by"]
            assert refused_by[Refusal.CONNECTIONS] >= (wave + 1) * (HOT - CONNECTIONS // 2)
            assert refused_by[Refusal.GROUP] >= (wave + 1) * (LOST - MAX_PER_GROUP)
            assert refused_by[Refusal.CLIENTS] > 0
            groups = {c.consumer_group for c in registrations._clients.values()}
            if users:  # the Settings the user may not make never registered
                assert not any(g.startswith("x-") for g in groups), sorted(groups)
            # Open files: the slot connections (and their stubs' ends, in this process)
            # within their share, nothing else grown but a little.
            grown = _fds() - idle_fds
            assert grown <= 2 * CONNECTIONS + FD_SLACK, (grown, peak())
            # /metrics: the lag of each registered pair with a route, nothing per client.
            await app.lag.refresh_once()
            text = await _metrics_text(app)
            lag = _lag_pairs(text)
            routed = {pair for pair in registrations.consumed() if pair[1] == "T"}
            assert lag == routed and len(lag) <= MAX_CLIENTS
            series = _label_sets(text)
            assert len(series - idle_series) <= 2 * MAX_CLIENTS + SERIES_SLACK, len(series)
            assert "flood-" not in text  # no client id is a label
            for reason in Refusal:
                name = "rocketmq_proxy_client_registrations_refused_total"
                assert total(text, name, reason=reason) == refused_by[reason], reason
            if users:
                assert not any(g.startswith("x-") for g, _ in lag)
                forbidden = total(
                    text, "rocketmq_proxy_auth_denied_total", rpc="telemetry", reason="forbidden"
                )
                assert forbidden == flood.denied_sent > 0
            for stream in streams:
                stream.close()
            await wait_until(lambda: registrations.status()["clients"] == 1, 20, what=peak)
            # The wave's slots close and give their descriptors back (the real client's
            # slot stays, with its two).
            await wait_until(lambda: registrations.status()["reserved"] == 2, 20, what=peak)
        await real.stop()
        assert real.rounds >= 3
        flooded = len(flood.streams) - CHANNELS  # the warm-up's aside
        assert flooded * SETTINGS_PER_STREAM == 10_000  # each answered, as checked
        await app.lag.refresh_once()
        assert _lag_pairs(await _metrics_text(app)) == {("real", "T")}  # the flood's left
    finally:
        await flood.close()
        await real.close()


def _lag_pairs(text: str) -> set[tuple[str, str]]:
    return {
        (labels["group"], labels["topic"])
        for name, labels, _ in every_sample(text)
        if name == "rocketmq_proxy_consumer_lag_messages"
    }


async def _metrics_text(app) -> str:
    """What /metrics serves."""
    body, _ = app.metrics.render()
    return body.decode()
