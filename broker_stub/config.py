"""Configuration of the stub broker and name server. Defaults are RocketMQ's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BrokerConfig:
    name: str = "broker-a"
    cluster: str = "DefaultCluster"
    host: str = "127.0.0.1"
    port: int = 10911
    # Address written into routes; defaults to host (or 127.0.0.1 when host is a wildcard).
    advertise_host: str | None = None
    namesrv_addrs: list[str] = field(default_factory=list)
    register_interval: float = 30.0

    # topics
    default_queue_nums: int = 4
    auto_create_topics: bool = True
    topics: list[str] = field(default_factory=list)  # created at start
    max_message_size: int = 4 * 1024 * 1024
    retain_per_queue: int = 1_000_000

    # POP
    max_pop_batch: int = 32
    revive_queue_nums: int = 8
    retry_first_probability: float = 0.2
    # retryMaxTimes of a group nobody configured (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP sets
    # one per group): CONSUMER_SEND_MSG_BACK dead-letters past it. Revivals never do.
    max_reconsume_times: int = 16
    scan_limit: int = 1024  # entries a pop may skip over in one queue (tag filtering)

    # transactions (RocketMQ: transactionCheckInterval 30 s, transactionTimeOut 6 s,
    # transactionCheckMax 15); the stub checks sooner so tests need not wait, and discards
    # after RocketMQ's 15 checks, so that a check the proxy loses costs what it would on a
    # real broker (the soak raises it: bench/soak.py)
    transaction_check_interval_ms: int = 1_000
    transaction_timeout_ms: int = 3_000
    transaction_check_max: int = 15
    # RECALL_MESSAGE (RocketMQ: recallMessageEnable, off by default; on in the stub)
    recall_message_enable: bool = True
    # ACL 2.0's users and rules this broker answers AUTH_GET_USER / AUTH_GET_ACL with
    # (broker_stub/auth.py); None: no users
    acl_file: str | None = None

    # broker-side long polling
    # (client, lite topic) subscriptions a broker holds (maxLiteSubscriptionCount)
    max_lite_subscriptions: int = 100_000
    # light message queues (lite topics) a broker holds (maxLmqConsumeQueueNum), enforced
    # only with lmq_quota (enableLmqQuota, off by default as on a RocketMQ broker)
    max_lmq_queues: int = 20_000
    lmq_quota: bool = False
    polling_per_key: int = 1024
    polling_total: int = 100_000

    max_frame: int = 16 * 1024 * 1024

    @property
    def address(self) -> str:
        host = self.advertise_host or (
            "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        )
        return f"{host}:{self.port}"


@dataclass
class NamesrvConfig:
    host: str = "127.0.0.1"
    port: int = 9876
    broker_timeout: float = 120.0  # a broker that has not registered for this long expires
    scan_interval: float = 5.0
