"""The settings a proxy answers on a client's Telemetry stream.

The clients wait for this answer before they start, and use what it says: a producer
needs a retry policy and a maximum body size; a consumer a batch size, a long-polling
time and its group's retry policy, which sets its delivery attempts (``groups.py``). Every
client takes ``metric``: where to export its own metrics (``[client_metrics]``).
"""

from __future__ import annotations

import ipaddress

from proxy.api.convert import duration
from proxy.api.errors import ApiError, Code
from proxy.api.v2 import definition_pb2 as pb
from proxy.config import ClientMetricsConfig, ClientMetricsMode
from proxy.groups import BackoffKind, RetryPolicy


def answer_settings(
    client: pb.Settings,
    *,
    max_body_bytes: int,
    max_polling_ms: int,
    retry: RetryPolicy,
    fifo: bool = False,
    lite_quota: int = 0,
    max_lite_topic_size: int = 0,
    client_metrics: ClientMetricsConfig | None = None,
) -> pb.Settings:
    """The client's settings completed with the server's part."""
    settings = pb.Settings()
    settings.CopyFrom(client)
    settings.metric.CopyFrom(metric_settings(client, client_metrics))
    which = client.WhichOneof("pub_sub")
    if which == "publishing":
        settings.backoff_policy.CopyFrom(
            pb.RetryPolicy(
                max_attempts=3,
                exponential_backoff=pb.ExponentialBackoff(
                    initial=duration(10), max=duration(1000), multiplier=2.0
                ),
            )
        )
        settings.publishing.max_body_size = max_body_bytes
        settings.publishing.validate_message_type = True
    elif which == "subscription":
        settings.backoff_policy.CopyFrom(backoff_policy(retry))
        settings.subscription.receive_batch_size = 32
        settings.subscription.long_polling_timeout.CopyFrom(duration(max_polling_ms))
        settings.subscription.fifo = fifo  # the group's consumeMessageOrderly
        # Lite consumers (5.5) refuse every subscribe_lite while these are 0. Set for every
        # consumer, as the Apache proxy does: the group's lite.sub.client.quota and the
        # proxy's longest lite topic name.
        settings.subscription.lite_subscription_quota = lite_quota
        settings.subscription.max_lite_topic_size = max_lite_topic_size
    else:
        raise ApiError(
            Code.UNRECOGNIZED_CLIENT_TYPE, "settings carry neither publishing nor subscription"
        )
    return settings


def backoff_policy(retry: RetryPolicy) -> pb.RetryPolicy:
    """A consumer group's retry policy as its clients take it: they retry a failed message
    after these delays (push consumers) and stop after ``max_attempts`` deliveries."""
    if retry.kind is BackoffKind.EXPONENTIAL:
        return pb.RetryPolicy(
            max_attempts=retry.max_attempts,
            exponential_backoff=pb.ExponentialBackoff(
                initial=duration(retry.initial_ms),
                max=duration(retry.max_ms),
                multiplier=float(retry.multiplier),
            ),
        )
    return pb.RetryPolicy(
        max_attempts=retry.max_attempts,
        customized_backoff=pb.CustomizedBackoff(next=[duration(ms) for ms in retry.next_ms]),
    )


def metric_settings(client: pb.Settings, config: ClientMetricsConfig | None) -> pb.Metric:
    """Where the client exports its metrics: nowhere (off), the collector, or this proxy
    at the address the client reached it at (its ``access_point``, as the Apache proxy's
    ``metricCollectorMode = proxy`` answers). A client that names no access point is told
    off: there is no address of this proxy it is known to reach."""
    if config is None or config.mode is ClientMetricsMode.OFF:
        return pb.Metric(on=False)
    if config.mode is ClientMetricsMode.COLLECTOR:
        return pb.Metric(on=True, endpoints=endpoints_of(config.collector))
    if not client.access_point.addresses:
        return pb.Metric(on=False)
    return pb.Metric(on=True, endpoints=client.access_point)


def endpoints_of(address: str) -> pb.Endpoints:
    """``host:port`` as the clients' Endpoints: the scheme says how to read the host."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
        scheme = pb.AddressScheme.IPv4 if ip.version == 4 else pb.AddressScheme.IPv6
    except ValueError:
        scheme = pb.AddressScheme.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=int(port))])
