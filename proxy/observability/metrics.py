"""The proxy's Prometheus metrics, exactly as docs/design.md's "Metrics" table names them.

Each ``ProxyMetrics`` owns its own ``CollectorRegistry`` (never the process-global one) so a
test, or a process hosting several proxies, can make as many as it likes without
"Duplicated timeseries" errors.

With ``rmq-proxy --workers N`` every worker process is started with
``PROMETHEUS_MULTIPROC_DIR`` set, so prometheus-client keeps each sample in a memory-mapped
file there, and the supervisor's ``GroupMetrics`` renders the whole process group from that
directory: counters and histograms summed over the workers (a dead worker's files stay, so
they never go backwards), each gauge by its ``multiprocess_mode`` (ignored in one process).
Those files never forget a label set while their process lives, so the gauges whose label
sets come and go (``LIVE_GAUGES``: a group's lag) are kept elsewhere: ``live_gauges``.

The recording methods run on every request, so each caches its labelled children in a dict
keyed by the label tuple: after the first call for a label set, a call is one dict lookup
plus the sample update, instead of ``labels()``'s validation and its registry-lock lookup.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from importlib import metadata
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from proxy.observability.live_gauges import GaugeSpec, GroupLiveGauges, LiveGauges

# Client waits run from ~1 ms (short-polling hit) to the 20 s maximum long poll plus the
# client's own slack, so the buckets go up to 30 s.
RECEIVE_WAIT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0,
)  # fmt: skip
# RPCs include sub-millisecond remoting calls on loopback as well as broker long polls.
RPC_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip

# A collection of the young generations takes well under a millisecond; a full one walks
# every tracked object, which with tens of thousands of parked polls takes hundreds.
GC_PAUSE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip

# The official clients' own histograms (proxy/observability/client_metrics.py), in
# milliseconds under the clients' names, with the buckets both the Python 5.1.2 and the
# Java 5.2.0 clients use: what they export fills them exactly.
CLIENT_HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "rocketmq_send_cost_time": (
        "Clients' send time (ms): from a send call to its answer, by the client.",
        (1.0, 5.0, 10.0, 20.0, 50.0, 200.0, 500.0),
    ),
    "rocketmq_delivery_latency": (
        "Clients' delivery latency (ms): from the proxy's answer to a receive (its "
        "delivery_timestamp) to the client holding the messages.",
        (1.0, 5.0, 10.0, 20.0, 50.0, 200.0, 500.0),
    ),
    "rocketmq_await_time": (
        "Clients' await time (ms): from a message's arrival at a push consumer to its "
        "listener starting on it.",
        (1.0, 5.0, 20.0, 100.0, 1000.0, 5000.0, 10000.0),
    ),
    "rocketmq_process_time": (
        "Clients' process time (ms): a push consumer's listener on one message.",
        (1.0, 5.0, 10.0, 100.0, 1000.0, 10000.0, 60000.0),
    ),
}
# Never the client id: one series per client would grow without bound.
CLIENT_LABELS = ("group", "topic", "client_language", "client_version", "invocation_status")

# The gauges whose label sets come and go: not in the multiprocess files, which never forget
# a label set (proxy/observability/live_gauges.py).
CONSUMER_LAG = GaugeSpec(
    "rocketmq_proxy_consumer_lag_messages",
    "Messages of a topic not yet consumed by a group (the brokers' offsets minus the "
    "group's, as mqadmin consumerProgress's Diff Total), for groups with a consumer on this "
    "proxy.",
    ("group", "topic"),
)
CONSUMER_LAG_AGE = GaugeSpec(
    "rocketmq_proxy_consumer_lag_oldest_seconds",
    "Age of the oldest message of a topic a group has not consumed (0: none), for groups "
    "with a consumer on this proxy.",
    ("group", "topic"),
)
LIVE_GAUGES = (CONSUMER_LAG, CONSUMER_LAG_AGE)

_PACKAGE = "rmq-notify-proxy"

# Groups and topics are the clients' own names: on /metrics, the first this many (group,
# topic) pairs a proxy counts keep their names, and any later one is counted under
# OTHER_LABEL, so that no sequence of client requests grows /metrics without bound.
MAX_LABELLED_PAIRS = 5_000
OTHER_LABEL = "_other_"
# The label values of two counters whose every value is known in advance (the
# ``CheckOutcome`` and ``Refusal`` enums of proxy/processor, which tests hold equal).
TRANSACTION_CHECK_RESULTS = ("relayed", "no_producer", "unreadable")
REGISTRATION_REFUSALS = ("clients", "group", "topics", "connections")


def _flag(value: bool) -> str:
    """Booleans become the label values "true"/"false" (RocketMQ's own spelling)."""
    return "true" if value else "false"


def _package_version() -> str:
    try:
        return metadata.version(_PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


class ProxyMetrics:
    """Every metric the proxy exports, on a private registry."""

    def __init__(self, version: str | None = None, directory: str | None = None) -> None:
        """``directory``: a worker's multiprocess directory (PROMETHEUS_MULTIPROC_DIR),
        where it publishes its live gauges for the supervisor; None in a single process."""
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # prometheus_client appends "_total" to counter names itself.
        self._receive = Counter(
            "rocketmq_proxy_receive",
            "Client ReceiveMessage requests answered.",
            ["group", "topic", "mode", "is_long_polling", "is_short_polling_hit", "result"],
            registry=r,
        )
        self._receive_wait = Histogram(
            "rocketmq_proxy_receive_wait_seconds",
            "Time from a ReceiveMessage request's arrival to its answer.",
            ["mode", "result"],
            buckets=RECEIVE_WAIT_BUCKETS,
            registry=r,
        )
        self._rpc_latency = Histogram(
            "rocketmq_proxy_rpc_latency_seconds",
            "Latency of every RPC in (gRPC, remoting_port) and out (remoting).",
            ["protocol_type", "request_code", "response_code", "broker", "is_long_polling"],
            buckets=RPC_LATENCY_BUCKETS,
            registry=r,
        )
        # The name is the published metric contract; the concept is the probe.
        self._probes = Counter(
            "rocketmq_proxy_notifications",
            "NOTIFICATION probes sent to brokers, by answer.",
            ["broker", "has_msg"],
            registry=r,
        )
        self._in_flight = Gauge(
            "rocketmq_proxy_long_polls_in_flight",
            "Client long polls currently parked on the proxy.",
            ["mode"],
            registry=r,
            multiprocess_mode="livesum",
        )
        # Label sets that come and go: kept out of the multiprocess files (live_gauges).
        self._live = LiveGauges(LIVE_GAUGES, directory)
        r.register(self._live)
        self._mode_switches = Counter(
            "rocketmq_proxy_mode_switches",
            "Adaptive mode switches of a (group, topic).",
            ["group", "topic", "to"],
            registry=r,
        )
        # The name is the published metric contract (dashboards, alerts); the concept is the
        # hand-back.
        self._handed_back = Counter(
            "rocketmq_proxy_nacks",
            "Popped messages handed back undelivered (CHANGE_MESSAGE_INVISIBLETIME).",
            ["reason"],
            registry=r,
        )
        self._sent = Counter(
            "rocketmq_proxy_send_messages",
            "Messages sent by producers through the proxy.",
            ["topic", "result"],
            registry=r,
        )
        self._transaction_checks = Counter(
            "rocketmq_proxy_transaction_checks",
            "Brokers' transaction-state checks received, by what became of them: relayed "
            "(to a producer of the message's group here), no_producer (none here took it; "
            "the broker counts it against transactionCheckMax) or unreadable.",
            ["result"],
            registry=r,
        )
        # Fixed label sets start at 0, so that a dashboard or an alert sees the series
        # before the first event (``rate`` of a missing series is no data, not 0).
        for result in TRANSACTION_CHECK_RESULTS:
            self._transaction_checks.labels(result)
        self._front = Counter(
            "rocketmq_proxy_front_connections",
            "Client connections of the gRPC port's front by what became of them: relayed "
            "(tls, plaintext), refused (a kind the TLS mode does not take, a PROXY header "
            "refused, refused_limit: as many relays open as the open-files limit leaves "
            "room for) or lost (connect_failed: the relay to the gRPC server did not open).",
            ["result"],
            registry=r,
        )
        self._registrations_refused = Counter(
            "rocketmq_proxy_client_registrations_refused",
            "gRPC clients served but not registered with the brokers, past a bound of the "
            "registrations: clients (max_registered_clients), group "
            "(max_registered_per_group), topics (too many topics), connections (the open-"
            "files budget's share for the registrations' connections).",
            ["reason"],
            registry=r,
        )
        for reason in REGISTRATION_REFUSALS:
            self._registrations_refused.labels(reason)
        self._long_polls_limit = Gauge(
            "rocketmq_proxy_long_polls_limit",
            "Configured maximum of client long polls in flight.",
            registry=r,
            multiprocess_mode="livesum",  # each worker has its own limit
        )
        self._ready = Gauge(
            "rocketmq_proxy_ready",
            "1 while the proxy is ready to serve, else 0.",
            registry=r,
            multiprocess_mode="livemax",  # the group serves while any worker does
        )
        self._gc_pause = Histogram(
            "rocketmq_proxy_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector, which stop the event loop (every "
            "poll waits), by generation collected.",
            ["generation"],
            buckets=GC_PAUSE_BUCKETS,
            registry=r,
        )
        self._gc_pauses: dict[tuple[str], Histogram] = {}  # (generation,) -> child
        # Pauses timed inside the collector, waiting to be observed (``watch_gc``); bounded:
        # a flush every second leaves a few hundred at most.
        self._gc_pending: deque[tuple[int, float]] = deque(maxlen=10_000)
        self._build_info = Gauge(
            "rocketmq_proxy_build_info", "Always 1; the label carries the version.", ["version"],
            registry=r, multiprocess_mode="livemax",
        )  # fmt: skip
        self._build_info.labels(version or _package_version()).set(1)
        self._client_exports = Counter(
            "rocketmq_proxy_client_metrics_exports",
            "OTLP metric exports from clients (client_metrics.mode = proxy), by result.",
            ["result"],
            registry=r,
        )
        self._client_dropped = Counter(
            "rocketmq_proxy_client_metrics_dropped",
            "Clients' data points (or exports, for the forward) left out, by reason.",
            ["reason"],
            registry=r,
        )

        # Label-tuple -> child caches (see the module docstring). The values are
        # prometheus_client children; their update methods are thread-safe.
        self._receive_c: dict[tuple[str, str, str, bool, bool, str], Counter] = {}
        self._receive_wait_c: dict[tuple[str, str], Histogram] = {}
        self._rpc_c: dict[tuple[str, str, str | int, str, bool], Histogram] = {}
        self._probes_c: dict[tuple[str, str], Counter] = {}
        self._in_flight_c: dict[tuple[str], Gauge] = {}
        self._mode_switches_c: dict[tuple[str, str, str], Counter] = {}
        self._handed_back_c: dict[tuple[str], Counter] = {}
        self._sent_c: dict[tuple[str, str], Counter] = {}
        self._pairs = LabelCap(MAX_LABELLED_PAIRS)

    # -- receive -----------------------------------------------------------------------------

    def receive_done(
        self,
        group: str,
        topic: str,
        mode: str,
        is_long_polling: bool,
        is_short_polling_hit: bool,
        result: str,
        wait_seconds: float,
    ) -> None:
        """One client ReceiveMessage answered: count it and observe its wait."""
        group, topic = self._pairs.admit(group, topic)
        key = (group, topic, mode, is_long_polling, is_short_polling_hit, result)
        _child(
            self._receive_c,
            self._receive,
            key,
            lambda: (
                group,
                topic,
                mode,
                _flag(is_long_polling),
                _flag(is_short_polling_hit),
                result,
            ),
        ).inc()
        _child(self._receive_wait_c, self._receive_wait, (mode, result)).observe(wait_seconds)

    def long_poll_started(self, mode: str) -> None:
        _child(self._in_flight_c, self._in_flight, (mode,)).inc()

    def long_poll_finished(self, mode: str) -> None:
        _child(self._in_flight_c, self._in_flight, (mode,)).dec()

    def mode_switch(self, group: str, topic: str, to: str) -> None:
        group, topic = self._pairs.admit(group, topic)
        _child(self._mode_switches_c, self._mode_switches, (group, topic, to)).inc()

    def handed_back(self, reason: str, count: int = 1) -> None:
        _child(self._handed_back_c, self._handed_back, (reason,)).inc(count)

    # -- brokers and RPCs --------------------------------------------------------------------

    def rpc(
        self,
        protocol_type: str,
        request_code: str,
        response_code: str | int,
        seconds: float,
        broker: str = "",
        is_long_polling: bool = False,
    ) -> None:
        """One RPC finished: ``protocol_type`` grpc or remoting_port (a client's, in) or
        remoting (ours, to a broker); ``broker``: the broker it went to, for the last two."""
        key = (protocol_type, request_code, response_code, broker, is_long_polling)
        _child(
            self._rpc_c,
            self._rpc_latency,
            key,
            lambda: (
                protocol_type,
                request_code,
                str(response_code),
                broker,
                _flag(is_long_polling),
            ),
        ).observe(seconds)

    def probe_answered(self, broker: str, has_msg: str | bool) -> None:
        """One NOTIFICATION probe answered: ``has_msg`` is "true", "false" or "error"."""
        value = _flag(has_msg) if isinstance(has_msg, bool) else has_msg
        _child(self._probes_c, self._probes, (broker, value)).inc()

    # -- producers ---------------------------------------------------------------------------

    def sent(self, topic: str, result: str, count: int = 1) -> None:
        _, topic = self._pairs.admit("", topic)
        _child(self._sent_c, self._sent, (topic, result)).inc(count)

    # -- the clients' own metrics ------------------------------------------------------------

    def set_consumer_lag(self, group: str, topic: str, messages: int, oldest_s: float) -> None:
        self._live.set(CONSUMER_LAG.name, (group, topic), messages)
        self._live.set(CONSUMER_LAG_AGE.name, (group, topic), oldest_s)

    def forget_consumer_lag(self, group: str, topic: str) -> None:
        for spec in (CONSUMER_LAG, CONSUMER_LAG_AGE):
            self._live.remove(spec.name, (group, topic))

    def publish_live_gauges(self) -> None:
        """Hand the live gauges' current label sets to the supervisor (with workers; else
        nothing): once after a round of changes, not for each."""
        self._live.publish()

    def transaction_check(self, result: str) -> None:
        self._transaction_checks.labels(result).inc()

    def front_connection(self, result: str) -> None:
        self._front.labels(result).inc()

    def registration_refused(self, reason: str) -> None:
        self._registrations_refused.labels(reason).inc()

    def client_export(self, result: str) -> None:
        self._client_exports.labels(result).inc()

    def client_dropped(self, reason: str, count: int = 1) -> None:
        self._client_dropped.labels(reason).inc(count)

    # -- process state -----------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self._ready.set(1 if ready else 0)

    def watch_gc(self) -> Callable[[], None]:
        """Time every collection of the garbage collector from now on; returns the undo.
        The loop stalls for each one, so its pauses bound every poll's latency.

        The callback runs inside the collector, which starts at any allocation, also while
        this thread holds prometheus-client's value lock (a non-reentrant Lock) in the middle
        of an update: observing there would deadlock the process. So it only appends to a
        deque (lock-free); ``flush_gc_pauses``, called from the loop, observes them."""
        pending = self._gc_pending
        started = 0.0

        def timed(phase: str, info: dict[str, int]) -> None:
            nonlocal started
            if phase == "start":
                started = time.perf_counter()
            else:
                pending.append((info["generation"], time.perf_counter() - started))

        gc.callbacks.append(timed)
        return lambda: gc.callbacks.remove(timed)

    def flush_gc_pauses(self) -> None:
        """Observe the pauses timed since the last flush (outside any collection)."""
        pending = self._gc_pending
        for _ in range(len(pending)):  # those there now: observing may time new ones
            generation, seconds = pending.popleft()
            _child(self._gc_pauses, self._gc_pause, (str(generation),)).observe(seconds)

    def set_long_poll_limit(self, n: int) -> None:
        self._long_polls_limit.set(n)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type.

        ``accept`` is the scraper's Accept header: Prometheus asks for OpenMetrics and gets
        it; anything else gets the classic text format 0.0.4, which every scraper reads.
        """
        if not accept:
            return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class GroupMetrics:
    """The metrics of a process group (``--workers N``): what every worker wrote to the
    multiprocess directory, merged at each scrape. Served by the supervisor."""

    def __init__(self, directory: str, *collectors: Collector) -> None:
        self.directory = directory
        self.registry = CollectorRegistry(auto_describe=True)
        multiprocess.MultiProcessCollector(self.registry, path=directory)  # type: ignore[no-untyped-call]
        self._live = GroupLiveGauges(LIVE_GAUGES, directory)
        self.registry.register(self._live)
        for collector in collectors:  # what the workers keep elsewhere than these files
            self.registry.register(collector)

    def set_ready(self, ready: bool) -> None:
        """The workers publish ``rocketmq_proxy_ready`` themselves (live maximum)."""

    def mark_dead(self, pid: int) -> None:
        """Drop an exited worker's live gauges (its counters and histograms stay)."""
        multiprocess.mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]
        self._live.forget(pid)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        if not accept:
            return generate_latest(self.registry), CONTENT_TYPE_PLAIN_0_0_4
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


KeyT = TypeVar("KeyT", bound=tuple[object, ...])
MetricT = TypeVar("MetricT", bound=MetricWrapperBase)


class LabelCap:
    """The (group, topic) label pairs a metric family set may name: the first ``limit``
    seen keep their names; later ones become (OTHER_LABEL, OTHER_LABEL)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: set[tuple[str, str]] = set()
        self.overflowed = 0  # label sets counted as OTHER_LABEL

    def admit(self, group: str, topic: str) -> tuple[str, str]:
        pair = (group, topic)
        if pair in self._admitted:
            return pair
        if len(self._admitted) < self.limit:
            self._admitted.add(pair)
            return pair
        self.overflowed += 1
        return OTHER_LABEL, OTHER_LABEL


def _child(
    cache: dict[KeyT, MetricT],
    metric: MetricT,
    key: KeyT,
    make_labels: Callable[[], tuple[str, ...]] | None = None,
) -> MetricT:
    """The labelled child of ``metric`` for ``key``, created once: ``labels()`` takes a
    lock and hashes strings, and these calls run on every request. The key is the label
    values unless ``make_labels`` turns it into them (called only on the first use)."""
    child = cache.get(key)
    if child is None:
        child = cache[key] = metric.labels(*(make_labels() if make_labels else key))
    return child
