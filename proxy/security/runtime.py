"""The proxy's security as one thing to start and stop: TLS credentials, the guard and its
user file, the broker signer, and the task that reloads files.

Files are re-read off the event loop (``asyncio.to_thread``) when a cheap ``stat`` on a
timer (``reload_interval_s``) sees them change, or at once on SIGHUP. A file that cannot be
used on reload leaves the previous version in force (logged, counted, in ``/v1/status``);
at start it is fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
import threading
import time

from prometheus_client import CollectorRegistry, Counter

from proxy.background import start_background, stop_background
from proxy.remoting.client import RemotingError
from proxy.remoting.codes import RequestCode, ResponseCode
from proxy.remoting.command import RemotingCommand
from proxy.security.cluster_users import AskBroker, ClusterUsers
from proxy.security.config import AuthSource, SecurityConfig, TlsMode
from proxy.security.guard import Guard
from proxy.security.self_signed import SelfSigned, make_self_signed
from proxy.security.signing import RemotingSigner
from proxy.security.tls import ServerTls
from proxy.security.users import UserFileError, UserStore

log = logging.getLogger(__name__)

# How long the start waits for a broker to say whether its ACL is on.
OPEN_CHECK_TIMEOUT_S = 3.0


def _stamp(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _self_signed_tls(hosts: list[str], client_ca_file: str | None) -> tuple[SelfSigned, ServerTls]:
    made = make_self_signed(hosts)
    return made, ServerTls(made.cert_file, made.key_file, client_ca_file)


class SecurityRuntime:
    def __init__(
        self, config: SecurityConfig, registry: CollectorRegistry, hosts: list[str] | None = None
    ) -> None:
        """``hosts``: the names the proxy is reached at, for a self-signed certificate."""
        self.config = config
        self._registry = registry
        self.hosts = hosts or []
        self.tls: ServerTls | None = None
        self.self_signed: SelfSigned | None = None
        self.guard: Guard | None = None
        self.signer: RemotingSigner | None = None
        if config.broker_access_key and config.broker_secret_key:
            self.signer = RemotingSigner(config.broker_access_key, config.broker_secret_key)
        self._users_stamp = (0, 0, 0)
        self._users_loaded_at = 0.0
        self._users_error: str | None = None
        self._reloads = Counter(
            "rocketmq_proxy_security_reloads",
            "Certificate and user file reloads, by outcome.",
            ["what", "result"],
            registry=registry,
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sighup = False
        # No client authentication, in front of brokers whose ACL is on (``_warn_if_open``).
        self.open_in_front_of_acl = False

    async def start(self, ask_broker: AskBroker | None = None) -> None:
        """Read the certificate and the user file (off the loop); a bad one is fatal. With
        TLS served and no certificate configured, make one (``proxy.security.self_signed``).
        ``ask_broker`` reads the cluster's users (auth_source "cluster")."""
        config = self.config
        if config.tls_mode is not TlsMode.DISABLED:
            if config.tls_cert_file and config.tls_key_file:
                self.tls = await asyncio.to_thread(
                    ServerTls, config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file
                )
            elif config.tls_self_signed:
                self.self_signed, self.tls = await asyncio.to_thread(
                    _self_signed_tls, self.hosts, config.tls_client_ca_file
                )
        if config.users_file:
            self._users_stamp = _stamp(config.users_file)
            users = await asyncio.to_thread(UserStore.load, config.users_file)
            self._users_loaded_at = time.time()
            self.guard = Guard(
                users,
                self._registry,
                authorization=config.authorization,
                clock_skew_s=config.clock_skew_s,
            )
        if config.auth_source is AuthSource.CLUSTER:
            if ask_broker is None:
                raise ValueError("security.auth_source = cluster needs the brokers")
            cluster = ClusterUsers(
                ask_broker,
                self._registry,
                max_users=config.cluster_users_max,
                refresh_s=config.cluster_users_refresh_s,
                expire_s=config.cluster_users_expire_s,
            )
            self.guard = Guard(
                cluster,
                self._registry,
                authorization=config.authorization,
                clock_skew_s=config.clock_skew_s,
            )
        if self.guard is None and self.signer is not None and ask_broker is not None:
            await self._warn_if_open(ask_broker)
        if (self.tls is not None and self.self_signed is None) or self.guard is not None:
            self._task = start_background(self._watch(), name="security-reload", log=log)
            self._listen_sighup()

    async def _warn_if_open(self, ask_broker: AskBroker) -> None:
        """With no client authentication but broker credentials, every client acts with the
        proxy's broker user: in front of brokers whose ACL 2.0 is on (their user store
        knows that user), that admits clients the cluster would refuse. Say so loudly; a
        broker that cannot be asked now says nothing."""
        key = self.config.broker_access_key or ""
        try:
            answer = await asyncio.wait_for(
                ask_broker(RemotingCommand(RequestCode.AUTH_GET_USER, {"username": key})),
                OPEN_CHECK_TIMEOUT_S,
            )
        except (RemotingError, OSError, TimeoutError) as exc:
            log.debug("could not ask the brokers whether their ACL is on: %s", exc)
            return
        if answer.code == ResponseCode.SUCCESS and answer.body:
            self.open_in_front_of_acl = True
            log.warning(
                "the brokers keep ACL 2.0 users (%r is one), but this proxy authenticates no "
                "client: every client acts as %r, whatever the cluster's ACL says. Set "
                'security.auth_source = "cluster" to honour it (docs/security.md)',
                key,
                key,
            )

    def ops_ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.ops_context() if self.tls is not None and self.config.tls_ops else None

    def reload_now(self) -> None:
        """Check every file at once (SIGHUP does this)."""
        self._wake.set()

    def _listen_sighup(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_now)
            self._sighup = True

    async def _watch(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.reload_interval_s)
            forced = self._wake.is_set()
            self._wake.clear()
            await self.reload(forced)

    async def reload(self, forced: bool = False) -> None:
        """Reload what changed (everything when ``forced``)."""
        if self.tls is not None and (forced or self.tls.changed()):
            ok = await asyncio.to_thread(self.tls.reload)
            self._reloads.labels("tls", "ok" if ok else "error").inc()
            if ok:
                log.info("TLS certificate reloaded (sha256 %s)", self.tls.status()["cert_sha256"])
            else:
                log.error("TLS reload failed, the previous certificate stays: %s",
                          self.tls.last_error)  # fmt: skip
        path = self.config.users_file
        if self.guard is not None and path and isinstance(self.guard.users, UserStore):
            stamp = _stamp(path)
            if forced or stamp != self._users_stamp:
                self._users_stamp = stamp
                try:
                    users = await asyncio.to_thread(UserStore.load, path)
                except UserFileError as exc:
                    self._users_error = str(exc)
                    self._reloads.labels("users", "error").inc()
                    log.error("user file reload failed, the previous users stay: %s", exc)
                    return
                self.guard.users = users
                self._users_loaded_at = time.time()
                self._users_error = None
                self._reloads.labels("users", "ok").inc()
                log.info("user file reloaded: %d users", len(users))

    async def close(self) -> None:
        if self._sighup:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        task, self._task = self._task, None
        await stop_background(task)
        if self.guard is not None and isinstance(self.guard.users, ClusterUsers):
            await self.guard.users.close()
        if self.self_signed is not None:
            await asyncio.to_thread(self.self_signed.remove)
            self.self_signed = None

    def status(self) -> dict[str, object]:
        """What /v1/status shows: which protections are on, never a secret."""
        tls = None
        if self.tls is not None:
            tls = self.tls.status() | {"self_signed": self.self_signed is not None}
        return {
            "tls_mode": self.config.tls_mode.value,
            "tls": tls,
            "ops_tls": bool(self.config.tls_ops and self.tls is not None),
            "authentication": self.guard is not None,
            "auth_source": self.config.auth_source.value,
            "open_in_front_of_acl": self.open_in_front_of_acl,
            "authorization": bool(self.guard is not None and self.guard.authorization),
            "users": None
            if self.guard is None
            else {
                "count": len(self.guard.users),
                "loaded_at": round(self._users_loaded_at, 3),
                "last_error": self._users_error,
            },
            "broker_signing": self.signer is not None,
        }
