"""Shared fixtures: stub clusters on free loopback ports, stopped by the test that made them."""

from __future__ import annotations

import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.app import ProxyApp
from proxy.remoting.broker_client import BrokerClient

# Under pytest-xdist (`make test` runs two workers, --dist loadgroup), the tests that share an
# expensive session or module fixture run on one worker, so that it starts once: the real
# RocketMQ cluster, the Spark session and cluster, a deploy or fuzz module's servers. Every
# other test goes to whichever worker is free; the longest start first (``_start_rank``).
_ONE_WORKER_MODULES = ("tests/deploy/", "tests/fuzz/")


def _xdist_group(item: pytest.Item) -> str | None:
    module = item.nodeid.partition("::")[0]  # relative to the repository's root
    if module.startswith("tests/smoke/"):
        return None  # each make target starts and stops what it needs
    if item.get_closest_marker("real") is not None:
        return "real-cluster"
    if module.startswith("tests/analytics/"):
        return "spark"
    if module.startswith(_ONE_WORKER_MODULES):
        return module  # the module's tests on one worker
    return None


def _start_rank(item: pytest.Item, group: str | None) -> int:
    """Where a test starts: the two long groups first, then the benchmarks' own tests and
    the smoke tier (a minute or two each), then the many short ones, so that no long run is
    left alone on one worker at the end while the other waits."""
    if group in ("real-cluster", "spark"):
        return 0
    if item.nodeid.startswith(("bench/tests/", "tests/smoke/")):
        return 1
    return 2


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ranks = {}
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        ranks[item] = _start_rank(item, group)
    items.sort(key=ranks.__getitem__)  # stable: each module's order is kept


@pytest.fixture
async def cluster():
    """A name server and one broker with fast timers, for broker-level tests."""
    async with StubCluster(1, template=BrokerConfig(register_interval=1.0)) as stub:
        yield stub


@pytest.fixture
async def broker(cluster):
    return cluster.brokers[0]


@pytest.fixture
async def client(broker):
    """A BrokerClient connected to the single broker of ``cluster``."""
    client = BrokerClient(broker.name, broker.address)
    yield client
    await client.close()


class ProxyOnStubs(ProxyApp):
    """What ``rmq-proxy --embedded-brokers N`` composes (``proxy.cli.serve``), as a test
    holds it: the proxy and the stubs it fronts (``cluster``; None when the proxy fronts a
    cluster of the test's own), stopped together."""

    def __init__(self, config, cluster: StubCluster | None) -> None:
        super().__init__(config)
        self.cluster = cluster

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self.cluster is not None:
                cluster, self.cluster = self.cluster, None
                await cluster.stop()


@pytest.fixture
async def start_proxy():
    """Start proxies on free ports; each is stopped when the test ends.

    ``await start_proxy(mode="notify", brokers=3)`` runs it in front of broker stubs of its
    own; pass ``namesrv=...`` to front an existing cluster instead.
    """
    from proxy.config import ProxyConfig, ReceiveConfig, ReceiveMode

    running: list[ProxyOnStubs] = []

    async def start(
        mode: str = "notify",
        brokers: int = 3,
        topics=("T",),
        namesrv: str | None = None,
        event_log_dir: str | None = None,
        security=None,  # a SecurityConfig; None: security off
        proxy_options: dict | None = None,  # other ProxyConfig fields
        broker_options: dict | None = None,  # other BrokerConfig fields of the stubs
        **receive,
    ):
        receive.setdefault("min_polling_ms", 200)
        cluster = None
        if namesrv is None:
            template = BrokerConfig(topics=list(topics), **(broker_options or {}))
            cluster = StubCluster(brokers, template=template)
            await cluster.start()
            namesrv = cluster.namesrv_address
        config = ProxyConfig(
            grpc_port=0,
            http_port=0,
            namesrv_addrs=[namesrv],
            event_log_dir=event_log_dir,
            receive=ReceiveConfig(mode=ReceiveMode(mode), **receive),
            proxy_id=f"test-proxy-{len(running)}",
            **(proxy_options or {}),
        )
        if security is not None:
            config.security = security
        proxy = ProxyOnStubs(config, cluster)
        running.append(proxy)
        await proxy.start()
        return proxy

    yield start
    for proxy in reversed(running):
        await proxy.stop()


@pytest.fixture
async def lean():
    """LeanClient factory: ``lean(app)`` connects to a ProxyApp; closed at the end."""
    from testkit.lean_client import LeanClient

    clients = []

    def connect(app, client_id: str | None = "test-client"):
        client = LeanClient(f"127.0.0.1:{app.grpc_port}", client_id)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        await client.close()


@pytest.fixture(scope="session")
def real_cluster():
    """Real Apache RocketMQ 5: a name server and two brokers (``broker-a``, ``broker-b``),
    started once for the whole session on free loopback ports and stopped by process id at
    the end. Missing jars or a JVM that does not start fail the test loudly, never skip it:
    run ``make rocketmq`` first (``make test`` does)."""
    from rocketmq_local.launcher import LauncherError, RealCluster

    try:
        cluster = RealCluster.start(2)
    except LauncherError as exc:
        pytest.fail(f"real RocketMQ cluster did not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def apache_proxy(real_cluster):
    """The Apache RocketMQ proxy 5.5.0 (cluster mode) in front of the session's real cluster:
    the peer whose answers ours must match. Started once, on first use, with polls of 5 s at
    least (``RealCluster.start_apache_proxy``); stopped by process id at the end."""
    from rocketmq_local.launcher import LauncherError

    try:
        proxy = real_cluster.start_apache_proxy()
    except LauncherError as exc:
        pytest.fail(f"the Apache proxy did not start: {exc}", pytrace=False)
    try:
        yield proxy
    finally:
        proxy.process.stop()
        real_cluster.proxy = None


@pytest.fixture(params=["stub", pytest.param("real", marks=pytest.mark.real)])
def backend(request, start_proxy):
    """The brokers behind a proxy test: ``stub`` (embedded broker stubs) or ``real`` (the
    session's real RocketMQ cluster, fresh topic and group per test). A plain fixture, so
    that starting the real cluster does not block an event loop. See
    ``tests/integration/_backend.py``."""
    from tests.integration._backend import RealBackend, StubBackend

    if request.param == "real":
        return RealBackend(start_proxy, request.getfixturevalue("real_cluster"))
    return StubBackend(start_proxy)
