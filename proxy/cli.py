"""``rmq-proxy``: the RocketMQ 5 gRPC proxy with pop-with-notify long polling.

This is the composition root: with ``--embedded-brokers N`` it starts a name server and N
broker stubs in this process (``proxy.embedded``) and puts the proxy in front of them.
Nothing below the entry points knows the stubs exist; ``broker_stub`` uses only
``proxy.remoting``.

With more than one worker (``--workers N``, or the default on a machine with several
cores) this process becomes the supervisor of ``proxy.supervisor`` instead, which runs the
stubs itself and N worker processes (``proxy.worker``) on one gRPC port.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from proxy.app import ProxyApp
from proxy.collector import settle_heap
from proxy.config import (
    MAX_DEFAULT_WORKERS,
    EventLogFormat,
    ProxyConfig,
    ReceiveMode,
    load,
    parse_port_map,
)
from proxy.embedded import StubMissing, fronting, start_embedded_brokers
from proxy.loop import raise_open_files_limit, run_main
from proxy.remoting.client import split_address_list

log = logging.getLogger("proxy")


async def serve(config: ProxyConfig, log_level: str = "info") -> int:
    """Run until SIGTERM or SIGINT, with embedded broker stubs if the config asks, as one
    process or as a supervisor of workers; the exit code."""
    workers = config.worker_count()
    if workers > 1:
        from proxy.supervisor import Supervisor

        return await Supervisor(config, workers, log_level).run()
    await serve_single(config)
    return 0


async def serve_single(config: ProxyConfig) -> None:
    """One process: the proxy (and the embedded stubs) in this event loop."""
    cluster = await start_embedded_brokers(config)
    try:
        config = fronting(config, cluster)
        app = ProxyApp(config)
        try:
            await app.start()
            settle_heap()
            namesrv = ",".join(config.namesrv_addrs)
            remoting = (
                "" if app.remoting is None else f"remoting={config.grpc_host}:{app.remoting_port} "
            )
            print(
                f"rmq-proxy ready grpc={config.grpc_host}:{app.grpc_port} {remoting}"
                f"http={config.http_host}:{app.http_port} namesrv={namesrv}",
                flush=True,
            )
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            log.info("stopping")
            await app.stop()
    finally:
        if cluster is not None:
            await cluster.stop()


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
    p.add_argument(
        "--remoting-port", type=int,
        help="serve RocketMQ's remoting protocol (4.x clients) on this port (0 = free port)",
    )  # fmt: skip
    p.add_argument(
        "--remoting-broker-port", action="append", metavar="BROKER=PORT",
        help="a remoting port of its own for one broker, for clients whose requests name no "
        "broker (the C++ client); repeatable (0 = free port)",
    )  # fmt: skip
    p.add_argument("--http-host")
    p.add_argument("--http-port", type=int, help="ops port (default 8082; 0 = free port)")
    p.add_argument("--advertise-address", help="host:port clients reach this proxy at")
    p.add_argument("--namesrv", help="name servers host:port[;host:port...] (or commas)")
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
    p.add_argument(
        "--event-log-format", choices=[f.value for f in EventLogFormat],
        help="the event log's files (default parquet)",
    )  # fmt: skip
    p.add_argument(
        "--workers",
        type=int,
        help="worker processes serving the gRPC port together (SO_REUSEPORT) under a "
        "supervisor that restarts them and serves the ops port for all; 1 = one process, no "
        f"supervisor; default one per usable core, at most {MAX_DEFAULT_WORKERS}",
    )
    p.add_argument(
        "--metrics-dir",
        help="with workers > 1: the directory where workers write their metrics "
        "(PROMETHEUS_MULTIPROC_DIR; emptied at start; default a temporary directory)",
    )
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
            remoting_port=args.remoting_port,
            remoting_broker_ports=(
                parse_port_map(args.remoting_broker_port) if args.remoting_broker_port else None
            ),
            http_host=args.http_host,
            http_port=args.http_port,
            advertise_address=args.advertise_address,
            namesrv_addrs=split_address_list(args.namesrv) if args.namesrv else None,
            embedded_brokers=args.embedded_brokers,
            topics=args.topic,
            event_log_dir=args.event_log_dir,
            event_log_format=args.event_log_format,
            receive_mode=args.mode,
            receive_max_in_flight=args.max_in_flight,
            workers=args.workers,
            metrics_dir=args.metrics_dir,
        )
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    raise_open_files_limit()
    try:
        code = run_main(serve(config, args.log_level))
    except StubMissing as exc:
        p.error(str(exc))
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
