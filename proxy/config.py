"""Proxy configuration: defaults, then a TOML file, then environment, then flags.

The TOML file has top-level keys for ``ProxyConfig``, a ``[receive]`` table for
``ReceiveConfig``, a ``[security]`` table for ``SecurityConfig``, a ``[fleet]`` table for
``FleetConfig`` and a ``[limits]`` table for ``LimitsConfig``. Environment variables
``RMQ_PROXY_<KEY>``, ``RMQ_PROXY_RECEIVE_<KEY>``, ``RMQ_PROXY_SECURITY_<KEY>``,
``RMQ_PROXY_FLEET_<KEY>`` and ``RMQ_PROXY_LIMITS_<KEY>`` override it
(``RMQ_PROXY_RECEIVE_MODE=coupled``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.security.config import SecurityConfig

_TABLES = ("receive", "security", "fleet", "limits", "client_metrics")


class PollMode(enum.StrEnum):
    """How one client long poll is served (docs/design.md, "Receive modes")."""

    NOTIFY = "notify"
    COUPLED = "coupled"
    SLICING = "slicing"
    # A lite consumer's poll (RocketMQ 5.5 lite topics, ``receive/lite.py``): the brokers'
    # own per-client lite long polling on every broker, whatever ``receive.mode`` says.
    LITE = "lite"
    # A pull or pop of a client of the remoting port (``proxy/remoting_port``): held by the
    # broker it names, as the client asked.
    REMOTING = "remoting"


class ReceiveMode(enum.StrEnum):
    """``receive.mode``: one poll mode for every poll, or adaptive (notify or coupled per
    group and topic)."""

    ADAPTIVE = "adaptive"
    NOTIFY = "notify"
    COUPLED = "coupled"
    SLICING = "slicing"

    @property
    def initial_poll_mode(self) -> PollMode:
        """The poll mode before any request was counted: adaptive starts in notify."""
        return PollMode.NOTIFY if self is ReceiveMode.ADAPTIVE else PollMode(self.value)


@dataclass
class ReceiveConfig:
    mode: ReceiveMode = ReceiveMode.ADAPTIVE  # notify, coupled, slicing or adaptive
    # Long-polling time a client may ask for (RocketMQ proxy defaults).
    min_polling_ms: int = 5_000
    max_polling_ms: int = 20_000  # the longest (a longer ask is cut to it)
    # Answer this long before the client's gRPC deadline, so the answer is not too late.
    reserve_ms: int = 300
    # Adaptive switching (docs/design.md, "The adaptive rule"): receive requests per second
    # per (group, topic) over a sliding window; above `adaptive_high_rate`, and with a
    # first-pop hit ratio of at least `adaptive_hit_high` over at least
    # `adaptive_min_polls` finished polls, use coupled polling; back to notify below
    # `adaptive_low_rate`, below `adaptive_hit_low`, on POLLING_FULL, or at
    # `adaptive_max_coupled` coupled polls in flight per (group, topic).
    adaptive_high_rate: float = 50.0
    adaptive_low_rate: float = 25.0  # receives/s below which adaptive goes back to notify
    adaptive_window_s: float = 10.0  # the window the rates and hit ratios are taken over
    adaptive_hit_high: float = 0.9  # first-pop hit ratio needed to go coupled
    adaptive_hit_low: float = 0.7  # hit ratio below which coupled goes back to notify
    adaptive_min_polls: int = 20  # finished polls a hit ratio needs before it counts
    adaptive_max_coupled: int = 512  # coupled polls in flight per (group, topic) at most
    # Per-(group, topic) thresholds (JSON, or TOML by suffix; rmq-polling-report
    # --thresholds-out writes it), checked every `adaptive_thresholds_check_s`.
    adaptive_thresholds_file: str | None = None
    adaptive_thresholds_check_s: float = 5.0  # how often the thresholds file is checked
    # Slicing (MNS): short polls of `slice_ms` over the brokers in turn, at most
    # `slice_quota` of them, then one long poll for the rest of the time.
    slice_ms: int = 200
    slice_quota: int = 8  # short polls per client poll at most, before the long one
    # Limits.
    max_in_flight: int = 20_000
    max_probes_per_poll: int = 64  # NOTIFICATION probes one client poll may wait on
    # NOTIFICATION probes this proxy keeps on one broker at most (0: one per key with a
    # waiting poll, no limit). Past it, keys take turns of `probe_slice_s` (docs/scale.md:
    # set it to about 80,000 / proxies, under a broker's limit of 100,000 parked).
    max_probes_per_broker: int = 0
    probe_slice_s: float = 5.0  # a key's turn when max_probes_per_broker is reached
    # A probe whose key had a poll within this time stays parked (for `max_polling_ms`)
    # when its polls are done: a consumer polls again within moments, finds it parked and
    # skips its first pop (docs/design.md). 0: a probe lasts as long as its longest poll.
    probe_linger_ms: int = 2_000
    # Messages popped but not delivered go back with this invisible time.
    hand_back_invisible_ms: int = 1_000
    # Broker calls that do not wait for messages.
    broker_timeout_s: float = 3.0
    # The delivery attempts of a group whose config no broker can tell (a group's own
    # retryMaxTimes + 1 governs otherwise); past them a message goes to the dead-letter queue.
    max_delivery_attempts: int = 17
    # Push consumers (auto_renew) poll every broker at once; True serves each of their
    # requests on the broker its queue names only. Measured (bench/bench_push.py):
    # the same broker requests per message either way, a lower p99 when any of a
    # consumer's polls may take a message from any broker (False).
    push_named_broker_only: bool = False
    # Push consumers: the invisible time of a pop and of each renewal while the client
    # consumes (a crashed proxy's messages come back within it; the Apache proxy's
    # renewSliceTimeMillis is 60 s, then renewals of minutes); and how long a client may
    # stay silent before its messages are handed back.
    renew_slice_ms: int = 30_000
    push_client_idle_s: float = 60.0  # a push consumer silent this long is taken as gone

    def __post_init__(self) -> None:
        self.validate_mode()

    def validate_mode(self) -> None:
        try:
            self.mode = ReceiveMode(self.mode)
        except ValueError:
            names = ", ".join(m.value for m in ReceiveMode)
            raise ValueError(f"receive.mode must be one of {names}, not {self.mode!r}") from None

    def validate(self) -> None:
        self.validate_mode()
        if not 0 < self.min_polling_ms <= self.max_polling_ms:
            raise ValueError("receive polling bounds must satisfy 0 < min <= max")
        if self.adaptive_low_rate > self.adaptive_high_rate:
            raise ValueError("receive.adaptive_low_rate must not exceed adaptive_high_rate")
        if not 0 <= self.adaptive_hit_low <= self.adaptive_hit_high <= 1:
            raise ValueError("receive.adaptive_hit_low <= adaptive_hit_high, both in [0, 1]")
        if self.adaptive_min_polls < 1 or self.adaptive_max_coupled < 2:
            raise ValueError("receive.adaptive_min_polls >= 1, adaptive_max_coupled >= 2")
        if self.adaptive_thresholds_check_s <= 0:
            raise ValueError("receive.adaptive_thresholds_check_s must be positive")


@dataclass
class FleetConfig:
    """A fleet that probes each key once (docs/scale.md, "One prober per key"): the proxies
    agree on one owner per (group, topic), which probes the brokers for every proxy with a
    poll of it waiting. Off while ``peers`` is empty."""

    # The proxies to share probes with, by their fleet address ("host:port"; this one may
    # be listed too), or "dns:NAME:PORT", a name that resolves to all of them (a Kubernetes
    # headless Service). Empty: each proxy probes for its own polls.
    peers: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"  # where this proxy listens for its peers
    port: int = 8083  # this proxy's fleet port
    # The address the peers list this proxy at (its pod IP and port with DNS); default
    # host:port.
    advertise: str | None = None
    # A key's owner that has not answered in this long is not waited for: this proxy
    # probes the key itself (a dead or cut owner costs at most this much).
    fallback_ms: int = 1000
    refresh_s: float = 5.0  # "dns:" names are resolved again this often

    @property
    def enabled(self) -> bool:
        return bool(self.peers)

    def validate(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError("fleet.port must be 0-65535")
        if self.fallback_ms < 1 or self.refresh_s <= 0:
            raise ValueError("fleet.fallback_ms and fleet.refresh_s must be positive")
        for peer in self.peers:
            if not peer.rpartition(":")[2].isdigit():
                raise ValueError(f"fleet.peers: {peer!r} is not host:port or dns:NAME:PORT")


@dataclass
class LimitsConfig:
    """What one request may carry, checked before any broker is asked: the Apache proxy
    5.5's limits with its defaults (its ``ProxyConfig`` name after each), refused with its
    codes and messages (docs/api.md, "Request limits"). ``max_body_bytes`` and
    ``max_lite_topic_size`` are top-level settings."""

    # User properties one message may carry (userPropertyMaxNum).
    max_user_property_count: int = 128
    # UTF-8 bytes of a message's user property names and values, tag and keys together
    # (maxUserPropertySize).
    max_user_property_size: int = 16 * 1024
    # A message group must be shorter than this, in UTF-8 bytes (maxMessageGroupSize; the
    # Apache proxy refuses a group of exactly this size too); 0 = no limit.
    max_message_group_size: int = 64
    # The shortest invisible time a receive may ask for (minInvisibleTimeMillsForRecv;
    # ChangeInvisibleDuration may ask for 0).
    min_receive_invisible_ms: int = 10_000
    # The longest invisible time a receive or ChangeInvisibleDuration may ask for
    # (maxInvisibleTimeMills); 0 = no limit.
    max_invisible_ms: int = 12 * 3600 * 1000
    # How far ahead a timed message may be due (maxDelayTimeMills); 0 = no limit.
    max_delay_ms: int = 24 * 3600 * 1000
    # The longest orphaned-transaction recovery time a transactional message may ask for
    # (maxTransactionRecoverySecond); 0 = no limit.
    max_transaction_recovery_s: int = 3600

    def validate(self) -> None:
        if self.max_user_property_count < 0 or self.max_user_property_size < 0:
            raise ValueError("limits.max_user_property_count and _size must not be negative")
        if (
            min(
                self.max_message_group_size,
                self.min_receive_invisible_ms,
                self.max_invisible_ms,
                self.max_delay_ms,
                self.max_transaction_recovery_s,
            )
            < 0
        ):
            raise ValueError("limits must not be negative (0 = no limit)")
        if 0 < self.max_invisible_ms < self.min_receive_invisible_ms:
            raise ValueError("limits.max_invisible_ms must not be below min_receive_invisible_ms")


class EventLogFormat(enum.StrEnum):
    """The event log's file format (proxy/observability/eventlog_parts.py)."""

    PARQUET = "parquet"
    JSONL = "jsonl"

    @property
    def suffix(self) -> str:
        return f".{self.value}"


class ClientMetricsMode(enum.StrEnum):
    """``client_metrics.mode``: where the official clients export their own metrics."""

    OFF = "off"  # nowhere: the settings say Metric(on=False)
    COLLECTOR = "collector"  # straight to ``client_metrics.collector``
    PROXY = "proxy"  # to this proxy's gRPC port, into its /metrics


@dataclass
class ClientMetricsConfig:
    """The official clients' own metrics (docs/client-metrics.md): the clients export them
    over OTLP gRPC, once a minute, wherever the settings this proxy answers say."""

    # off, collector (to `collector`) or proxy (to the address the client reached this
    # proxy at: histograms on this proxy's /metrics).
    mode: ClientMetricsMode = ClientMetricsMode.OFF
    # host:port of an OTLP gRPC collector the clients reach (mode collector).
    collector: str = ""
    # Mode proxy: also pass each export on, as received, to this OTLP gRPC collector
    # (host:port, plaintext); empty = keep it here only.
    forward_to: str = ""
    # Mode proxy: label sets (histogram, group, topic, client language and version,
    # status) the proxy exports at most (all workers together); past it new ones are
    # dropped and counted. One no client names for 10 minutes is removed.
    max_label_sets: int = 1000
    # Mode proxy: clients' series (a client's histogram per attribute set) whose last
    # totals the proxy keeps, to add up what each export adds; past it new series are
    # dropped and counted.
    max_client_series: int = 20_000
    # Mode proxy: the series one client may add; past it its new ones are dropped and
    # counted.
    max_series_per_client: int = 256
    # Mode proxy: the largest export taken, in bytes; larger ones get RESOURCE_EXHAUSTED.
    max_export_bytes: int = 1024 * 1024

    def validate(self) -> None:
        try:
            self.mode = ClientMetricsMode(self.mode)
        except ValueError:
            names = ", ".join(m.value for m in ClientMetricsMode)
            raise ValueError(f"client_metrics.mode must be one of {names}") from None
        for name in ("collector", "forward_to"):
            value = getattr(self, name)
            if value and not value.rpartition(":")[2].isdigit():
                raise ValueError(f"client_metrics.{name}: {value!r} is not host:port")
        if self.mode is ClientMetricsMode.COLLECTOR and not self.collector:
            raise ValueError("client_metrics.mode = collector needs client_metrics.collector")
        limits = (self.max_label_sets, self.max_client_series, self.max_series_per_client)
        if min(*limits, self.max_export_bytes) < 1:
            raise ValueError("client_metrics.max_* must be positive")


@dataclass
class ProxyConfig:
    # The proxy's name in metrics, logs and event logs.
    proxy_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    grpc_host: str = "127.0.0.1"  # where clients connect (0.0.0.0: every interface)
    grpc_port: int = 8081  # the client (gRPC) port; 0 = a free one
    # host:port clients should use to reach this proxy (QueryRoute answers it).
    advertise_address: str | None = None
    # The remoting port: RocketMQ's own protocol, for the clients of the 4.x API and the
    # others that speak it (the Apache proxy's remotingListenPort, 8080 there). Off unless
    # set (0 = a free one): a gRPC-only deployment opens no second port it does not use.
    remoting_port: int | None = None
    # host:port the remoting clients reach this proxy at: every broker's address in the
    # routes the remoting port answers. Default grpc_host and the bound remoting port.
    remoting_advertise_address: str | None = None
    # A port of its own for each broker named here (broker name -> port; 0 = a free one):
    # routes then name the broker at the advertised host and that port, and a request that
    # names no broker goes to the broker of the port it came in on. For clients whose
    # requests never name their broker (the C++ client, librocketmq): on the shared port
    # they get "Request doesn't have field bname", as from the Apache proxy.
    remoting_broker_ports: dict[str, int] = field(default_factory=dict)
    # host:port the remoting clients reach each broker's own port at (broker name ->
    # address), where that differs from the advertised host and the bound port (a
    # balancer that forwards each port to another).
    remoting_broker_advertise_addresses: dict[str, str] = field(default_factory=dict)
    http_host: str = "127.0.0.1"  # the ops port's host: /metrics, /readyz, /v1/status
    http_port: int = 8082  # the ops port; 0 = a free one
    # The brokers' name servers (host:port each).
    namesrv_addrs: list[str] = field(default_factory=lambda: ["127.0.0.1:9876"])
    route_ttl_s: float = 30.0  # a topic's route is looked up again after this
    max_body_bytes: int = 4 * 1024 * 1024  # past it, MESSAGE_BODY_TOO_LARGE
    # The longest lite topic name (UTF-8 bytes) a client may use; told to lite consumers in
    # their settings (the Apache proxy's maxLiteTopicSize default).
    max_lite_topic_size: int = 64
    # Telemetry streams held open at once (a client holds one per proxy; each costs about
    # 30 kB): past it a new stream is answered TOO_MANY_REQUESTS, as a poll past
    # receive.max_in_flight is, so clients that open streams with ever new client ids cost
    # bounded memory. One client id holds at most proxy.api.session.STREAMS_PER_CLIENT.
    max_telemetry_streams: int = 20_000
    event_log_dir: str | None = None  # write the polling event log here
    # parquet (columnar and compressed: what the Spark job reads fastest, a tenth of the
    # bytes or less) or jsonl (one JSON object per line, for other tools). A crash loses
    # the Parquet file being written (at most event_log_max_age_s of events), JSON lines
    # only their last second (docs/analytics.md).
    event_log_format: EventLogFormat = EventLogFormat.PARQUET
    # An event-log file is completed (renamed to its visible name, so the Spark job reads
    # it) at this size or age, whichever comes first: the age bounds how far behind the
    # job's stream runs at a quiet proxy.
    event_log_max_bytes: int = 64 * 1024 * 1024
    event_log_max_age_s: float = 300.0  # the age of that pair
    # A stopping worker still running after this is killed by its supervisor; the gRPC
    # server's own grace for calls in flight is this, at most 10 s.
    shutdown_grace_s: float = 25.0
    # Every client connection gets an HTTP/2 GOAWAY at this age (gRPC adds up to 10 %): the
    # server goes on serving, calls in flight finish on the old connection, and the client's
    # next call opens a new one, through its balancer. A drain relies on it to move clients
    # before its server stops, since the stop's own GOAWAY cancels every call that crosses it
    # (docs/reliability.md, "Drain"); it also spreads a fleet's connections again after a
    # scale-up. 0 = connections never age (a drain then costs a few CANCELLED calls under load).
    # Off by default: a new connection can reach another proxy, or another worker of this
    # one, than the one renewing a push consumer's messages, which on its own cannot settle
    # a message renewed since its delivery: it is consumed twice. A fleet ([fleet] peers,
    # one worker per member) passes such a settle to the renewer over its links, so turn it
    # on (10) in a fleet, or where no push consumer consumes a message longer than a slice.
    grpc_max_connection_age_s: float = 0.0
    # Seconds between full collections of Python's garbage collector, which otherwise runs
    # one every few seconds with thousands of idle polls and stalls them all; 0 = CPython's
    # own schedule. proxy/collector.py.
    gc_full_collection_s: float = 600.0
    # Register each gRPC client with the brokers of its topics (a HEART_BEAT on its behalf
    # every 30 s), so that mqadmin consumerConnection / producerConnection and the dashboard
    # list it; at most this many clients per proxy process, 0 = none. Only what the guard
    # allows a client is registered; one past a bound is served, not registered (counted in
    # rocketmq_proxy_client_registrations_refused_total). docs/operations.md, "RocketMQ's
    # own tools".
    max_registered_clients: int = 10_000
    # Of those, at most this many per group (a consumer group, or a topic a producer
    # publishes to). A broker lists one client per group on each connection, so each client
    # of a group takes a registration connection to each broker of its own: this bounds
    # the connections one group makes. All of them together hold at most a quarter of the
    # process's open-files budget (docs/operations.md, "RocketMQ's own tools").
    max_registered_per_group: int = 1_000
    # Seconds between refreshes of rocketmq_proxy_consumer_lag_messages: the lag of each
    # (group, topic) with a consumer registered here, from each broker of the topic
    # (GET_CONSUME_STATS); 0 = off. docs/operations.md, "Consumer lag".
    lag_refresh_s: float = 30.0
    # Worker processes serving the gRPC port together (SO_REUSEPORT) under one supervisor;
    # 1 = one process, no supervisor; 0 = default_workers() (one per usable core, at most
    # MAX_DEFAULT_WORKERS). docs/operations.md, "Workers".
    workers: int = 0
    # With workers > 1: prometheus-client's multiprocess directory (PROMETHEUS_MULTIPROC_DIR)
    # where every worker writes its samples; unset = a fresh temporary directory per run.
    metrics_dir: str | None = None
    # --embedded-brokers N: a name server and N broker stubs in this process.
    embedded_brokers: int = 0
    topics: list[str] = field(default_factory=list)  # created on embedded brokers
    receive: ReceiveConfig = field(default_factory=ReceiveConfig)
    security: SecurityConfig = field(default_factory=SecurityConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    client_metrics: ClientMetricsConfig = field(default_factory=ClientMetricsConfig)

    def validate(self) -> None:
        self.receive.validate()
        self.security.validate()
        self.fleet.validate()
        self.limits.validate()
        self.client_metrics.validate()
        if self.embedded_brokers < 0:
            raise ValueError("embedded_brokers must not be negative")
        if self.workers < 0:
            raise ValueError("workers must not be negative (0 = one per core, capped)")
        if self.gc_full_collection_s < 0:
            raise ValueError("gc_full_collection_s must not be negative (0 = CPython's own)")
        if self.max_lite_topic_size < 1:
            raise ValueError("max_lite_topic_size must be positive")
        if self.grpc_max_connection_age_s < 0:
            raise ValueError("grpc_max_connection_age_s must not be negative (0 = no limit)")
        if self.max_telemetry_streams < 1:
            raise ValueError("max_telemetry_streams must be positive")
        if self.lag_refresh_s < 0:
            raise ValueError("lag_refresh_s must not be negative (0 = off)")
        if self.max_registered_clients < 0:
            raise ValueError("max_registered_clients must not be negative (0 = none)")
        if self.max_registered_per_group < 1:
            raise ValueError("max_registered_per_group must be positive")
        if self.remoting_port is not None and not 0 <= self.remoting_port <= 65535:
            raise ValueError("remoting_port must be a port number (0 = a free one)")
        if self.remoting_advertise_address is not None:
            host, _, port = self.remoting_advertise_address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError("remoting_advertise_address must be host:port")
        if self.remoting_broker_ports:
            if self.remoting_port is None:
                raise ValueError("remoting_broker_ports needs remoting_port")
            for name, number in self.remoting_broker_ports.items():
                if not name or not isinstance(number, int) or not 0 <= number <= 65535:
                    raise ValueError(
                        f"remoting_broker_ports: {name!r} needs a port number (0 = a free one)"
                    )
            fixed = [p for p in (self.remoting_port, *self.remoting_broker_ports.values()) if p]
            if len(set(fixed)) != len(fixed):
                raise ValueError("remoting_broker_ports: each broker needs a port of its own")
        for name, address in self.remoting_broker_advertise_addresses.items():
            if name not in self.remoting_broker_ports:
                raise ValueError(
                    f"remoting_broker_advertise_addresses: {name!r} has no remoting_broker_ports"
                )
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"remoting_broker_advertise_addresses: {name!r} needs host:port")
        try:
            self.event_log_format = EventLogFormat(self.event_log_format)
        except ValueError:
            names = ", ".join(f.value for f in EventLogFormat)
            raise ValueError(f"event_log_format must be one of {names}") from None
        if self.event_log_max_bytes < 1 or self.event_log_max_age_s <= 0:
            raise ValueError("event_log_max_bytes and event_log_max_age_s must be positive")
        if self.fleet.enabled and self.worker_count() != 1:
            # Each worker would be a member of its own, on the one fleet port.
            raise ValueError("fleet.peers needs workers = 1 (a pod or host per member)")

    def worker_count(self) -> int:
        """The number of worker processes to run: ``workers``, or the default for 0."""
        return self.workers or default_workers()


# Beyond a few cores, more pods (or hosts) beat more workers per pod: every worker keeps its
# own connections and parked NOTIFICATION probes on every broker and its own route cache,
# so N workers multiply broker-side state by N; and a Kubernetes pod is sized for a core or
# two. docs/operations.md, "Workers".
MAX_DEFAULT_WORKERS = 4


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, lowered by a cgroup v2 CPU quota
    (``cpu.max``, what a container's CPU limit becomes), at least 1. ``os.cpu_count()``
    alone would count every core of a Kubernetes node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def default_workers() -> int:
    """One worker per usable core, at most ``MAX_DEFAULT_WORKERS``."""
    return min(usable_cores(), MAX_DEFAULT_WORKERS)


def load(
    path: str | None = None, env: Mapping[str, str] | None = None, **overrides: Any
) -> ProxyConfig:
    """Build the configuration: defaults < TOML file < environment < ``overrides``.

    ``overrides`` use field names; ``receive_<field>`` reaches the receive table. None
    values are ignored, so unset command-line flags leave the rest alone.
    """
    config = ProxyConfig()
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        _apply(config, {k: v for k, v in data.items() if k not in _TABLES}, source=path)
        _apply(config.receive, data.get("receive", {}), source=f"{path} [receive]")
        _apply(config.security, data.get("security", {}), source=f"{path} [security]")
        _apply(config.fleet, data.get("fleet", {}), source=f"{path} [fleet]")
        _apply(config.limits, data.get("limits", {}), source=f"{path} [limits]")
        cm = config.client_metrics
        _apply(cm, data.get("client_metrics", {}), source=f"{path} [client_metrics]")
    env = os.environ if env is None else env
    _apply(config, _from_env(env, "RMQ_PROXY_", ProxyConfig), source="environment")
    _apply(config.receive, _from_env(env, "RMQ_PROXY_RECEIVE_", ReceiveConfig), "environment")
    _apply(config.security, _from_env(env, "RMQ_PROXY_SECURITY_", SecurityConfig), "environment")
    _apply(config.fleet, _from_env(env, "RMQ_PROXY_FLEET_", FleetConfig), "environment")
    _apply(config.limits, _from_env(env, "RMQ_PROXY_LIMITS_", LimitsConfig), "environment")
    cm_env = _from_env(env, "RMQ_PROXY_CLIENT_METRICS_", ClientMetricsConfig)
    _apply(config.client_metrics, cm_env, "environment")
    top = {k: v for k, v in overrides.items() if v is not None and not k.startswith("receive_")}
    receive = {
        k.removeprefix("receive_"): v
        for k, v in overrides.items()
        if v is not None and k.startswith("receive_")
    }
    _apply(config, top, source="flags")
    _apply(config.receive, receive, source="flags")
    config.validate()
    return config


def parse_pairs(items: list[str]) -> dict[str, str]:
    """``["broker-a=10931", ...]`` -> ``{"broker-a": "10931"}``."""
    pairs: dict[str, str] = {}
    for item in (i.strip() for i in items):
        if not item:
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{item!r} must be NAME=VALUE")
        pairs[name.strip()] = value.strip()
    return pairs


def parse_port_map(items: list[str]) -> dict[str, int]:
    """``["broker-a=10931", ...]`` -> ``{"broker-a": 10931}``."""
    ports = parse_pairs(items)
    for name, port in ports.items():
        if not port.isdigit():
            raise ValueError(f"{name}={port} must be NAME=PORT")
    return {name: int(port) for name, port in ports.items()}


def _apply(target: Any, values: dict[str, Any], source: str) -> None:
    names = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        if key not in names or key in _TABLES:
            raise ValueError(f"{source}: unknown setting {key!r}")
        setattr(target, key, value)


def _from_env(env: Mapping[str, str], prefix: str, cls: type) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = env.get(prefix + f.name.upper())
        if raw is None or f.name in _TABLES:
            continue
        values[f.name] = _parse(raw, f.type)
    return values


def _parse(raw: str, kind: Any) -> Any:
    kind = str(kind)
    if kind.startswith("list"):
        return [item.strip() for item in raw.replace(";", ",").split(",") if item.strip()]
    if kind.startswith("dict"):  # name=value,name=value
        items = raw.replace(";", ",").split(",")
        return parse_port_map(items) if "int" in kind else parse_pairs(items)
    if kind in ("int", "int | None"):
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "bool":
        return raw.lower() in ("1", "true", "yes")
    return raw
