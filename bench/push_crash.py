"""What a proxy crash costs a push consumer's messages (issue 23): how long until the
messages it was renewing come back, and how many are consumed twice.

    python -m bench.push_crash --backend real --slice-ms 60000
    python -m bench.push_crash --backend stub --slice-ms 20000 --consume-s 45

An official push consumer (``--lang``, default Python) whose listener takes ``--consume-s``
per message, longer than a renewal slice, so the proxy renews what it holds, on a fleet of
two proxies; a producer sends ``--messages`` messages. ``--kill-after-s`` after the first
delivery every proxy is SIGKILLed (the consumer's among them) and restarted: whatever they
renewed is now renewed by nobody. Per message held at the kill: the seconds from the kill to
its next delivery, and whether it was consumed (the listener returned) twice.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import sys
import time
from pathlib import Path

from bench.soak import Cluster, Resources
from bench.soak_official import Client, Role

TOPIC, GROUP = "SoakNormal", "soak-push"


async def run(
    backend: str, *, lang: str, slice_ms: int, consume_s: float, messages: int,
    kill_after_s: float, settle_s: float, linger_s: float, workdir: Path,
) -> dict:  # fmt: skip
    os.environ["RMQ_PROXY_RECEIVE_RENEW_SLICE_MS"] = str(slice_ms)  # the proxies inherit it
    control = workdir / "control"
    control.mkdir(parents=True, exist_ok=True)
    for name in ("stop", "stop-producing"):
        (control / name).unlink(missing_ok=True)
    cluster = Cluster(
        backend, Resources({TOPIC: None}, {GROUP: False}), proxies=2,
        log_dir=str(workdir / "proxies"),
    )  # fmt: skip
    settings = argparse.Namespace(rate=float(messages), consume_ms=int(consume_s * 1000))
    await cluster.start()
    clients: list[Client] = []
    try:
        endpoints = ";".join(cluster.endpoints())
        consumer = Client(Role(lang, "push", GROUP), workdir, control, endpoints, settings)
        producer = Client(Role("python", "produce"), workdir, control, endpoints, settings)
        clients = [consumer, producer]
        await consumer.start()
        await _until(lambda: consumer.ready(), 120, "the consumer is not ready")
        await producer.start()
        await _until(
            lambda: sum(e["ev"] == "sent" for e in producer.events()) >= messages, 60, "sends"
        )
        (control / "stop-producing").touch()
        await _until(lambda: any(e["ev"] == "recv" for e in consumer.events()), 60, "delivery")
        first = min(e["t"] for e in consumer.events() if e["ev"] == "recv")
        await asyncio.sleep(max(0.0, first / 1000 + kill_after_s - time.time()))
        killed_at = int(time.time() * 1000)
        await asyncio.gather(*(cluster.kill_proxy(name) for name in cluster.proxies))
        sent = {e["id"] for e in producer.events() if e["ev"] == "sent"}

        def all_consumed() -> bool:
            done = {e["id"] for e in consumer.events() if e["ev"] == "consumed"}
            return sent <= done

        with contextlib.suppress(RuntimeError):  # what never came is reported below
            await _until(all_consumed, settle_s, "every message consumed")
        await asyncio.sleep(linger_s)  # redeliveries of what was consumed and acked
        (control / "stop").touch()
        for client in clients:
            await client.wait_exit(60)
    finally:
        for client in clients:
            await client.kill()
        await cluster.stop()
    events = consumer.events()
    recvs: dict[str, list[int]] = collections.defaultdict(list)
    consumed: collections.Counter[str] = collections.Counter()
    for e in events:
        if e["ev"] == "recv":
            recvs[e["id"]].append(e["t"])
        elif e["ev"] == "consumed":
            consumed[e["id"]] += 1
    held = [i for i, times in recvs.items() if min(times) < killed_at]
    delays = sorted(
        (min(t for t in recvs[i] if t > killed_at) - killed_at) / 1000
        for i in held
        if any(t > killed_at for t in recvs[i])
    )
    return {
        "backend": backend,
        "lang": lang,
        "slice_ms": slice_ms,
        "consume_s": consume_s,
        "kill_after_s": kill_after_s,
        "sent": len(sent),
        "delivered_before_kill": len(held),
        "redelivered_after_kill": len(delays),
        "redelivery_s_min": delays[0] if delays else None,
        "redelivery_s_p50": delays[len(delays) // 2] if delays else None,
        "redelivery_s_max": delays[-1] if delays else None,
        # Reached the listener again (a second consumption), and finished twice.
        "delivered_twice": sum(1 for times in recvs.values() if len(times) > 1),
        "consumed_twice": sum(1 for n in consumed.values() if n > 1),
        "never_consumed": len(sent - set(consumed)),
    }


async def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting: {what}")
        await asyncio.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("real", "stub"), default="real")
    p.add_argument("--lang", choices=("python", "java", "node"), default="python")
    p.add_argument("--slice-ms", type=int, default=60_000, help="the proxies' renewal slice")
    p.add_argument("--consume-s", type=float, default=90.0, help="the listener's time a message")
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--kill-after-s", type=float, default=75.0, help="after the first delivery")
    p.add_argument("--settle-s", type=float, default=600.0, help="wait for all consumed")
    p.add_argument("--linger-s", type=float, default=150.0, help="then for redeliveries")
    p.add_argument("--workdir", default="results/push-crash/run")
    p.add_argument("--out", help="append the report (a JSON line) to this file")
    args = p.parse_args(argv)
    report = asyncio.run(
        run(
            args.backend, lang=args.lang, slice_ms=args.slice_ms, consume_s=args.consume_s,
            messages=args.messages, kill_after_s=args.kill_after_s, settle_s=args.settle_s,
            linger_s=args.linger_s,
            workdir=Path(args.workdir),
        )
    )  # fmt: skip
    print(json.dumps(report))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(report) + "\n")
    return 0 if report["never_consumed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
