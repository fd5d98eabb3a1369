"""Console scripts ``rmq-broker-stub`` and ``rmq-namesrv-stub``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from broker_stub.broker import Broker
from broker_stub.config import BrokerConfig, NamesrvConfig
from broker_stub.namesrv import NameServer
from proxy.remoting.client import split_address_list


def run_until_signalled(
    start: Callable[[], Awaitable[object]],
    stop: Callable[[], Awaitable[None]],
    ready_line: Callable[[], str],
) -> None:
    """Start a server on uvloop (when installed), print ``ready_line()``, serve until
    SIGTERM or SIGINT, then stop it."""

    async def main() -> None:
        await start()
        print(ready_line(), flush=True)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        try:
            await stopping.wait()
        finally:
            await stop()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def broker_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rmq-broker-stub", description="A RocketMQ-compatible POP broker (in memory)."
    )
    parser.add_argument("--name", default="broker-a", help="broker name (default broker-a)")
    parser.add_argument("--cluster", default="DefaultCluster")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=10911, help="remoting port; 0 picks a free one")
    parser.add_argument("--advertise-host", help="host written into routes (default: --host)")
    parser.add_argument(
        "--namesrv", default="", help="name servers host:port[;host:port...] (or commas)"
    )
    parser.add_argument("--queues", type=int, default=4, help="queues per new topic (default 4)")
    parser.add_argument(
        "--topic", action="append", default=[], help="create this topic at start (repeatable)"
    )
    parser.add_argument(
        "--no-auto-create-topics", action="store_true", help="refuse sends to unknown topics"
    )
    parser.add_argument(
        "--register-interval", type=float, default=30.0, help="seconds between registrations"
    )
    parser.add_argument(
        "--max-reconsume-times",
        type=int,
        default=16,
        help="retryMaxTimes of groups not created explicitly (default 16)",
    )
    parser.add_argument(
        "--transaction-check-max",
        type=int,
        default=BrokerConfig.transaction_check_max,
        help="checks of an open half message before it is discarded (transactionCheckMax, "
        "default 15)",
    )
    parser.add_argument(
        "--acl-file",
        help="ACL 2.0 users and rules (JSON) this broker answers AUTH_GET_USER / AUTH_GET_ACL "
        "with, for a proxy with security.auth_source = cluster (broker_stub/auth.py)",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    _logging(args.log_level)
    namesrvs = split_address_list(args.namesrv)
    broker = Broker(
        BrokerConfig(
            name=args.name,
            cluster=args.cluster,
            host=args.host,
            port=args.port,
            advertise_host=args.advertise_host,
            namesrv_addrs=namesrvs,
            default_queue_nums=args.queues,
            topics=args.topic,
            auto_create_topics=not args.no_auto_create_topics,
            register_interval=args.register_interval,
            max_reconsume_times=args.max_reconsume_times,
            transaction_check_max=args.transaction_check_max,
            acl_file=args.acl_file,
        )
    )
    run_until_signalled(
        broker.start, broker.stop, lambda: f"broker {broker.name} listening on {broker.address}"
    )


def namesrv_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="rmq-namesrv-stub", description="A RocketMQ-compatible name server (in memory)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9876, help="remoting port; 0 picks a free one")
    parser.add_argument(
        "--broker-timeout",
        type=float,
        default=120.0,
        help="seconds without registration before a broker expires",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    _logging(args.log_level)
    server = NameServer(
        NamesrvConfig(host=args.host, port=args.port, broker_timeout=args.broker_timeout)
    )
    run_until_signalled(
        server.start, server.stop, lambda: f"name server listening on {server.address}"
    )
