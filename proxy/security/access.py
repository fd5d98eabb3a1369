"""One thing a client request does, as the guard asks a user's permissions about it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.security.users import User


@dataclass(frozen=True, slots=True)
class Access:
    """One thing an RPC does: publish to a topic, subscribe a (group, topic), or see a
    topic's route."""

    # "publish" | "subscribe" | "see" | "retry" (a group's own retry topic) | "group" (a
    # look at a group's consumers: any topic the user may subscribe it to will do)
    action: str
    topic: str
    group: str = ""

    def allowed(self, user: User) -> bool:
        p = user.permissions
        if self.action == "publish":
            return p.may_publish(self.topic)
        if self.action == "subscribe":
            return p.may_subscribe(self.group, self.topic)
        if self.action in ("retry", "group"):
            return p.may_subscribe_some(self.group)
        return p.may_see(self.topic)

    def describe(self) -> str:
        if self.action == "group":
            return f"use group {self.group!r}"
        if self.action in ("subscribe", "retry"):
            return f"subscribe to {self.topic!r} as group {self.group!r}"
        if self.action == "publish":
            return f"publish to {self.topic!r}"
        return f"see topic {self.topic!r}"
