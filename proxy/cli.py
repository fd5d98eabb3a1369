"""``rmq-proxy``: the RocketMQ 5 gRPC proxy with pop-with-notify long polling."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from proxy.app import serve
from proxy.config import ReceiveMode, load


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="rmq-proxy",
        description="RocketMQ 5 gRPC proxy. Settings: defaults < --config TOML < RMQ_PROXY_* "
        "environment < flags.",
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--proxy-id", help="name in metrics and event logs (default host-pid)")
    p.add_argument("--grpc-host")
    p.add_argument("--grpc-port", type=int, help="client port (default 8081; 0 = free port)")
    p.add_argument("--http-host")
    p.add_argument("--http-port", type=int, help="ops port (default 8082; 0 = free port)")
    p.add_argument("--advertise-address", help="host:port clients reach this proxy at")
    p.add_argument("--namesrv", help="name servers host:port[,host:port]")
    p.add_argument(
        "--embedded-brokers", type=int, help="start a name server and N broker stubs in-process"
    )
    p.add_argument(
        "--topic", action="append", help="topic to create on embedded brokers (repeatable)"
    )
    p.add_argument(
        "--mode", choices=[m.value for m in ReceiveMode], help="receive mode (default adaptive)"
    )
    p.add_argument("--max-in-flight", type=int, help="maximum long polls in flight")
    p.add_argument("--event-log-dir", help="write the polling event log here")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load(
            args.config,
            proxy_id=args.proxy_id,
            grpc_host=args.grpc_host,
            grpc_port=args.grpc_port,
            http_host=args.http_host,
            http_port=args.http_port,
            advertise_address=args.advertise_address,
            namesrv_addrs=args.namesrv.replace(";", ",").split(",") if args.namesrv else None,
            embedded_brokers=args.embedded_brokers,
            topics=args.topic,
            event_log_dir=args.event_log_dir,
            receive_mode=args.mode,
            receive_max_in_flight=args.max_in_flight,
        )
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))


if __name__ == "__main__":
    main()
