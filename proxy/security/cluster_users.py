"""The cluster's own users (``security.auth_source = "cluster"``): each client's user and
its ACL 2.0 rules read from the brokers (AUTH_GET_USER, AUTH_GET_ACL), as the Apache proxy
reads them in cluster mode, and kept in a bounded cache.

- A user is read when a request first names it (``load``), by one broker of the cluster,
  and kept ``refresh_s``; a request after that is answered from the cache while the entry
  is read again in the background, so a change made with ``mqadmin`` (a user deleted, a
  rule updated) takes effect within ``refresh_s`` plus one request.
- An access key the cluster does not know is kept as unknown for as long, so a client that
  retries with a wrong key costs the brokers one request per ``refresh_s``.
- When no broker answers: an entry read before keeps deciding until ``expire_s`` after it
  was last read, then the user is refused until a broker answers again; a user read for the
  first time is refused at once (``UsersUnavailable``: the client may retry).
- Bounds: at most ``max_users`` entries (the least recently used leave first) and
  ``max_lookups`` reads of new access keys at a time; an access key beyond that is refused
  as ``UsersUnavailable``, so a client sending made-up keys costs the brokers at most that.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from proxy.background import shared_lookup
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.security.acl import (
    Acl,
    AclError,
    Action,
    ClusterUser,
    Decision,
    ResourceType,
    UserStatus,
    UserType,
)
from proxy.security.users import User, host_of

log = logging.getLogger(__name__)

#: Sends a request to one broker of the cluster and returns its answer; raises on no answer.
AskBroker = Callable[[RemotingCommand], Awaitable[RemotingCommand]]


class UsersUnavailable(Exception):
    """The cluster's users could not be read for this access key (no broker answered, or
    too many new access keys at once)."""


@dataclass(frozen=True, slots=True)
class ClusterPermissions:
    """What a cluster user may do: its ACL 2.0 rules, decided as the brokers decide them
    (``proxy.security.acl``); source addresses are part of each rule."""

    user: ClusterUser
    acl: Acl | None

    def may_connect_from(self, address: str | None) -> bool:
        return True  # the rules' own sourceIps decide, per resource

    def refusal(
        self, rtype: ResourceType, name: str, actions: tuple[Action, ...], source: str | None
    ) -> str | None:
        """The broker's words for a refusal of ``actions`` on ``rtype:name`` from
        ``source``, or None when allowed."""
        user = self.user
        if user.status is UserStatus.DISABLE:
            return f"User:{user.username} is disabled."
        if user.user_type is UserType.SUPER:
            return None
        ip = host_of(source)
        address = str(ip) if ip is not None else (source or "")
        decision = self.acl.decide(rtype, name, actions, address) if self.acl else None
        if decision is Decision.ALLOW:
            return None
        detail = "no matched policies." if decision is None else "the decision is deny."
        return (
            f"User:{user.username} has no permission to access {rtype.value}:{name} "
            f"from {address}, {detail}"
        )


@dataclass(slots=True)
class _Entry:
    user: User | None  # None: the cluster has no such user
    read_at: float
    refresh: asyncio.Task[None] | None = field(default=None, repr=False)


class ClusterUsers:
    """The users of the cluster, by access key: ``load`` before ``get`` (module docstring)."""

    def __init__(
        self,
        ask: AskBroker,
        registry: CollectorRegistry,
        *,
        max_users: int = 20_000,
        max_lookups: int = 64,
        refresh_s: float = 20.0,
        expire_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self.max_users = max_users
        self.max_lookups = max_lookups
        self.refresh_s = refresh_s
        self.expire_s = expire_s
        self._clock = clock
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._lookups: dict[str, asyncio.Future[None]] = {}
        self._reads = Counter(
            "rocketmq_proxy_cluster_user_reads",
            "Reads of a user and its ACL from the cluster's brokers, by outcome.",
            ["result"],
            registry=registry,
        )
        for result in ("found", "unknown", "failed", "refused"):
            self._reads.labels(result)

    def __len__(self) -> int:
        return len(self._entries)

    def needs_load(self, access_key: str) -> bool:
        """Whether ``get`` has nothing to decide ``access_key`` by: ``load`` it first."""
        entry = self._entries.get(access_key)
        return entry is None or self._clock() - entry.read_at >= self.expire_s

    async def load(self, access_key: str) -> None:
        """Read ``access_key``'s user unless the cache can answer for it; raises
        UsersUnavailable when it cannot be read (and none is cached)."""
        if not self.needs_load(access_key):
            return
        if access_key not in self._lookups and len(self._lookups) >= self.max_lookups:
            self._reads.labels("refused").inc()
            raise UsersUnavailable("too many users being read from the cluster at once")
        await shared_lookup(self._lookups, access_key, lambda: self._read(access_key))
        if self.needs_load(access_key):
            raise UsersUnavailable("the cluster's users cannot be read")

    def get(self, access_key: str) -> User | None:
        """The cached user of ``access_key`` (None: unknown to the cluster, or not loaded);
        an entry older than ``refresh_s`` is read again in the background."""
        entry = self._entries.get(access_key)
        if entry is None:
            return None
        now = self._clock()
        if now - entry.read_at >= self.expire_s:
            return None
        self._entries.move_to_end(access_key)
        if now - entry.read_at >= self.refresh_s and entry.refresh is None:
            entry.refresh = asyncio.ensure_future(self._refresh(access_key))
        return entry.user

    async def close(self) -> None:
        tasks: list[asyncio.Future[None]] = [
            e.refresh for e in self._entries.values() if e.refresh is not None
        ]
        tasks += self._lookups.values()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _refresh(self, access_key: str) -> None:
        try:
            await shared_lookup(self._lookups, access_key, lambda: self._read(access_key))
        finally:
            entry = self._entries.get(access_key)
            if entry is not None:
                entry.refresh = None

    async def _read(self, access_key: str) -> None:
        """Read the user and its rules; store them, or leave what is cached on a failure."""
        try:
            user = await self._fetch(access_key)
        except (UsersUnavailable, AclError, RemotingError, OSError, TimeoutError) as exc:
            self._reads.labels("failed").inc()
            log.warning("cluster users: %r could not be read: %s", access_key, exc)
            return
        self._reads.labels("found" if user is not None else "unknown").inc()
        previous = self._entries.pop(access_key, None)
        self._entries[access_key] = _Entry(
            user, self._clock(), previous.refresh if previous else None
        )
        while len(self._entries) > self.max_users:
            _, evicted = self._entries.popitem(last=False)
            if evicted.refresh is not None:
                evicted.refresh.cancel()

    async def _fetch(self, access_key: str) -> User | None:
        answer = await self._ask(
            RemotingCommand(RequestCode.AUTH_GET_USER, {"username": access_key})
        )
        if answer.code != ResponseCode.SUCCESS:
            raise UsersUnavailable(f"AUTH_GET_USER answered {answer.code}: {answer.remark}")
        found = ClusterUser.from_json(answer.body)
        if found is None:
            return None
        acl = None
        if found.user_type is not UserType.SUPER:
            answer = await self._ask(
                RemotingCommand(RequestCode.AUTH_GET_ACL, {"subject": f"User:{access_key}"})
            )
            if answer.code == ResponseCode.NO_PERMISSION and "not exist" in (answer.remark or ""):
                return None  # deleted between the two reads
            if answer.code != ResponseCode.SUCCESS:
                raise UsersUnavailable(f"AUTH_GET_ACL answered {answer.code}: {answer.remark}")
            acl = Acl.from_json(answer.body)
        return User(access_key, found.password, ClusterPermissions(found, acl))
