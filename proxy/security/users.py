"""The operator's user file: who may connect (access key, secret key) and what each may do.

TOML (or JSON with the same shape)::

    [[users]]
    access_key = "orders-app"
    secret_key = "..."                       # or secret_key_env = "ORDERS_APP_SECRET"
    publish = ["orders", "orders-*"]         # topics it may send to
    subscribe = [{ group = "billing", topic = "orders" }, { group = "audit-*", topic = "*" }]
    deny_publish = ["orders-internal"]       # deny wins over allow
    deny_subscribe = [{ group = "*", topic = "orders-internal" }]
    super_user = false                       # true: every topic and group
    source_ips = ["10.1.0.0/16"]             # only from these addresses (default: any)

A name pattern is a name (exact), a prefix ending in ``*`` (``orders-*``), or ``*`` alone
(anything); a ``*`` anywhere else is refused when the file is read.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.security.cluster_users import ClusterPermissions

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def host_of(address: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP of ``host:port`` (``1.2.3.4:5``, ``[::1]:5``, ``2001:db8::7:5``); None if it
    names none. An IPv4 client of an IPv6 socket is its IPv4 address."""
    if not address:
        return None
    host = address.rpartition(":")[0].strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class UserFileError(ValueError):
    """The user file cannot be used (the message never carries a secret)."""


@dataclass(frozen=True, slots=True)
class Pattern:
    text: str

    def __post_init__(self) -> None:
        if not self.text or "*" in self.text[:-1]:
            raise UserFileError(
                f"pattern {self.text!r}: use a name, a prefix ending in '*', or '*'"
            )

    @property
    def is_any(self) -> bool:
        return self.text == "*"

    def matches(self, name: str) -> bool:
        if self.text.endswith("*"):
            return name.startswith(self.text[:-1])
        return name == self.text


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[Pattern, ...] = ()
    subscribe: tuple[tuple[Pattern, Pattern], ...] = ()  # (group, topic)
    deny_publish: tuple[Pattern, ...] = ()
    deny_subscribe: tuple[tuple[Pattern, Pattern], ...] = ()
    everything: bool = False  # a super user
    # The client addresses the user may connect from (the client's own, or the one a
    # balancer's PROXY header names); empty: any.
    source_ips: tuple[IPNetwork, ...] = ()

    def may_connect_from(self, address: str | None) -> bool:
        """Whether a client at ``address`` (``host:port``, as ``TlsFront.address_of``
        writes it) may act as this user."""
        if not self.source_ips:
            return True
        ip = host_of(address)
        return ip is not None and any(ip in net for net in self.source_ips)

    def may_publish(self, topic: str) -> bool:
        if any(p.matches(topic) for p in self.deny_publish):
            return False
        return self.everything or any(p.matches(topic) for p in self.publish)

    def may_subscribe(self, group: str, topic: str) -> bool:
        if any(g.matches(group) and t.matches(topic) for g, t in self.deny_subscribe):
            return False
        return self.everything or any(
            g.matches(group) and t.matches(topic) for g, t in self.subscribe
        )

    def may_subscribe_some(self, group: str) -> bool:
        """Whether ``group`` may subscribe to some topic (its own retry topic is then its)."""
        if any(g.matches(group) and t.is_any for g, t in self.deny_subscribe):
            return False
        return self.everything or any(g.matches(group) for g, _ in self.subscribe)

    def may_see(self, topic: str) -> bool:
        """Whether the topic's route may be shown: the user may publish to it, or subscribe
        to it in some group (unless every group is denied it)."""
        if self.may_publish(topic):
            return True
        if any(g.is_any and t.matches(topic) for g, t in self.deny_subscribe):
            return False
        return self.everything or any(t.matches(topic) for _, t in self.subscribe)


@dataclass(frozen=True, slots=True)
class User:
    access_key: str
    secret_key: str = field(repr=False)
    # The user file's permissions, or the cluster's ACL 2.0 rules (auth_source "cluster").
    permissions: Permissions | ClusterPermissions = field(default_factory=Permissions)


class UserStore:
    """The users of one version of the file, by access key."""

    def __init__(self, users: Iterable[User] = ()) -> None:
        self._users: dict[str, User] = {}
        for user in users:
            if user.access_key in self._users:
                raise UserFileError(f"access key {user.access_key!r} appears twice")
            self._users[user.access_key] = user

    def __len__(self) -> int:
        return len(self._users)

    def get(self, access_key: str) -> User | None:
        return self._users.get(access_key)

    @classmethod
    def load(cls, path: str | Path, env: Mapping[str, str] | None = None) -> UserStore:
        """Read and check the file (blocking: call it off the event loop)."""
        path = Path(path)
        try:
            raw = path.read_bytes()
            data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
        except (OSError, ValueError) as exc:
            # TOML and JSON errors quote the line: never echo it, it may hold a secret.
            kind = type(exc).__name__
            raise UserFileError(f"{path}: cannot read the user file ({kind})") from None
        if not isinstance(data, dict) or not isinstance(data.get("users"), list):
            raise UserFileError(f"{path}: expected a list of [[users]]")
        env = os.environ if env is None else env
        return cls(_user(entry, i, env) for i, entry in enumerate(data["users"]))


_USER_KEYS = {
    "access_key", "secret_key", "secret_key_env", "publish", "subscribe",
    "deny_publish", "deny_subscribe", "super_user", "source_ips",
}  # fmt: skip


def _user(entry: Any, index: int, env: Mapping[str, str]) -> User:
    where = f"users[{index}]"
    if not isinstance(entry, dict):
        raise UserFileError(f"{where}: expected a table")
    unknown = set(entry) - _USER_KEYS
    if unknown:
        raise UserFileError(f"{where}: unknown keys {sorted(unknown)}")
    access_key = entry.get("access_key")
    if not isinstance(access_key, str) or not access_key:
        raise UserFileError(f"{where}: access_key is required")
    where = f"user {access_key!r}"
    secret = entry.get("secret_key")
    if "secret_key_env" in entry:
        secret = env.get(str(entry["secret_key_env"]))
        if secret is None:
            raise UserFileError(f"{where}: ${entry['secret_key_env']} is not set")
    if not isinstance(secret, str) or not secret:
        raise UserFileError(f"{where}: secret_key (or secret_key_env) is required")
    permissions = Permissions(
        publish=_patterns(entry.get("publish", []), where),
        subscribe=_pairs(entry.get("subscribe", []), where),
        deny_publish=_patterns(entry.get("deny_publish", []), where),
        deny_subscribe=_pairs(entry.get("deny_subscribe", []), where),
        everything=bool(entry.get("super_user", False)),
        source_ips=_networks(entry.get("source_ips", []), where),
    )
    return User(access_key, secret, permissions)


def _networks(values: Any, where: str) -> tuple[IPNetwork, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise UserFileError(f"{where}: source_ips is a list of addresses or networks")
    try:
        return tuple(ipaddress.ip_network(v, strict=False) for v in values)
    except ValueError as exc:
        raise UserFileError(f"{where}: source_ips: {exc}") from None


def _patterns(values: Any, where: str) -> tuple[Pattern, ...]:
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise UserFileError(f"{where}: expected a list of topic names or patterns")
    return tuple(Pattern(v) for v in values)


def _pairs(values: Any, where: str) -> tuple[tuple[Pattern, Pattern], ...]:
    if not isinstance(values, list):
        raise UserFileError(f"{where}: expected a list of {{ group, topic }}")
    pairs = []
    for v in values:
        if not isinstance(v, dict) or set(v) != {"group", "topic"}:
            raise UserFileError(f"{where}: each subscription is {{ group = ..., topic = ... }}")
        pairs.append((Pattern(str(v["group"])), Pattern(str(v["topic"]))))
    return tuple(pairs)
