"""What the hop between proxies costs a message, in a fleet that probes each key once.

    .venv/bin/python -m bench.fleet_hop [--rounds 3] [--slot 40] [--out results/fleet-hop]
    (make bench-fleet-hop)

The reported case of ``bench/peer.py`` (apache/rocketmq#9145): one official Python
SimpleConsumer (await 10 s), messages sent one at a time at random intervals, each to a
random one of ``--brokers`` (2) real RocketMQ 5.5.0 brokers; send-to-receive latency, wall
clock in both processes. Played through three systems, in shuffled order each round:

- ``alone``: one notify proxy, no fleet: it probes for its consumer's polls itself;
- ``owner``: a fleet of three notify proxies sharing their probes, the consumer on the
  owner of its key: its own probes, as alone;
- ``hop``: the same fleet, the consumer on another proxy: the owner's probe hears the
  message, a WAKE crosses to the consumer's proxy, which pops.

``hop`` minus ``alone`` at the median is what sharing costs a message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from bench.peer import PeerSystem, _official, scenarios_broker_client, send_one_at_a_time
from bench.scenarios import ms, percentile
from proxy.fleet.members import owner_of
from rocketmq_local.launcher import free_port_block
from testkit.processes import Process, _spawn, terminate

CASES = ("alone", "owner", "hop")


@dataclass
class _Shim:
    """What ``bench.peer._official`` reads of its system: the proxies' addresses."""

    proxies: dict[str, Process] = field(default_factory=dict)


async def _proxy(name: str, namesrv: str, workdir: Path, fleet: list[str] | None = None,
                 port: int = 0) -> Process:  # fmt: skip
    args = ["--namesrv", namesrv, "--grpc-port", "0", "--http-port", "0", "--mode", "notify",
            "--proxy-id", name, "--workers", "1", "--log-level", "warning"]  # fmt: skip
    if fleet is not None:
        config = workdir / f"{name}.toml"
        config.write_text(
            f'[fleet]\npeers = {json.dumps(fleet)}\nhost = "127.0.0.1"\nport = {port}\n'
        )
        args += ["--config", str(config)]
    return await _spawn(name, "proxy.cli", "main", *args)


async def run(
    rounds: int,
    slot_s: float,
    await_s: int,
    gap_s: tuple[float, float],
    broker_count: int = 2,
) -> dict:
    from rocketmq_local.launcher import Profile, RealCluster

    rng = random.Random(4242)
    workdir = Path(tempfile.mkdtemp(prefix="fleet-hop-"))
    cluster = await asyncio.to_thread(RealCluster.start, broker_count, profile=Profile.BENCH)
    procs: list[Process] = []
    brokers = [scenarios_broker_client(b.name, b.address) for b in cluster.brokers]
    rows: dict[str, dict] = {c: {"latencies": [], "sent": 0, "undelivered": 0, "errors": []}
                             for c in CASES}  # fmt: skip
    try:
        namesrv = cluster.namesrv_address
        ports = [free_port_block() for _ in range(3)]
        fleet = [f"127.0.0.1:{p}" for p in ports]
        alone = await _proxy("alone", namesrv, workdir)
        members = [await _proxy(f"fleet-{i}", namesrv, workdir, fleet, p)
                   for i, p in enumerate(ports)]  # fmt: skip
        procs = [alone, *members]
        await asyncio.sleep(3)  # the links up (heartbeats every 0.5 s)
        for round_no in range(rounds):
            for case in rng.sample(CASES, len(CASES)):
                topic, group = f"hop-{case}-{round_no}", f"hop-{case}-{uuid.uuid4().hex[:6]}"
                await asyncio.to_thread(cluster.create_topic, topic)
                owner = owner_of(fleet, group, topic)
                at = {
                    "alone": alone,
                    "owner": members[fleet.index(owner)],
                    "hop": next(m for f, m in zip(fleet, members, strict=True) if f != owner),
                }
                shim = _Shim({case: at[case]})
                sent: dict[str, float] = {}

                async def work(events: list[dict], topic=topic, sent=sent) -> None:
                    await send_one_at_a_time(
                        brokers, topic, rng, slot_s, gap_s, await_s, sent, events
                    )

                system = cast(PeerSystem, shim)  # _official reads only .proxies
                events, errors = await _official(system, case, topic, group, await_s, workdir, work)
                received: dict[str, float] = {}
                for e in events:
                    if e["event"] == "message":
                        received.setdefault(e["id"], e["t"])
                row = rows[case]
                row["latencies"] += [received[i] - t for i, t in sent.items() if i in received]
                row["sent"] += len(sent)
                row["undelivered"] += sum(1 for i in sent if i not in received)
                row["errors"] += errors[:5]
                print(f"round {round_no} {case}: {len(sent)} sent", flush=True)
    finally:
        for proc in procs:
            assert isinstance(proc.proc, asyncio.subprocess.Process)
            await terminate(proc.proc, 15)
        for client in brokers:
            await client.close()
        await asyncio.to_thread(cluster.stop)
        shutil.rmtree(workdir, ignore_errors=True)
    report: dict = {"rounds": rounds, "slot_s": slot_s, "gap_s": list(gap_s), "cases": {}}
    for case, row in rows.items():
        lat = sorted(row["latencies"])
        report["cases"][case] = {
            "sent": row["sent"], "undelivered": row["undelivered"], "errors": row["errors"],
            "p50_ms": ms(percentile(lat, 0.5)), "p90_ms": ms(percentile(lat, 0.9)),
            "p99_ms": ms(percentile(lat, 0.99)),
            "mean_ms": ms(statistics.mean(lat)) if lat else None,
        }  # fmt: skip
    cases = report["cases"]
    if cases["hop"]["p50_ms"] is not None and cases["alone"]["p50_ms"] is not None:
        report["hop_adds_p50_ms"] = round(cases["hop"]["p50_ms"] - cases["alone"]["p50_ms"], 2)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slot", type=float, default=40.0, help="seconds of sending per case")
    p.add_argument("--await-seconds", type=int, default=10)
    p.add_argument("--brokers", type=int, default=2, help="real brokers in the cluster")
    p.add_argument("--out", default="results/fleet-hop")
    args = p.parse_args(argv)
    report = asyncio.run(run(args.rounds, args.slot, args.await_seconds, (0.5, 1.5), args.brokers))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
