"""A fleet that probes each key once, as processes: three ``rmq-proxy`` processes sharing
their probes over the fleet port (``[fleet] peers``), in front of two broker stubs, then
of the session's two real RocketMQ 5.5.0 brokers.

- Polls of one (group, topic) on all three proxies park one NOTIFICATION per broker, not
  three (counted on the stubs; a real broker does not tell), and every message sent
  reaches a poll once.
- The key's owner SIGKILLed while another proxy's poll waits: that poll still gets the
  next message, within the link's keepalive and the fallback (about 3 s), not at its
  deadline.
- The owner frozen (SIGSTOP: its links and its probes stop answering, its connections
  stay open): the same.
- The owner restarted on its ports: the links come back and the key is probed once again.

Nothing is lost: every message sent is received once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.api.errors import Code
from proxy.fleet.members import owner_of
from testkit.lean_client import LeanClient
from testkit.waits import wait_until
from tests.support.ports import free_port
from tests.support.proxy_process import ready_line

POLL_MS = 20_000
# A dead or frozen owner is noticed by its link's keepalive (1 s ping, 1 s timeout) or by
# the fallback (1 s without WATCHING); then the poll's proxy probes itself.
NOTICED_S = 4.0
# A push consumer's message is renewed in slices this long (every 5 s, 10 s ahead): at the
# first round after its delivery.
RENEW_SLICE_MS = 8_000
# After its invisible time, a real broker's revive scan brings a message back within
# about 10 s; a stub's at once.
REVIVE_S = {"stub": 2.0, "real": 10.0}


@dataclass
class FleetProxy:
    name: str
    fleet: str  # its fleet address, as the peers list it
    config: Path
    proc: asyncio.subprocess.Process | None = None
    ready: dict[str, str] = field(default_factory=dict)


async def start(proxy: FleetProxy, namesrv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.cli", "--config", str(proxy.config), "--namesrv", namesrv,
        "--grpc-port", "0", "--http-port", "0", "--mode", "notify", "--proxy-id", proxy.name,
        "--workers", "1", "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    proxy.proc, proxy.ready = proc, await ready_line(proc, 30)


async def stop(proxy: FleetProxy) -> None:
    if proxy.proc is not None and proxy.proc.returncode is None:
        proxy.proc.send_signal(signal.SIGCONT)
        proxy.proc.kill()
        await proxy.proc.wait()


async def status(proxy: FleetProxy) -> dict:
    url = f"http://{proxy.ready['http']}/v1/status"
    async with aiohttp.ClientSession() as http, http.get(url) as answer:
        return json.loads(await answer.text())


@dataclass
class Fleet:
    proxies: list[FleetProxy]
    namesrv: str
    group: str
    topic: str
    stubs: StubCluster | None  # None on real brokers

    @property
    def backend(self) -> str:
        return "real" if self.stubs is None else "stub"

    def parked(self) -> list[int] | None:
        """NOTIFICATIONs parked on each stub broker (None on real brokers: not told)."""
        if self.stubs is None:
            return None
        return [broker.notifications.size for broker in self.stubs.brokers]

    async def one_probe_per_broker(self) -> None:
        if self.stubs is not None:
            await wait_until(lambda: self.parked() == [1, 1], timeout=5)
        else:  # the WATCH has reached the owner, whose probes are out
            await asyncio.sleep(1.0)

    def roles(self) -> tuple[FleetProxy, FleetProxy]:
        """The owner of the key, and another proxy."""
        owner = owner_of([p.fleet for p in self.proxies], self.group, self.topic)
        return (
            next(p for p in self.proxies if p.fleet == owner),
            next(p for p in self.proxies if p.fleet != owner),
        )


@contextlib.asynccontextmanager
async def fleet_of_three(tmp_path: Path, namesrv: str, names: tuple[str, str], stubs=None):
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    proxies = []
    for i, address in enumerate(addresses):
        config = tmp_path / f"proxy-{i}.toml"
        config.write_text(
            "[fleet]\n"
            f"peers = {json.dumps(addresses)}\n"
            f'host = "127.0.0.1"\nport = {address.rsplit(":", 1)[1]}\n'
            f"[receive]\nrenew_slice_ms = {RENEW_SLICE_MS}\n"
        )
        proxies.append(FleetProxy(f"fleet-{i}", address, config))
    try:
        await asyncio.gather(*(start(p, namesrv) for p in proxies))
        for proxy in proxies:
            await wait_until_linked(proxy, len(proxies) - 1)
        yield Fleet(proxies, namesrv, *names, stubs)
    finally:
        for proxy in proxies:
            await stop(proxy)


@pytest.fixture(params=["stub", pytest.param("real", marks=pytest.mark.real)])
async def fleet(request, tmp_path):
    names = (f"fleet-g-{uuid.uuid4().hex[:8]}", f"fleet-t-{uuid.uuid4().hex[:8]}")
    if request.param == "stub":
        async with (
            StubCluster(2, template=BrokerConfig(topics=[names[1]])) as stubs,
            fleet_of_three(tmp_path, stubs.namesrv_address, names, stubs) as running,
        ):
            yield running
        return
    cluster = request.getfixturevalue("real_cluster")
    await asyncio.to_thread(cluster.create_topic, names[1])
    async with fleet_of_three(tmp_path, cluster.namesrv_address, names) as running:
        yield running


async def wait_until_linked(proxy: FleetProxy, peers: int) -> None:
    for _ in range(100):
        if len((await status(proxy))["fleet"]["up"]) == peers:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{proxy.name}: links not up: {(await status(proxy))['fleet']}")


async def send(fleet: Fleet, via: FleetProxy, count: int) -> list[str]:
    """Send ``count`` messages through ``via``; their ids."""
    sender = LeanClient(via.ready["grpc"], "sender")
    try:
        return [
            (await sender.send(fleet.topic, f"m{i}".encode())).entries[0].message_id
            for i in range(count)
        ]
    finally:
        await sender.close()


async def answered(polls: list[asyncio.Future]) -> list[str]:
    answers = await asyncio.wait_for(asyncio.gather(*polls), 15)
    return sorted(m.system_properties.message_id for a in answers for m in a.messages)


def poll(fleet: Fleet, client: LeanClient) -> asyncio.Future:
    return asyncio.ensure_future(
        client.receive(fleet.group, fleet.topic, await_ms=POLL_MS, batch=1)
    )


async def test_polls_on_three_proxies_park_one_notification_per_broker(fleet):
    clients = [LeanClient(p.ready["grpc"], f"client-{p.name}") for p in fleet.proxies]
    try:
        polls = [poll(fleet, c) for c in clients for _ in range(2)]
        await fleet.one_probe_per_broker()
        await asyncio.sleep(0.5)
        assert fleet.parked() in ([1, 1], None)  # three proxies, one probe per broker
        sent = await send(fleet, fleet.proxies[0], 6)
        assert await answered(polls) == sorted(sent)  # each message once, none lost
        shared = [(await status(p))["fleet"] for p in fleet.proxies]
        assert sum(s["sent"].get("wake", 0) for s in shared) > 0, shared
        assert all(s["fallbacks"] == 0 for s in shared), shared
    finally:
        for client in clients:
            await client.close()


@pytest.mark.parametrize("fault", ["kill", "freeze"])
async def test_a_poll_outlives_its_keys_owner(fleet, fault):
    owner, other = fleet.roles()
    third = next(p for p in fleet.proxies if p not in (owner, other))
    client = LeanClient(other.ready["grpc"], "waiting")
    try:
        waiting = poll(fleet, client)
        await fleet.one_probe_per_broker()
        assert owner.proc is not None
        os.kill(owner.proc.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        sent = await send(fleet, third, 1)
        answer = await asyncio.wait_for(waiting, POLL_MS / 1000)
        took = loop.time() - started
        assert [m.system_properties.message_id for m in answer.messages] == sent
        assert took < NOTICED_S, took  # not held to the poll's 20 s deadline
        assert (await status(other))["fleet"]["fallbacks"] >= 1
    finally:
        await client.close()


async def test_a_restarted_owner_takes_its_keys_back(fleet):
    owner, other = fleet.roles()
    await stop(owner)
    await start(owner, fleet.namesrv)
    for proxy in fleet.proxies:
        await wait_until_linked(proxy, len(fleet.proxies) - 1)
    clients = [LeanClient(p.ready["grpc"], f"client-{p.name}") for p in fleet.proxies]
    try:
        polls = [poll(fleet, c) for c in clients]
        await fleet.one_probe_per_broker()
        await asyncio.sleep(0.5)
        assert fleet.parked() in ([1, 1], None)
        sent = await send(fleet, other, 3)
        assert await answered(polls) == sorted(sent)
        assert (await status(owner))["fleet"]["sent"].get("watching", 0) >= 1
    finally:
        for client in clients:
            await client.close()


async def delivered_and_renewed(fleet: Fleet, delivering: FleetProxy, consumer: LeanClient):
    """A message sent, delivered to a push consumer through ``delivering``, and renewed
    there once: the client's handle no longer settles it on the broker. The message, and
    the loop time of the renewal."""
    before = (await status(delivering))["renewals"]["renewed"]
    sent = await send(fleet, delivering, 1)
    got = await consumer.receive(
        fleet.group, fleet.topic, await_ms=POLL_MS, batch=1, auto_renew=True
    )
    assert [m.system_properties.message_id for m in got.messages] == sent
    handle = got.messages[0].system_properties.receipt_handle
    assert handle.endswith(f" {delivering.fleet}"), handle  # names its renewer
    for _ in range(150):
        renewals = (await status(delivering))["renewals"]
        if renewals["renewed"] > before:
            return got.messages[0], asyncio.get_running_loop().time()
        await asyncio.sleep(0.1)
    raise AssertionError(f"not renewed: {renewals}")


async def not_back(fleet: Fleet, client: LeanClient, renewed_at: float) -> None:
    """Settled with the current checkpoint: not back after its slice and a revive scan."""
    wait_ms = int((renewed_at + RENEW_SLICE_MS / 1000 + REVIVE_S[fleet.backend]
                   - asyncio.get_running_loop().time()) * 1000)  # fmt: skip
    again = await client.receive(fleet.group, fleet.topic, await_ms=wait_ms, batch=1)
    assert again.messages == [], [m.system_properties.message_id for m in again.messages]


@pytest.mark.slow
async def test_a_push_consumers_ack_through_another_proxy_settles_the_renewed_message(fleet):
    """A push consumer's connection moves (its age GOAWAY, a drain) between a message's
    delivery and its ack. The proxy the ack reaches borrows the current checkpoint from the
    one that renews the message (``proxy/fleet/settle.py``): the message is settled, not
    renewed on until its client is thought gone and then consumed again."""
    delivering, acking = fleet.proxies[0], fleet.proxies[1]
    before = await status(delivering)
    consumer = LeanClient(delivering.ready["grpc"], "push-consumer")
    moved = LeanClient(acking.ready["grpc"], "push-consumer")
    try:
        message, renewed_at = await delivered_and_renewed(fleet, delivering, consumer)
        answer = await moved.ack(fleet.group, fleet.topic, [message])
        assert answer.status.code == Code.OK, answer
        for _ in range(50):  # the renewal ends as the RETURN arrives, just after the answer
            after = await status(delivering)
            if after["renewals"]["held"] == 0:
                break
            await asyncio.sleep(0.1)
        assert after["renewals"]["held"] == 0, after["renewals"]
        assert after["fleet"]["settles"]["lent"] == before["fleet"]["settles"]["lent"] + 1
        await not_back(fleet, moved, renewed_at)
    finally:
        await consumer.close()
        await moved.close()


@pytest.mark.slow
async def test_a_draining_proxy_hands_its_renewals_to_its_heir(fleet):
    """The proxy renewing a push consumer's message drains (SIGTERM) while the client
    consumes it: it hands the renewal to its heir, the client's ack through another proxy
    borrows the current checkpoint from the heir, and the message is not consumed again."""
    delivering = fleet.proxies[0]
    consumer = LeanClient(delivering.ready["grpc"], "push-consumer")
    moved: LeanClient | None = None
    try:
        message, _ = await delivered_and_renewed(fleet, delivering, consumer)
        await consumer.close()
        assert delivering.proc is not None
        delivering.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(delivering.proc.wait(), 30) == 0
        heirs = [p for p in fleet.proxies if p is not delivering]
        adopted = {p.name: (await status(p))["fleet"]["settles"]["adopted"] for p in heirs}
        assert sorted(adopted.values()) == [0, 1], adopted  # one heir, for all of them
        heir = next(p for p in heirs if adopted[p.name] == 1)
        acking = next(p for p in heirs if p is not heir)  # the heir is asked over the link
        moved = LeanClient(acking.ready["grpc"], "push-consumer")
        answer = await moved.ack(fleet.group, fleet.topic, [message])
        assert answer.status.code == Code.OK, answer
        for _ in range(50):
            held = (await status(heir))["renewals"]["held"]
            if held == 0:
                break
            await asyncio.sleep(0.1)
        assert held == 0
        # The heir renewed it last at some time before now: not back a slice after now.
        await not_back(fleet, moved, asyncio.get_running_loop().time())
    finally:
        await consumer.close()
        if moved is not None:
            await moved.close()
