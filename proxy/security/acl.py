"""The cluster's own ACL 2.0 (RocketMQ 5.3 and later): a user and its access rules as the
brokers keep them (``mqadmin createUser`` / ``createAcl`` / ``updateAcl``), read from the
JSON a broker answers AUTH_GET_USER and AUTH_GET_ACL with, and the decision a 5.5.0 broker
makes from them (docs/security.md, "The cluster's users").

The decision, as the brokers take it:

1. A user that does not exist, or whose status is ``disable``, is refused; a ``Super`` user
   is allowed everything without its rules being read.
2. The entries of the user's ``Custom`` policy that match the request are collected: the
   resource (its type and a literal name, a prefix ``name*``, or ``*``), at least one of the
   request's actions (or the entry's ``All``), and the client's address (an exact IP or a
   CIDR; an entry naming none matches any). Only if none match, the ``Default`` policy's.
3. None match: refused ("no matched policies"). Otherwise the most specific entry decides:
   a named type before ``*``, a literal name before a prefix before ``*``, a longer prefix
   before a shorter one, and on a tie Deny before Allow.
"""

from __future__ import annotations

import enum
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar


class AclError(ValueError):
    """A user or ACL body that cannot be read."""


class ResourceType(enum.StrEnum):
    ANY = "Any"
    CLUSTER = "Cluster"
    NAMESPACE = "Namespace"
    TOPIC = "Topic"
    GROUP = "Group"


class NameKind(enum.IntEnum):
    """How a resource names what it covers; the value orders the more specific first."""

    LITERAL = 0
    PREFIXED = 1
    ANY = 2


class Action(enum.StrEnum):
    ALL = "All"
    ANY = "Any"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"


class Decision(enum.StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"


class PolicyType(enum.StrEnum):
    CUSTOM = "Custom"
    DEFAULT = "Default"


class UserType(enum.StrEnum):
    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(enum.StrEnum):
    ENABLE = "enable"
    DISABLE = "disable"


E = TypeVar("E", bound=enum.StrEnum)


def _by_name(kind: type[E], value: Any) -> E | None:
    """The member named ``value``, case-insensitively, as the brokers read these names."""
    if not isinstance(value, str):
        return None
    for member in kind:
        if member.value.lower() == value.lower():
            return member
    return None


@dataclass(frozen=True, slots=True)
class Resource:
    """What an entry covers: ``Topic:orders`` (literal), ``Topic:orders-*`` (prefix), ``Topic:*``
    (every topic) or ``*`` (everything)."""

    type: ResourceType
    kind: NameKind
    name: str = ""

    @classmethod
    def parse(cls, key: Any) -> Resource:
        if not isinstance(key, str) or not key:
            raise AclError(f"resource {key!r} is not a resource key")
        if key == "*":
            return cls(ResourceType.ANY, NameKind.ANY)
        type_name, sep, name = key.partition(":")
        rtype = _by_name(ResourceType, type_name)
        if rtype is None or not sep:
            raise AclError(f"resource {key!r}: no such resource type")
        if rtype is ResourceType.ANY or name == "*":
            return cls(rtype, NameKind.ANY)
        if name.endswith("*"):
            return cls(rtype, NameKind.PREFIXED, name[: name.index("*")])
        return cls(rtype, NameKind.LITERAL, name)

    def covers(self, rtype: ResourceType, name: str) -> bool:
        if self.type is ResourceType.ANY:
            return True
        if self.type is not rtype:
            return False
        if self.kind is NameKind.ANY:
            return True
        if self.kind is NameKind.PREFIXED:
            return name.startswith(self.name)
        return name == self.name

    def key(self) -> str:
        if self.type is ResourceType.ANY:
            return "*"
        name = {NameKind.ANY: "*", NameKind.PREFIXED: f"{self.name}*"}.get(self.kind, self.name)
        return f"{self.type.value}:{name}"


@dataclass(frozen=True, slots=True)
class Entry:
    resource: Resource
    actions: frozenset[Action]
    decision: Decision
    source_ips: tuple[str, ...] = ()  # exact IPs or CIDRs; empty: any address

    def matches(
        self, rtype: ResourceType, name: str, actions: Iterable[Action], ip: str | None
    ) -> bool:
        return (
            self.resource.covers(rtype, name)
            and self._matches_actions(actions)
            and self._matches_ip(ip)
        )

    def _matches_actions(self, actions: Iterable[Action]) -> bool:
        if not self.actions:
            return False
        wanted = set(actions)
        return Action.ANY in wanted or Action.ALL in self.actions or bool(wanted & self.actions)

    def _matches_ip(self, ip: str | None) -> bool:
        if not self.source_ips:
            return True
        if ip is None:
            return False
        for item in self.source_ips:
            if "/" not in item:
                if item == ip:
                    return True
                continue
            try:
                if ipaddress.ip_address(ip) in ipaddress.ip_network(item, strict=False):
                    return True
            except ValueError:
                continue
        return False

    def order(self) -> tuple[int, int, int, int]:
        """Sorts the entry that decides first (module docstring, step 3)."""
        r = self.resource
        return (
            1 if r.type is ResourceType.ANY else 0,
            int(r.kind),
            -len(r.name) if r.kind is NameKind.PREFIXED else 0,
            0 if self.decision is Decision.DENY else 1,
        )


@dataclass(frozen=True, slots=True)
class Acl:
    """A user's policies: the entries of its Custom policy, then of its Default one."""

    custom: tuple[Entry, ...] = ()
    default: tuple[Entry, ...] = ()

    def decide(
        self, rtype: ResourceType, name: str, actions: Iterable[Action], ip: str | None
    ) -> Decision | None:
        """The decision of the most specific matching entry; None when none matches."""
        wanted = tuple(actions)
        for entries in (self.custom, self.default):
            matched = [e for e in entries if e.matches(rtype, name, wanted, ip)]
            if matched:
                return min(matched, key=Entry.order).decision
        return None

    @classmethod
    def from_json(cls, body: bytes | str | None) -> Acl | None:
        """An AclInfo body (``{"subject": "User:u", "policies": [{"policyType": "Custom",
        "entries": [{"resource": "Topic:t", "actions": ["Pub"], "decision": "Allow",
        "sourceIps": [...]}]}]}``); None for no body (a user without rules)."""
        if not body:
            return None
        data = _loads(body)
        if not isinstance(data, dict):
            raise AclError("an ACL is a JSON object")
        custom: list[Entry] = []
        default: list[Entry] = []
        for policy in data.get("policies") or ():
            if not isinstance(policy, dict):
                raise AclError("a policy is a JSON object")
            ptype = _by_name(PolicyType, policy.get("policyType")) or PolicyType.CUSTOM
            target = default if ptype is PolicyType.DEFAULT else custom
            for raw in policy.get("entries") or ():
                target.append(_entry(raw))
        return cls(tuple(custom), tuple(default))


@dataclass(frozen=True, slots=True)
class ClusterUser:
    """A user of the cluster: its password (the secret its clients sign with), type and status."""

    username: str
    password: str
    user_type: UserType = UserType.NORMAL
    status: UserStatus = UserStatus.ENABLE

    @classmethod
    def from_json(cls, body: bytes | str | None) -> ClusterUser | None:
        """A UserInfo body (``{"username", "password", "userType", "userStatus"}``); None for
        no body: the broker has no such user."""
        if not body:
            return None
        data = _loads(body)
        if not isinstance(data, dict):
            raise AclError("a user is a JSON object")
        name, password = data.get("username"), data.get("password")
        if not isinstance(name, str) or not name or not isinstance(password, str):
            raise AclError("a user has a username and a password")
        return cls(
            name,
            password,
            _by_name(UserType, data.get("userType")) or UserType.NORMAL,
            _by_name(UserStatus, data.get("userStatus")) or UserStatus.ENABLE,
        )


def _entry(raw: Any) -> Entry:
    if not isinstance(raw, dict):
        raise AclError("a policy entry is a JSON object")
    decision = _by_name(Decision, raw.get("decision"))
    if decision is None:
        raise AclError(f"decision {raw.get('decision')!r} is neither Allow nor Deny")
    actions = frozenset(
        a for a in (_by_name(Action, name) for name in raw.get("actions") or ()) if a is not None
    )
    ips = raw.get("sourceIps") or ()
    if not all(isinstance(ip, str) for ip in ips):
        raise AclError("sourceIps are strings")
    return Entry(Resource.parse(raw.get("resource")), actions, decision, tuple(ips))


def _loads(body: bytes | str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise AclError(f"not JSON: {exc.__class__.__name__}") from None
