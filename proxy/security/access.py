"""One thing a client request does, as the guard asks a user's permissions about it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.security.acl import Action, ResourceType
from proxy.security.cluster_users import ClusterPermissions
from proxy.security.users import Permissions, User


@dataclass(frozen=True, slots=True)
class Access:
    """One thing an RPC does: publish to a topic, subscribe a (group, topic), or see a
    topic's route."""

    # "publish" | "subscribe" | "see" | "retry" (a group's own retry topic) | "group" (a
    # look at a group's consumers: any topic the user may subscribe it to will do)
    action: str
    topic: str
    group: str = ""

    def refusal(self, user: User, source: str | None) -> str | None:
        """Why ``user`` may not do this from ``source`` (None: it may). A cluster user is
        asked as the brokers ask (``contexts``), in their words."""
        p = user.permissions
        if isinstance(p, ClusterPermissions):
            for rtype, name, actions in self.contexts():
                why = p.refusal(rtype, name, actions, source)
                if why is not None:
                    return why
            return None
        if self._allowed(p):
            return None
        return f"user {user.access_key!r} may not {self.describe()}"

    def _allowed(self, p: Permissions) -> bool:
        if self.action == "publish":
            return p.may_publish(self.topic)
        if self.action == "subscribe":
            return p.may_subscribe(self.group, self.topic)
        if self.action in ("retry", "group"):
            return p.may_subscribe_some(self.group)
        return p.may_see(self.topic)

    def contexts(self) -> list[tuple[ResourceType, str, tuple[Action, ...]]]:
        """The (resource, actions) pairs a 5.5.0 broker or the Apache proxy authorizes for
        this, each of which must be allowed: a subscription is the group's and the topic's,
        a route is seen with either Pub or Sub on its topic."""
        if self.action == "publish":
            return [(ResourceType.TOPIC, self.topic, (Action.PUB,))]
        if self.action == "subscribe":
            return [
                (ResourceType.GROUP, self.group, (Action.SUB,)),
                (ResourceType.TOPIC, self.topic, (Action.SUB,)),
            ]
        if self.action == "retry":
            return [(ResourceType.GROUP, self.group, (Action.SUB,))]
        if self.action == "group":
            return [(ResourceType.GROUP, self.group, (Action.SUB, Action.GET))]
        return [(ResourceType.TOPIC, self.topic, (Action.PUB, Action.SUB))]

    def describe(self) -> str:
        if self.action == "group":
            return f"use group {self.group!r}"
        if self.action in ("subscribe", "retry"):
            return f"subscribe to {self.topic!r} as group {self.group!r}"
        if self.action == "publish":
            return f"publish to {self.topic!r}"
        return f"see topic {self.topic!r}"
