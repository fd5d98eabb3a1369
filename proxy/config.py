"""Proxy configuration: defaults, then a TOML file, then environment, then flags.

The TOML file has top-level keys for ``ProxyConfig`` and a ``[receive]`` table for
``ReceiveConfig``. Environment variables ``RMQ_PROXY_<KEY>`` and
``RMQ_PROXY_RECEIVE_<KEY>`` override it (``RMQ_PROXY_RECEIVE_MODE=coupled``).
"""

from __future__ import annotations

import dataclasses
import enum
import os
import socket
import tomllib
from dataclasses import dataclass, field
from typing import Any


class PollMode(enum.StrEnum):
    """How one client long poll is served (docs/design.md, "Receive modes")."""

    NOTIFY = "notify"
    COUPLED = "coupled"
    SLICING = "slicing"


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
    mode: ReceiveMode = ReceiveMode.ADAPTIVE
    # Long-polling time a client may ask for (RocketMQ proxy defaults).
    min_polling_ms: int = 5_000
    max_polling_ms: int = 20_000
    # Answer this long before the client's gRPC deadline, so the answer is not too late.
    reserve_ms: int = 300
    # Adaptive switching (docs/design.md, "The adaptive rule"): receive requests per second
    # per (group, topic) over a sliding window; above `adaptive_high_rate`, and with a
    # first-pop hit ratio of at least `adaptive_hit_high` over at least
    # `adaptive_min_polls` finished polls, use coupled polling; back to notify below
    # `adaptive_low_rate`, below `adaptive_hit_low`, on POLLING_FULL, or at
    # `adaptive_max_coupled` coupled polls in flight per (group, topic).
    adaptive_high_rate: float = 50.0
    adaptive_low_rate: float = 25.0
    adaptive_window_s: float = 10.0
    adaptive_hit_high: float = 0.9
    adaptive_hit_low: float = 0.7
    adaptive_min_polls: int = 20
    adaptive_max_coupled: int = 512
    # Per-(group, topic) thresholds (JSON, or TOML by suffix; rmq-polling-report
    # --thresholds-out writes it), checked every `adaptive_thresholds_check_s`.
    adaptive_thresholds_file: str | None = None
    adaptive_thresholds_check_s: float = 5.0
    # Slicing (MNS): short polls of `slice_ms` over the brokers in turn, at most
    # `slice_quota` of them, then one long poll for the rest of the time.
    slice_ms: int = 200
    slice_quota: int = 8
    # Limits.
    max_in_flight: int = 20_000
    max_probes_per_poll: int = 64
    # Messages popped but not delivered go back with this invisible time.
    nack_invisible_ms: int = 1_000
    # Broker calls that do not wait for messages.
    broker_timeout_s: float = 3.0
    # Deliver to the dead-letter queue instead of the client past this many attempts.
    max_delivery_attempts: int = 17

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
class ProxyConfig:
    proxy_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 8081
    # host:port clients should use to reach this proxy (QueryRoute answers it).
    advertise_address: str | None = None
    http_host: str = "127.0.0.1"
    http_port: int = 8082
    namesrv_addrs: list[str] = field(default_factory=lambda: ["127.0.0.1:9876"])
    route_ttl_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    event_log_dir: str | None = None
    shutdown_grace_s: float = 25.0
    # --embedded-brokers N: a name server and N broker stubs in this process.
    embedded_brokers: int = 0
    topics: list[str] = field(default_factory=list)  # created on embedded brokers
    receive: ReceiveConfig = field(default_factory=ReceiveConfig)

    def validate(self) -> None:
        self.receive.validate()
        if self.embedded_brokers < 0:
            raise ValueError("embedded_brokers must not be negative")


def load(
    path: str | None = None, env: dict[str, str] | None = None, **overrides: Any
) -> ProxyConfig:
    """Build the configuration: defaults < TOML file < environment < ``overrides``.

    ``overrides`` use field names; ``receive_<field>`` reaches the receive table. None
    values are ignored, so unset command-line flags leave the rest alone.
    """
    config = ProxyConfig()
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        _apply(config, {k: v for k, v in data.items() if k != "receive"}, source=path)
        _apply(config.receive, data.get("receive", {}), source=f"{path} [receive]")
    env = os.environ if env is None else env
    _apply(config, _from_env(env, "RMQ_PROXY_", ProxyConfig), source="environment")
    _apply(config.receive, _from_env(env, "RMQ_PROXY_RECEIVE_", ReceiveConfig), "environment")
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


def _apply(target: Any, values: dict[str, Any], source: str) -> None:
    names = {f.name: f for f in dataclasses.fields(target)}
    for key, value in values.items():
        if key not in names or key == "receive":
            raise ValueError(f"{source}: unknown setting {key!r}")
        setattr(target, key, value)


def _from_env(env: dict[str, str] | os._Environ, prefix: str, cls: type) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        raw = env.get(prefix + f.name.upper())
        if raw is None or f.name == "receive":
            continue
        values[f.name] = _parse(raw, f.type)
    return values


def _parse(raw: str, kind: Any) -> Any:
    kind = str(kind)
    if kind.startswith("list"):
        return [item.strip() for item in raw.replace(";", ",").split(",") if item.strip()]
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    if kind == "bool":
        return raw.lower() in ("1", "true", "yes")
    return raw
