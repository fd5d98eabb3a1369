"""The interop suite's FIFO SimpleConsumer scenario in a loop on real brokers, until it
fails or ``--runs`` runs have passed (issue 23: a Python SimpleConsumer once got the same
message id twice in one receive, both at attempt 1, once in CI).

    python -m bench.fifo_loop --runs 1000 --lang python

Each run is ``testkit/official/scenarios.fifo_simple_consumers_in_order`` as the suite runs
it: 24 FIFO messages in 4 message groups to a fresh FIFO topic, three SimpleConsumers of a
fresh FIFO group at once, each message exactly once, each group in order. The drivers
record each message's receipt handle, whose broker, queue and offset tell a message given
twice from two stored copies. A failure prints its assertion, with every message's handle,
and stops the loop.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
import uuid
from pathlib import Path

from rocketmq_local import admin
from rocketmq_local.launcher import RealCluster
from testkit.official import scenarios as scenario
from testkit.official.harness import run_client, start_proxy


class Target:
    """What the scenario asks of the test fixture ``target``: fresh groups."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv

    def new_group(self, prefix: str, *, fifo: bool = False) -> str:
        group = f"{prefix}-{uuid.uuid4().hex[:10]}"
        admin.create_group(self.namesrv, group, fifo=fifo)
        return group


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--lang", choices=("python", "java", "node"), default="python")
    p.add_argument("--mode", default="notify")
    p.add_argument("--workdir", default="results/fifo-loop")
    args = p.parse_args(argv)
    workdir = Path(args.workdir)
    homes = itertools.count()

    def run(lang: str, *argv: str | int, timeout: float) -> dict:
        home = workdir / "homes" / f"{next(homes) % 50}"  # reused: the logs of recent runs
        return run_client(lang, *argv, timeout=timeout, home=home)

    cluster = RealCluster.start(2)
    proxy = None
    passed = 0
    started = time.monotonic()
    try:
        proxy = start_proxy(workdir / "proxy", (), mode=args.mode, namesrv=cluster.namesrv_address)
        target = Target(cluster.namesrv_address)
        for n in range(1, args.runs + 1):
            topic = f"fifo-loop-{uuid.uuid4().hex[:10]}"
            admin.create_topic(cluster.namesrv_address, topic, fifo=True)
            try:
                scenario.fifo_simple_consumers_in_order(run, args.lang, proxy, topic, target)
            except AssertionError:
                print(f"run {n} failed after {passed} passed:", file=sys.stderr)
                traceback.print_exc()
                break
            passed += 1
            if n % 10 == 0:
                print(f"{passed} runs passed, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        if proxy is not None:
            proxy.stop()
        cluster.stop(10.0)
    report = {"lang": args.lang, "mode": args.mode, "runs_passed": passed, "asked": args.runs,
              "seconds": round(time.monotonic() - started)}  # fmt: skip
    print(json.dumps(report))
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
