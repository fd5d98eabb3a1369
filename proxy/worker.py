"""One worker of ``rmq-proxy --workers N``: a whole proxy (``ProxyApp``) in its own process,
sharing the gRPC port with its siblings (SO_REUSEPORT).

Started only by ``proxy.supervisor``: ``python -m proxy.worker --index K --parent PID``,
with its configuration as JSON on stdin and ``PROMETHEUS_MULTIPROC_DIR`` in its
environment. It prints one line on stdout once it serves::

    rmq-proxy worker ready pid=<pid> grpc=<host:port> http=<host:port>

(``http`` is its private ops server on 127.0.0.1; the group's is the supervisor's), and
stops gracefully on SIGTERM or SIGINT as a single proxy does. If the supervisor dies, the
kernel sends the worker SIGTERM (``PR_SET_PDEATHSIG``), so no orphan keeps the port.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
from typing import Any

from proxy.app import ProxyApp
from proxy.collector import settle_heap
from proxy.config import ProxyConfig
from proxy.loop import run_main

log = logging.getLogger("proxy.worker")

_PR_SET_PDEATHSIG = 1


def config_to_json(config: ProxyConfig) -> bytes:
    """The configuration as the supervisor hands it to a worker."""
    return json.dumps(dataclasses.asdict(config)).encode()


def config_from_json(raw: bytes | str) -> ProxyConfig:
    """The supervisor's configuration (on the worker's stdin, so no secret is ever in a
    process's arguments or environment)."""
    data: dict[str, Any] = json.loads(raw)
    for f in dataclasses.fields(ProxyConfig):  # the tables: [receive], [security], ...
        table = f.default_factory
        if dataclasses.is_dataclass(table) and isinstance(table, type):
            data[f.name] = table(**data[f.name])
    config = ProxyConfig(**data)
    config.validate()
    return config


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when the supervisor exits (Linux); exit now if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's own SIGTERM must do
        pass
    if os.getppid() != parent:
        raise SystemExit("rmq-proxy worker: the supervisor is gone")


async def serve_worker(config: ProxyConfig) -> None:
    """Serve until SIGTERM or SIGINT, then drain as a single proxy does."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Handlers first: a SIGTERM during start-up stops the worker gracefully once started.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = ProxyApp(config, reuse_port=True)
    try:
        await app.start()
        settle_heap()
        print(
            f"rmq-proxy worker ready pid={os.getpid()} "
            f"grpc={config.grpc_host}:{app.grpc_port} "
            f"http={config.http_host}:{app.http_port}",
            flush=True,
        )
        await stop.wait()
    finally:
        log.info("worker %s stopping", config.proxy_id)
        await app.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="rmq-proxy worker", description=__doc__)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--parent", type=int, required=True, help="the supervisor's pid")
    p.add_argument("--log-level", default="info")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s w{args.index} %(name)s: %(message)s",
    )
    _die_with_parent(args.parent)
    config = config_from_json(sys.stdin.buffer.read())
    run_main(serve_worker(config))


if __name__ == "__main__":
    main()
