"""Helpers for driving the official RocketMQ 5 Python client (rocketmq-python-client 5.1.2),
shared by the interop driver (testkit/official/python_client.py) and the benchmarks' driver
(official_consumer.py, beside it). Runs under ``.venv-interop/bin/python`` only: the client
bundles its own protobuf and generated descriptors.
"""

from __future__ import annotations

import os
import sys
import threading

REQUEST_TIMEOUT_SECONDS = 3  # the client's default, stated so deadlines can be computed


def arm_watchdog(seconds: float) -> None:
    """Bound the whole run: the client has waits without a timeout of their own."""

    def expire() -> None:
        name = os.path.basename(sys.argv[0])
        sys.stderr.write(f"{name}: deadline of {seconds:.0f}s exceeded, giving up\n")
        sys.stderr.flush()
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def route_endpoints(client, topic: str) -> list[str]:
    """The broker endpoints QueryRoute gave; startup only logs a failed QueryRoute."""
    endpoints = sorted(str(e) for e in client.route_manager.get_all_endpoints().values())
    if not endpoints:
        raise RuntimeError(
            f"no route for topic {topic!r}: QueryRoute failed or returned no queues "
            "(see ~/logs/rocketmq_python/rocketmq_client.log)"
        )
    return endpoints


def client_configuration(endpoint: str):
    """The client's configuration, with credentials from the environment if given."""
    from rocketmq import ClientConfiguration, Credentials

    credentials = Credentials(
        os.environ.get("RMQ_INTEROP_ACCESS_KEY", ""), os.environ.get("RMQ_INTEROP_SECRET_KEY", "")
    )
    return ClientConfiguration(endpoint, credentials, request_timeout=REQUEST_TIMEOUT_SECONDS)


def tls_enabled() -> bool:
    return os.environ.get("RMQ_INTEROP_TLS") == "1"


def simple_consumer(endpoint: str, group: str, topic: str, expression: str, await_seconds: int):
    """A started SimpleConsumer of ``topic``; the caller shuts it down."""
    from rocketmq import FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(
        client_configuration(endpoint),
        group,
        {topic: FilterExpression(expression)},
        await_duration=await_seconds,
        tls_enable=tls_enabled(),
    )
    consumer.startup()
    return consumer


def wait_for_settings(consumer, timeout: float = 10) -> None:
    """Wait for the Telemetry settings answer; the client does not wait for it itself."""
    # Set by SimpleConsumer.reset_setting, which runs only for a Telemetry answer that has
    # status OK and settings.
    if not consumer._init_settings_event.wait(timeout):
        raise RuntimeError(f"no Telemetry answer with status OK and settings within {timeout:.0f}s")
