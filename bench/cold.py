"""The reported case, cold (issue 26): the first message a fresh proxy delivers to a fresh
official consumer of a fresh group on a fresh topic, many times over, per mode.

    .venv/bin/python -m bench.cold [--runs 20] [--modes adaptive,notify] [--apache]
        [--messages 3] [--out results/bench-cold]              # make bench-cold

One real cluster (Apache RocketMQ 5.5.0, ``--brokers`` (2), Profile.BENCH), started once. Each run
takes every mode in shuffled order; for each: a new proxy of that mode (its own process,
``--log-level debug`` so that it logs each poll's timeline, ``proxy/receive/timeline.py``),
a new topic and a new group (the group is not created: the first pop creates it, as in
``peer.reported``), one official Python SimpleConsumer (await 10 s), and ``--messages``
messages sent one at a time, 0.5-3 s apart, each to a random broker, the first 1 s after the
consumer is ready. Then the consumer is killed (what it got was acked) and the proxy
stopped. ``--apache``: the Apache proxy too (one for the whole run: it is not cold).

Per message: send-to-receive latency, the mode of the poll that delivered it and that
poll's stages (pop sent and answered, watches armed, probes sent, hasMsg heard, written, in
ms from the poll's arrival), and the time the message was sent on the same clock. Per mode:
first-message latency p50 / p99 / max over the runs, and the later messages' for contrast.
The load average is recorded with every run: other work on the machine shows there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_proxy import aligned, load_average, machine
from bench.peer import PEER, PeerSystem, _official
from bench.scenarios import ms, percentile
from proxy.loop import run_main
from proxy.receive.timeline import timelines
from proxy.remoting.message import Prop
from testkit.processes import Process, _spawn, scrape, terminate


async def start_proxy(namesrv: str, mode: str, name: str, log_path: Path) -> Process:
    with log_path.open("wb") as log:
        return await _spawn(
            name, "proxy.cli", "main",
            "--namesrv", namesrv, "--grpc-port", "0", "--http-port", "0", "--mode", mode,
            "--proxy-id", name, "--workers", "1", "--log-level", "debug",
            stderr=log,
        )  # fmt: skip


async def stop_proxy(proxy: Process) -> None:
    assert isinstance(proxy.proc, asyncio.subprocess.Process)  # ours, from _spawn
    await terminate(proxy.proc, 15)


async def one_run(system: PeerSystem, label: str, run: int, args, rng: random.Random,
                  out: Path) -> dict:  # fmt: skip
    """One cold slot: fresh proxy (unless the Apache one), topic, group and consumer."""
    nonce = uuid.uuid4().hex[:6]
    topic = group = f"cold-{label}-{run}-{nonce}"
    log_path = out / f"proxy-{label}-{run}.log"
    proxy = None
    if label != PEER:
        proxy = await start_proxy(system.namesrv_address, label, topic, log_path)
        system.proxies[label] = proxy
    load0 = os.getloadavg()
    try:
        await system.create_topic(topic)
        sent: dict[str, float] = {}

        async def work(events: list[dict]) -> None:
            await asyncio.sleep(1.0)  # the first receive is out
            for _ in range(args.messages):
                await asyncio.sleep(rng.uniform(args.gap_min_s, args.gap_max_s))
                msg_id = uuid.uuid4().hex.upper()
                await rng.choice(system.broker_clients).send(
                    topic, b"x" * 64, properties={Prop.UNIQ_KEY: msg_id}
                )
                sent[msg_id] = time.time()
            end = time.time() + args.await_s + 5
            while time.time() < end:
                if sent.keys() <= {e["id"] for e in events if e["event"] == "message"}:
                    break
                await asyncio.sleep(0.05)

        events, errors = await _official(
            system, label, topic, group, args.await_s, out, work, graceful=False
        )
        # Messages the proxy popped and handed back undelivered (a late pop answer is one).
        handed_back = None
        if proxy is not None:
            handed_back = (await scrape(proxy)).get("rocketmq_proxy_nacks_total", 0.0)
    finally:
        if proxy is not None:
            system.proxies.pop(label, None)
            await stop_proxy(proxy)
    received: dict[str, float] = {}
    attempts: dict[str, int | None] = {}
    for e in events:
        if e["event"] == "message":
            received.setdefault(e["id"], e["t"])
            attempts.setdefault(e["id"], e.get("attempt"))
    polls: dict[str, dict] = {}
    if proxy is not None:
        polls = timelines(await asyncio.to_thread(log_path.read_text, errors="replace"))
    messages = []
    for msg_id, t in sent.items():
        poll = polls.get(msg_id, {})
        messages.append(
            {
                "latency_ms": ms(received[msg_id] - t) if msg_id in received else None,
                "mode": poll.get("mode"),
                "attempt": attempts.get(msg_id),  # 1 unless it was redelivered
                # When it was sent, in ms from the arrival of the poll that delivered it.
                "sent_at_ms": round((t - poll["arrived"]) * 1000, 1) if poll else None,
                "stages": poll.get("stages"),
                # From the proxy's last write to the consumer's receive returning.
                "client_ms": (
                    round((received[msg_id] - poll["written"]) * 1000, 1)
                    if poll and msg_id in received and poll["written"] is not None
                    else None
                ),
            }
        )
    return {
        "run": run,
        "label": label,
        "topic": topic,
        "load_1m": [round(load0[0], 2), round(os.getloadavg()[0], 2)],
        "handed_back": handed_back,
        "messages": messages,
        "errors": errors[:5],
    }


def summary(runs: list[dict]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for label in sorted({r["label"] for r in runs}):
        mine = [r for r in runs if r["label"] == label]
        first = [r["messages"][0]["latency_ms"] for r in mine if r["messages"]]
        later = [m["latency_ms"] for r in mine for m in r["messages"][1:]]
        missing = sum(1 for x in first + later if x is None)
        first = [x / 1000 for x in first if x is not None]
        later = [x / 1000 for x in later if x is not None]
        rows[label] = {
            "runs": len(mine),
            "first_ms_p50": ms(percentile(first, 0.5)),
            "first_ms_p99": ms(percentile(first, 0.99)),
            "first_ms_max": ms(max(first, default=None)),
            "later_ms_p50": ms(percentile(later, 0.5)),
            "later_ms_p99": ms(percentile(later, 0.99)),
            "undelivered": missing,
            "first_modes": sorted({r["messages"][0]["mode"] or "-" for r in mine}),
            "redelivered": sum(1 for r in mine for m in r["messages"] if (m["attempt"] or 1) > 1),
            "handed_back": sum(r["handed_back"] or 0 for r in mine),
            "load_1m_max": max(r["load_1m"][1] for r in mine),
        }
    return rows


async def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    modes = [m for m in args.modes.split(",") if m]
    system = await PeerSystem(
        brokers=args.brokers, modes=(), apache=args.apache, notify_workers=()
    ).start()
    labels = [*modes, *([PEER] if args.apache else [])]
    rng = random.Random(args.seed)
    runs: list[dict] = []
    results: dict[str, Any] = {
        "machine": machine(),
        "args": vars(args),
        "load_start": load_average(),
    }
    try:
        for n in range(args.runs):
            for label in rng.sample(labels, len(labels)):
                r = await one_run(system, label, n, args, rng, out)
                runs.append(r)
                lat = [m["latency_ms"] for m in r["messages"]]
                first = r["messages"][0] if r["messages"] else {}
                print(f"  run {n} {label}: first {lat[:1]} ms ({first.get('mode')}, attempt "
                      f"{first.get('attempt')}, client {first.get('client_ms')} ms, sent at "
                      f"{first.get('sent_at_ms')} ms: {' '.join(first.get('stages') or [])}), "
                      f"then {lat[1:]}; load {r['load_1m']}", flush=True)  # fmt: skip
    finally:
        await system.stop()
    results["runs"] = runs
    results["summary"] = summary(runs)
    results["load_end"] = load_average()
    columns = ["runs", "first_ms_p50", "first_ms_p99", "first_ms_max", "later_ms_p50",
               "later_ms_p99", "undelivered", "redelivered", "handed_back", "first_modes",
               "load_1m_max"]  # fmt: skip
    lines = [["proxy", *columns]] + [
        [label, *(str(row[c]) for c in columns)] for label, row in results["summary"].items()
    ]
    print(f"\nCold first message, {args.runs} runs, await {args.await_s} s, "
          f"{args.messages} messages each\n{aligned(lines)}", flush=True)  # fmt: skip
    text = json.dumps(results, indent=2, default=str)
    await asyncio.to_thread((out / "results.json").write_text, text)
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--brokers", type=int, default=2, help="real brokers in the cluster")
    p.add_argument("--modes", default="adaptive,notify")
    p.add_argument("--apache", action="store_true", help="the Apache proxy too (not cold)")
    p.add_argument("--messages", type=int, default=3)
    p.add_argument("--await-s", type=int, default=10)
    p.add_argument("--gap-min-s", type=float, default=0.5)
    p.add_argument("--gap-max-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--out", default="results/bench-cold")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    run_main(run(args))


if __name__ == "__main__":
    main()
