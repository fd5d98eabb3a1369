"""Fixtures for the interop tests: the proxy as a process, and the official clients' drivers.

A test parametrized with ``target`` (see ``targets()``) gets ``proxy``: a running
``rmq-proxy`` in one receive mode in front of one backend,

- ``stubs``: ``--embedded-brokers 3`` (the project's own broker stubs, in the proxy process);
- ``real``: ``--namesrv`` of the session's real Apache RocketMQ 5 cluster (``real_cluster``,
  a name server and two brokers; marker ``real``; never skipped: missing jars fail loudly).

One proxy per (backend, mode) is started the first time a test needs it and kept for the
session; all are stopped by pid at the end (SIGTERM, then SIGKILL after 10 s, which fails the
run). Tests share a proxy but never a topic or a group: ``new_topic(prefix)`` creates a fresh
topic on every broker of the backend before a client asks for its route.

RMQ_INTEROP_MODE=notify|coupled|slicing|adaptive picks the mode in which every scenario runs
(default adaptive; the receive scenarios run in every mode on the real brokers regardless), and
RMQ_INTEROP_PROXY=/path/to/rmq-proxy tests another build than this checkout's.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rocketmq_local import admin
from testkit.official.harness import ProxyProcess, start_proxy
from testkit.official.harness import run_client as _run_client

MODES = ("notify", "coupled", "slicing", "adaptive")
BACKENDS = ("stubs", "real")
DEFAULT_MODE = os.environ.get("RMQ_INTEROP_MODE") or "adaptive"
if DEFAULT_MODE not in MODES:
    raise pytest.UsageError(f"RMQ_INTEROP_MODE={DEFAULT_MODE!r} is not one of {MODES}")


def targets(modes: tuple[str, ...] = MODES, backends: tuple[str, ...] = BACKENDS) -> list:
    """``target`` parameters: each of ``backends`` in each of ``modes``; real ones marked
    ``real``."""
    params = []
    for backend in backends:
        marks = [pytest.mark.real] if backend == "real" else []
        for mode in modes:
            params.append(pytest.param((backend, mode), marks=marks, id=f"{backend}-{mode}"))
    return params


@dataclass
class ProxyPool:
    """The session's proxies, one per (backend, mode), started on first use."""

    root: Path  # from tmp_path_factory
    running: dict[tuple[str, str], ProxyProcess] = field(default_factory=dict)

    def get(self, backend: str, mode: str, namesrv: str | None) -> ProxyProcess:
        key = (backend, mode)
        proxy = self.running.get(key)
        if proxy is not None and proxy.proc.poll() is not None:
            raise AssertionError(
                f"the {backend}/{mode} proxy (pid {proxy.pid}) exited with code "
                f"{proxy.proc.returncode} during the session\n{proxy.logs()}"
            )
        if proxy is None:
            workdir = self.root / f"proxy-{backend}-{mode}"
            if backend == "stubs":
                proxy = start_proxy(workdir, (), mode=mode, brokers=3)
            else:
                proxy = start_proxy(workdir, (), mode=mode, namesrv=namesrv)
            self.running[key] = proxy
        return proxy

    def stop_all(self) -> list[str]:
        complaints = []
        for (backend, mode), proxy in self.running.items():
            complaint = proxy.stop()
            if complaint:
                complaints.append(f"{backend}/{mode}: {complaint}\n{proxy.logs()}")
        self.running.clear()
        return complaints


@pytest.fixture(scope="session")
def proxy_pool(tmp_path_factory):
    pool = ProxyPool(tmp_path_factory.mktemp("interop-proxies"))
    try:
        yield pool
    finally:
        complaints = pool.stop_all()
    assert not complaints, "\n".join(complaints)


@dataclass
class Target:
    """A proxy of one (backend, mode) and the name server of the brokers behind it, on
    which tests create fresh topics and groups (``rocketmq_local.admin``)."""

    backend: str
    mode: str
    proxy: ProxyProcess
    namesrv: str

    def new_topic(
        self, prefix: str, *, one_broker: bool = False, message_type: str | None = None
    ) -> str:
        """A topic on every broker (``one_broker``: on the first one only), of
        ``message_type`` (its message.type attribute: PRIORITY, LITE, ...) if given."""
        topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
        brokers = admin.masters(self.namesrv)
        if one_broker:
            brokers = dict([min(brokers.items())])
        admin.create_topic(self.namesrv, topic, message_type=message_type, brokers=brokers)
        return topic

    def new_lite_topic(self, prefix: str) -> str:
        """A LITE parent topic (RocketMQ 5.5 lite topics) on every broker."""
        return self.new_topic(prefix, message_type="LITE")

    def new_lite_group(self, prefix: str, parent: str, *, quota: int | None = None) -> str:
        """A lite group bound to the LITE topic ``parent``, ``quota`` lite topics a client."""
        group = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_group(self.namesrv, group, lite_parent=parent, lite_quota=quota)
        return group

    def new_group(self, prefix: str, *, fifo: bool = False) -> str:
        """A consumer group created on every broker (``fifo``: consumeMessageOrderly)."""
        group = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_group(self.namesrv, group, fifo=fifo)
        return group


#: The production profile (``production_proxy``): only the Python client's driver signs
#: requests, so it is the client that runs there.
PRODUCTION = pytest.param(("production", "adaptive"), marks=[pytest.mark.real], id="production")
PRODUCTION_LANGS = ("python",)


def langs_of(target: Target, langs: tuple[str, ...]) -> tuple[str, ...]:
    """The clients a scenario runs with on ``target``: those of ``langs`` that can."""
    return PRODUCTION_LANGS if target.backend == "production" else langs


@pytest.fixture
def target(request, proxy_pool) -> Target:
    """The (backend, mode) proxy of this test's parameter, and a way to make fresh topics."""
    backend, mode = request.param
    if backend == "production":
        namesrv = request.getfixturevalue("real_cluster").namesrv_address
        return Target(backend, mode, request.getfixturevalue("production_proxy"), namesrv)
    if backend == "real":
        namesrv = request.getfixturevalue("real_cluster").namesrv_address
        proxy = proxy_pool.get(backend, mode, namesrv)
    else:
        proxy = proxy_pool.get(backend, mode, None)
        namesrv = proxy.namesrv
    return Target(backend, mode, proxy, namesrv)


@pytest.fixture
def proxy(target) -> ProxyProcess:
    return target.proxy


@pytest.fixture
def new_topic(target) -> Callable[[str], str]:
    return target.new_topic


@pytest.fixture
def run_client(request, tmp_path):
    """``run_client(lang, *args, timeout=..., env=...)`` -> the driver's JSON; HOME is a fresh
    temp dir per run (runs overlap), so each client's log stays apart and is shown if it
    fails; ``env`` adds to the driver's environment (RMQ_INTEROP_TLS, ...). A test on the
    production target signs as its user."""
    runs = itertools.count(1)
    callspec = getattr(request.node, "callspec", None)
    param = callspec.params.get("target") if callspec is not None else None
    signed = production_env if param is not None and param[0] == "production" else {}

    def run(lang: str, *args, timeout: float, env: dict[str, str] | None = None) -> dict:
        home = tmp_path / f"home-{next(runs)}-{lang}-{args[0] if args else ''}"
        return _run_client(lang, *args, timeout=timeout, home=home, env={**signed, **(env or {})})

    return run


#: The users file of the production-profile proxy: one user that may publish and subscribe
#: anything, but not as a super user, so that each request is checked against its rules.
PRODUCTION_USER = ("interop-user", "interop-secret")
#: A user of one consumer group only (tests/interop/test_remoting_bodies.py).
BILLING_USER = ("billing-user", "billing-secret")
PRODUCTION_USERS = f"""
[[users]]
access_key = "{PRODUCTION_USER[0]}"
secret_key = "{PRODUCTION_USER[1]}"
publish = ["*"]
subscribe = [{{ group = "*", topic = "*" }}]

[[users]]
access_key = "{BILLING_USER[0]}"
secret_key = "{BILLING_USER[1]}"
subscribe = [{{ group = "billing", topic = "*" }}]
"""
#: What production turns on together (docs/operations.md): two workers, the clients
#: registered with the brokers (the default), the remoting port, a users file, and gRPC
#: connections that age out.
PRODUCTION_CONFIG = """
workers = 2
remoting_port = {remoting_port}
grpc_max_connection_age_s = 30.0
[security]
users_file = "{users}"
"""


@pytest.fixture(scope="session")
def production_proxy(real_cluster, tmp_path_factory):
    """Ours as production runs it (``PRODUCTION_CONFIG``) in front of the session's real
    brokers; clients sign as ``PRODUCTION_USER`` (``production_env``)."""
    from rocketmq_local.launcher import free_port_block

    root = tmp_path_factory.mktemp("production-proxy")
    users = root / "users.toml"
    users.write_text(PRODUCTION_USERS)
    config = root / "proxy.toml"
    config.write_text(PRODUCTION_CONFIG.format(remoting_port=free_port_block(), users=users))
    proxy = start_proxy(
        root, (), mode="adaptive", namesrv=real_cluster.namesrv_address,
        extra_args=("--config", str(config)),
    )  # fmt: skip
    try:
        yield proxy
    finally:
        complaint = proxy.stop()
    assert complaint is None, f"{complaint}\n{proxy.logs()}"


#: The environment the official clients' drivers sign with for the production proxy.
production_env = {
    "RMQ_INTEROP_ACCESS_KEY": PRODUCTION_USER[0],
    "RMQ_INTEROP_SECRET_KEY": PRODUCTION_USER[1],
}
