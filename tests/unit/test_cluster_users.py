"""The cluster users' cache (proxy/security/cluster_users.py): its bounds and its clock.
The broker is a function answering as a 5.5.0 broker answers AUTH_GET_USER / AUTH_GET_ACL
(the answers are those of broker_stub/auth.py; tests/integration/test_cluster_users.py
runs the whole on stubs), so that time and failures can be set exactly."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from prometheus_client import CollectorRegistry

from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.security.cluster_users import ClusterUsers, UsersUnavailable
from testkit.waits import wait_until


class Broker:
    """Answers for the users in ``passwords`` (no rules); ``down`` fails every request;
    ``held`` makes each wait until released."""

    def __init__(self, **passwords: str) -> None:
        self.passwords = passwords
        self.down = False
        self.held: asyncio.Event | None = None
        self.asked: list[str] = []

    async def ask(self, cmd: RemotingCommand) -> RemotingCommand:
        self.asked.append(cmd.fields.get("username") or cmd.fields["subject"])
        if self.held is not None:
            await self.held.wait()
        if self.down:
            raise TimeoutError("no answer")
        answer = cmd.make_response(ResponseCode.SUCCESS)
        if cmd.code == RequestCode.AUTH_GET_USER:
            name = cmd.fields["username"]
            if name in self.passwords:
                answer.body = orjson.dumps({"username": name, "password": self.passwords[name]})
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def users(broker: Broker, clock: Clock, **options) -> ClusterUsers:
    return ClusterUsers(broker.ask, CollectorRegistry(), clock=clock, **options)


def _count(cache: ClusterUsers, result: str) -> float:
    return cache._reads.labels(result)._value.get()


async def test_a_user_is_read_once_and_an_unknown_key_is_kept_as_unknown():
    broker, clock = Broker(alice="s"), Clock()
    cache = users(broker, clock)
    await cache.load("alice")
    await cache.load("alice")
    await cache.load("ghost")
    await cache.load("ghost")
    alice = cache.get("alice")
    assert alice is not None and alice.secret_key == "s"
    assert cache.get("ghost") is None
    assert broker.asked == ["alice", "User:alice", "ghost"]


async def test_a_failed_read_keeps_the_entry_until_it_expires():
    broker, clock = Broker(alice="s"), Clock()
    cache = users(broker, clock, refresh_s=20, expire_s=300)
    await cache.load("alice")
    broker.down = True
    clock.now += 30  # due for a refresh: answered from the entry, read in the background
    assert cache.get("alice") is not None
    await wait_until(lambda: len(broker.asked) == 3)
    await wait_until(lambda: _count(cache, "failed") == 1)
    clock.now += 271  # 301 s after the last good read
    assert cache.get("alice") is None and cache.needs_load("alice")
    with pytest.raises(UsersUnavailable):
        await cache.load("alice")
    await cache.close()


async def test_at_most_max_lookups_new_keys_are_read_at_once():
    """A client sending made-up access keys costs the brokers at most ``max_lookups``
    requests at a time: the next new key is refused without a request."""
    broker, clock = Broker(), Clock()
    broker.held = asyncio.Event()
    cache = users(broker, clock, max_lookups=3)
    loads = [asyncio.ensure_future(cache.load(f"key-{i}")) for i in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(UsersUnavailable, match="too many"):
        await cache.load("key-3")
    await wait_until(lambda: len(broker.asked) == 3)
    assert "key-3" not in broker.asked
    broker.held.set()
    await asyncio.gather(*loads)
    await cache.load("key-3")  # room again
    assert len(broker.asked) == 4


async def test_the_table_keeps_at_most_max_users_the_least_recently_used_leave():
    broker, clock = Broker(a="1", b="2", c="3"), Clock()
    cache = users(broker, clock, max_users=2)
    await cache.load("a")
    await cache.load("b")
    assert cache.get("a") is not None  # a used last
    await cache.load("c")
    assert len(cache) == 2 and cache.needs_load("b") and not cache.needs_load("a")
