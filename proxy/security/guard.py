"""The one place an RPC is authenticated and authorized.

``Guard.check(rpc, request, metadata)`` verifies the request's ACL 2.0 signature against the
user file and the user's ``source_ips``, then (with authorization on) asks the user's
permissions about every resource the RPC touches, which ``RESOURCES`` names per RPC. A
Telemetry stream is authenticated once, at its start; each Settings it carries later is
authorized for that stream's user (``Guard.authorize``), as the Apache proxy authorizes
each command of the stream: its topics and group are what the proxy registers with the
brokers and relays transaction checks of in the client's name. Both raise ``Denied``;
``proxy.api.errors`` turns that into the status the clients expect (UNAUTHORIZED for
credentials, FORBIDDEN for permissions and source addresses). Every
denial is counted in ``rocketmq_proxy_auth_denied_total`` by RPC and reason; nothing
secret (secret keys, signatures) reaches a log, a metric or a message.
"""

from __future__ import annotations

import enum
import hmac
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, NoReturn

from prometheus_client import CollectorRegistry, Counter

from proxy.remoting.bodies import BodyReading, UnreadableBody
from proxy.remoting.codes import RequestCode, code_name
from proxy.remoting.command import RemotingCommand
from proxy.security import signing
from proxy.security.access import Access
from proxy.security.cluster_users import ClusterPermissions, ClusterUsers, UsersUnavailable
from proxy.security.remoting_access import REMOTING_RESOURCES
from proxy.security.users import User, UserStore, host_of

log = logging.getLogger(__name__)

# Denial reasons, the values of the metric's ``reason`` label.
MISSING = "missing"  # no credentials at all
MALFORMED = "malformed"  # an authorization or date-time that does not parse
STALE = "stale"  # signed outside the clock-skew window
UNKNOWN_USER = "unknown_user"
BAD_SIGNATURE = "bad_signature"
FORBIDDEN = "forbidden"  # authenticated, but not allowed that resource
UNNAMED = "unnamed_resource"  # a remoting request whose resources cannot be read
UNAVAILABLE = "users_unavailable"  # the cluster's users could not be read (auth_source)

# The Apache proxy's words for a user the cluster's users could not be read for.
AUTHENTICATION_FAILED = "Authentication failed. Please verify the credentials and try again."

# One HMAC for an unknown access key, so it costs what a known one does.
_DUMMY_SECRET = "rmq-proxy-no-such-user"


class DenialKind(enum.Enum):
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"


class Denied(Exception):
    def __init__(self, kind: DenialKind, reason: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason
        self.message = message


def _subscribe(request: Any) -> list[Access]:
    return [Access("subscribe", request.topic.name, request.group.name)]


def _settings(settings: Any) -> list[Access]:
    """What a Telemetry stream's Settings (a ``pb.Settings``; None: the stream's start,
    which touches nothing) would have the proxy do in the client's name, as the Apache
    proxy authorizes a Settings command: a producer publishes to each of its topics (it is
    registered for them and gets their transaction checks); a consumer subscribes its group
    to each of its topics (it is registered with them, its group's lag is published), or,
    naming none, subscribes its group to some topic."""
    if settings is None:
        return []
    kind = settings.WhichOneof("pub_sub")
    if kind == "publishing":
        return [Access("publish", t.name) for t in settings.publishing.topics]
    if kind == "subscription":
        group = settings.subscription.group.name
        entries = settings.subscription.subscriptions
        if not entries:
            return [Access("retry", f"%RETRY%{group}", group)]
        return [Access("subscribe", e.topic.name, group) for e in entries]
    return []  # neither: answered UNRECOGNIZED_CLIENT_TYPE, nothing done


# What each RPC touches. Heartbeat and NotifyClientTermination need a valid signature only:
# they reach no topic; so does a Telemetry stream's start, and each Settings it carries is
# authorized with ``Guard.authorize``. An RPC missing here is refused (fail closed).
RESOURCES: dict[str, Callable[[Any], list[Access]]] = {
    "QueryRoute": lambda r: [Access("see", r.topic.name)],
    "QueryAssignment": _subscribe,
    "Heartbeat": lambda r: [],
    "NotifyClientTermination": lambda r: [],
    "Telemetry": _settings,
    "SendMessage": lambda r: [Access("publish", m.topic.name) for m in r.messages],
    # Ending or recalling a message is its producer's: the Apache proxy asks PUB on its topic.
    "EndTransaction": lambda r: [Access("publish", r.topic.name)],
    "RecallMessage": lambda r: [Access("publish", r.topic.name)],
    "ReceiveMessage": lambda r: [Access("subscribe", r.message_queue.topic.name, r.group.name)],
    "AckMessage": _subscribe,
    "ChangeInvisibleDuration": _subscribe,
    "ForwardMessageToDeadLetterQueue": _subscribe,
    "SyncLiteSubscription": _subscribe,
}


class Guard:
    def __init__(
        self,
        users: UserStore | ClusterUsers,
        registry: CollectorRegistry,
        *,
        authorization: bool = True,
        clock_skew_s: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.users = users
        self.authorization = authorization
        self.clock_skew_s = clock_skew_s
        self._clock = clock
        self._denied = Counter(
            "rocketmq_proxy_auth_denied",
            "Client requests refused by authentication or authorization.",
            ["rpc", "reason"],
            registry=registry,
        )

    def needs_load(self, access_key: str | None) -> bool:
        """Whether ``access_key``'s user must be read from the cluster (``load``) before
        ``check`` can decide (auth_source "cluster"; never with a user file)."""
        users = self.users
        return (
            bool(access_key)
            and isinstance(users, ClusterUsers)
            and users.needs_load(access_key or "")
        )

    async def load_signed(self, rpc: str, metadata: Iterable[tuple[str, Any]] | None) -> None:
        """``load`` the user a gRPC request's ``authorization`` names, if it must be read."""
        if not isinstance(self.users, ClusterUsers):
            return
        authorization = next(
            (v for k, v in metadata or () if k == signing.AUTHORIZATION and isinstance(v, str)),
            None,
        )
        await self.load(rpc, signing.access_key_of(authorization))

    async def load(self, rpc: str, access_key: str | None) -> None:
        """Read ``access_key``'s user from the cluster if ``check`` needs it; raises Denied
        (counted) when the cluster's users cannot be read: the Apache proxy's refusal,
        which a client may retry."""
        users = self.users
        if not isinstance(users, ClusterUsers) or not access_key:
            return
        try:
            await users.load(access_key)
        except UsersUnavailable as exc:
            log.warning("%s refused: %s", rpc, exc)
            self._denied.labels(_snake(rpc), UNAVAILABLE).inc()
            raise Denied(DenialKind.UNAUTHENTICATED, UNAVAILABLE, AUTHENTICATION_FAILED) from None

    def check(
        self,
        rpc: str,
        request: Any,
        metadata: Iterable[tuple[str, Any]] | None,
        source: str | None = None,
    ) -> User:
        """The user the request is from, if it may do what it asks from where it is
        (``source``: the client's ``host:port``); raises Denied."""
        try:
            return self._check(rpc, request, metadata, source)
        except Denied as denied:
            self._denied.labels(_snake(rpc), denied.reason).inc()
            raise

    def authorize(self, rpc: str, user: User, request: Any, source: str | None = None) -> None:
        """Whether ``user``, authenticated at the start of a stream of ``rpc``, may do what
        ``request``, a later message of that stream, asks (a Telemetry stream's Settings);
        raises Denied, counted as ``check``'s denials are. The user is looked up again: a
        user the reloaded user file dropped is refused, one it changed is asked with its
        permissions now."""
        try:
            current = self.users.get(user.access_key)
            if current is None:
                raise Denied(DenialKind.UNAUTHENTICATED, UNKNOWN_USER, "invalid credentials")
            extract = RESOURCES.get(rpc)
            self._authorize(rpc, current, extract(request) if extract else None, source)
        except Denied as denied:
            self._denied.labels(_snake(rpc), denied.reason).inc()
            raise

    def _check(
        self, rpc: str, request: Any, metadata: Iterable[tuple[str, Any]] | None, source: str | None
    ) -> User:
        headers: dict[str, str] = {}
        for key, value in metadata or ():
            if key in (signing.AUTHORIZATION, signing.DATE_TIME) and isinstance(value, str):
                headers[key] = value
        try:
            sig = signing.parse(headers.get(signing.AUTHORIZATION), headers.get(signing.DATE_TIME))
            signing.check_fresh(sig.date_time, self._clock(), self.clock_skew_s)
        except signing.SignatureError as exc:
            raise Denied(DenialKind.UNAUTHENTICATED, exc.reason, str(exc)) from None
        user = self.users.get(sig.access_key)
        good = signing.verify(sig, user.secret_key if user else _DUMMY_SECRET)
        if user is None or not good:
            self._refuse_credentials(rpc, source, sig.access_key, user)
        extract = RESOURCES.get(rpc)
        return self._authorize(rpc, user, extract(request) if extract else None, source)

    def check_remoting(
        self, cmd: RemotingCommand, body: BodyReading, source: str | None = None
    ) -> User:
        """The user a request of the remoting port is from, by its ``AccessKey`` and
        ``Signature`` fields (the 4.x clients' ACL hook: HMAC-SHA1 over the sorted field
        values and the body), if it may do what it asks; raises Denied. ``body`` is the
        request's body as the broker will read it (``bodies.reading``): the one reading
        the relay routes by too."""
        rpc = code_name(cmd.code, RequestCode)
        try:
            return self._check_remoting(rpc, cmd, body, source)
        except Denied as denied:
            self._denied.labels(rpc, denied.reason).inc()
            raise

    def _check_remoting(
        self, rpc: str, cmd: RemotingCommand, body: BodyReading, source: str | None
    ) -> User:
        fields = cmd.fields
        access_key = fields.get(signing.ACCESS_KEY_FIELD)
        signature = fields.get(signing.SIGNATURE_FIELD)
        if not access_key or not signature:
            raise Denied(DenialKind.UNAUTHENTICATED, MISSING, "no AccessKey and Signature")
        user = self.users.get(access_key)
        expected = signing.remoting_signature(
            fields, cmd.body, user.secret_key if user else _DUMMY_SECRET
        )
        if user is None or not hmac.compare_digest(expected, signature):
            self._refuse_credentials(rpc, source, access_key, user)
        extract = REMOTING_RESOURCES.get(cmd.code)
        if extract is None or not self.authorization:
            return self._authorize(rpc, user, None, source)
        try:
            if isinstance(body, UnreadableBody):
                raise body
            accesses = extract(cmd, body)
        except UnreadableBody as exc:
            self._check_source(rpc, user, source)
            raise Denied(DenialKind.FORBIDDEN, UNNAMED, str(exc)) from None
        return self._authorize(rpc, user, accesses, source)

    def _refuse_credentials(
        self, rpc: str, source: str | None, access_key: str, user: User | None
    ) -> NoReturn:
        """Raise the refusal of an unknown access key or a wrong signature. From a user
        file, one message for both: a client cannot tell which access keys exist. From the
        cluster, the Apache proxy's (and the brokers') words, which say which."""
        reason = UNKNOWN_USER if user is None else BAD_SIGNATURE
        log.debug("%s from %s refused: %s for access key %r", rpc, source, reason, access_key)
        message = "invalid credentials"
        if isinstance(self.users, ClusterUsers):
            message = (
                f"User:{access_key} is not found." if user is None else "check signature failed."
            )
        raise Denied(DenialKind.UNAUTHENTICATED, reason, message)

    def _authorize(
        self, rpc: str, user: User, accesses: list[Access] | None, source: str | None
    ) -> User:
        """``user``, if it may connect from ``source`` and do each of ``accesses`` (None:
        an RPC nobody may call). Where a user may connect from (``source_ips``) is checked
        with authorization off too: it limits who the user is, not what it may do, and
        with authentication only an operator's ``source_ips`` would otherwise be dropped
        without a word."""
        self._check_source(rpc, user, source)
        if not self.authorization:
            return user
        if accesses is None:
            raise Denied(DenialKind.FORBIDDEN, FORBIDDEN, f"{rpc} is not allowed")
        # The Apache proxy answers a cluster user's refusal as it answers bad credentials.
        cluster = isinstance(user.permissions, ClusterPermissions)
        kind = DenialKind.UNAUTHENTICATED if cluster else DenialKind.FORBIDDEN
        for access in accesses:
            why = access.refusal(user, source)
            if why is not None:
                log.debug("%s from %s refused: %s", rpc, source, why)
                raise Denied(kind, FORBIDDEN, why)
        return user

    def _check_source(self, rpc: str, user: User, source: str | None) -> None:
        if not user.permissions.may_connect_from(source):
            log.debug("%s refused: %r may not connect from %s", rpc, user.access_key, source)
            raise Denied(
                DenialKind.FORBIDDEN,
                FORBIDDEN,
                f"user {user.access_key!r} may not connect from {host_of(source) or source}",
            )


def _snake(name: str) -> str:
    """``SendMessage`` -> ``send_message``, as the RPC latency metric names RPCs."""
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
