"""A storm of long polls (issue 40): N ReceiveMessage calls arriving within a second.

    .venv/bin/python -m bench.storm --smoke                      # seconds: stubs, 500 polls
    .venv/bin/python -m bench.storm [--polls 2000,5000,20000] [--per-connection 20]
        [--targets apache,ours,bare] [--generators python,node]
        [--window-s 1] [--await-ms 20000] [--tls-mode permissive|enforcing] [--out FILE]

A real cluster (Apache RocketMQ 5.5.0 from ``make rocketmq``: a name server, 2 brokers and
the Apache proxy in cluster mode, as ``bench/peer.py`` starts it) with our proxy in
``notify`` on the same brokers, with one worker and with the default workers; ``bare`` is
a grpcio aio server on uvloop whose ReceiveMessage only sleeps for the poll's await (no
proxy at all: what grpcio itself does with the storm). ``--smoke`` runs broker stubs
instead and small numbers.

Each storm opens ``polls / per-connection`` client connections, each its own HTTP/2
connection (a client coming back), each at a random instant of the first ``window-s``
seconds: it sends its SimpleConsumer settings over Telemetry (the Apache proxy reads a
receive's subscription from them), then its polls at once, on an empty topic, so every
poll should end empty (OK, MESSAGE_NOT_FOUND) after its await. Two load generators, one at
a time: ``python`` (grpcio aio, the lean client's calls, in a child process) and ``node``
(@grpc/grpc-js, ``bench/storm_node``; ``npm ci`` there first, as the Makefile's
``%/node_modules/.installed`` rule does).

Reported per target, generator and size: polls answered (gRPC OK), errors by gRPC status,
the time until every poll was parked (from the storm's start until the proxy held as many
as it answered later: our proxies' ``/v1/status``; the Apache proxy's pops parked on the
brokers, POLLING_INFO; ``bare``: not measured), the spread of the answers, and the
server's RSS (its process tree) before and at its peak.

``--tls-mode enforcing`` starts our proxies with ``RMQ_PROXY_SECURITY_TLS_MODE=enforcing``
(gRPC takes the port itself, no front) and every client connects over TLS, trusting the
certificate each server presents; the default (permissive) has the front relay plaintext
clients to gRPC on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from bench.bench_proxy import load_average, machine
from proxy.api.v2 import definition_pb2 as pb
from proxy.api.v2 import service_pb2 as api
from proxy.api.v2 import service_pb2_grpc
from proxy.loop import run_main
from testkit.lean_client import ClientTls, LeanClient, receive_request, server_tls
from testkit.processes import Process, System, _spawn, terminate

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = ROOT / "bench" / "storm_node"
PROTO_ROOT = ROOT / "proxy" / "api" / "proto"
# A generator gets this long beyond the await to open, poll and report.
SLACK_S = 120.0


# -- the load generators ---------------------------------------------------------------------


async def python_storm(config: dict[str, Any]) -> dict[str, Any]:
    """The Python generator's storm (``storm_node/storm.mjs`` does the same in Node): every
    call's status and end, in seconds from the window's start."""
    from testkit.lean_client import SettingsClient

    tls = (
        ClientTls(config["tls"]["root_pem"].encode(), config["tls"]["name"])
        if config["tls"]
        else None
    )
    run = f"{os.getpid()}-{int(time.time())}"
    cls = SettingsClient if config["telemetry"] else LeanClient
    clients = [
        cls(config["target"], f"storm-py-{run}-{k}", own_connection=True, tls=tls)
        for k in range(config["connections"])
    ]
    per: list[list[int]] = [[] for _ in clients]
    for i in range(config["polls"]):
        per[i % len(clients)].append(i)
    records: list[dict[str, Any]] = []
    setup: Counter[str] = Counter()
    request = receive_request(
        config["group"], config["topic"], await_ms=config["await_ms"], batch=1
    )
    timeout = config["await_ms"] / 1000 + 3

    async def poll(client: LeanClient, record: dict[str, Any], start: float) -> None:
        record["sent"] = time.perf_counter() - start
        try:
            async for response in client.stub.ReceiveMessage(
                request, metadata=client.metadata, timeout=timeout
            ):
                if response.WhichOneof("content") == "status":
                    record["answer"] = pb.Code.Name(response.status.code)
            record["status"] = "OK"
        except grpc.aio.AioRpcError as exc:
            record["status"] = exc.code().name
            record["details"] = exc.details()
        record["ended"] = time.perf_counter() - start

    async def one(k: int, start: float) -> None:
        await asyncio.sleep(random.random() * config["window_s"])
        client = clients[k]
        try:
            await client.prepare(config["group"], config["topic"], config["await_ms"])
            setup["telemetry OK" if config["telemetry"] else "OK"] += 1
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            setup[f"telemetry {getattr(exc, 'code', lambda: 'DEADLINE')()}"] += 1
        mine = [{"conn": k} for _ in per[k]]
        records.extend(mine)
        await asyncio.gather(*(poll(client, r, start) for r in mine))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(one(k, start) for k in range(len(clients))))
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
    return {"generator": "python", "setup": dict(setup), "calls": records}


def generator_main() -> None:
    """Child entry point of the Python generator: the config (JSON) in argv[1]."""
    from testkit.processes import quiet_collector

    quiet_collector()
    result = run_main(python_storm(json.loads(sys.argv[1])))
    print(json.dumps(result), flush=True)


async def run_generator(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """Run one generator's storm in a child process (by pid; killed past its deadline)."""
    if kind == "node":
        node = shutil.which("node")
        if node is None or not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
            raise RuntimeError(f"no node, or no node_modules: cd {NODE_DIR} && npm ci")
        argv = [node, str(NODE_DIR / "storm.mjs"), json.dumps(config)]
    else:
        code = "from bench.storm import generator_main; generator_main()"
        argv = [sys.executable, "-c", code, json.dumps(config)]
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    deadline = config["await_ms"] / 1000 + config["window_s"] + SLACK_S
    try:
        out, err = await asyncio.wait_for(proc.communicate(), deadline)
    except TimeoutError:
        await terminate(proc, 5)
        raise RuntimeError(f"the {kind} generator did not finish in {deadline:.0f} s") from None
    finally:
        if proc.returncode is None:
            await terminate(proc, 5)
    lines = out.decode().strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the {kind} generator failed: {err.decode()[-2000:]}")
    return json.loads(lines[-1])


# -- the bare server --------------------------------------------------------------------------


class Sleeper(service_pb2_grpc.MessagingServiceServicer):
    """ReceiveMessage sleeps for the poll's await and answers empty; nothing else."""

    def __init__(self) -> None:
        self.parked = 0

    async def ReceiveMessage(self, request, context):
        self.parked += 1
        try:
            await asyncio.sleep(request.long_polling_timeout.ToMilliseconds() / 1000 - 0.2)
            yield api.ReceiveMessageResponse(status={"code": 40401, "message": "no new message"})
        finally:
            self.parked -= 1


async def _bare() -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Sleeper(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"bare grpcio aio server listening on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def bare_main() -> None:
    run_main(_bare())


# -- one storm ---------------------------------------------------------------------------------


def summarize(result: dict[str, Any], polls: int, parked_at: float | None) -> dict[str, Any]:
    calls = result["calls"]
    statuses = Counter(c.get("status", "NOT_ENDED") for c in calls)
    failures = [c for c in calls if c.get("status") != "OK"]
    errors = dict(Counter(c.get("status", "NOT_ENDED") for c in failures))
    # One message per status, as the client saw it (they differ only in their timings).
    samples = {c.get("status", "NOT_ENDED"): c.get("details", "") for c in failures}
    ok = sorted(c["ended"] for c in calls if c.get("status") == "OK")
    # What the OK answers said (the response's status code: 40401 MESSAGE_NOT_FOUND).
    answers = Counter(str(c.get("answer", "none")) for c in calls if c.get("status") == "OK")
    failed = sorted(c["ended"] for c in calls if c.get("status") not in ("OK", None))
    return {
        "polls": polls,
        "answered": statuses.get("OK", 0),
        "answer_codes": dict(answers),
        "errors": errors,
        "error_details": samples,
        "setup": result.get("setup", {}),
        "errors_ended_s": [round(failed[0], 2), round(failed[-1], 2)] if failed else None,
        "answers_s": [round(ok[0], 2), round(ok[-1], 2)] if ok else None,
        "all_parked_s": None if parked_at is None else round(parked_at, 2),
    }


async def storm(
    target: str,
    endpoint: str,
    generator: str,
    *,
    polls: int,
    per_connection: int,
    window_s: float,
    await_ms: int,
    process: Process,
    held: Any,
    tls: ClientTls | None,
    group: str,
    topic: str,
) -> dict[str, Any]:
    """One storm against ``endpoint``; ``held()``: the polls the server holds now (None:
    not known), sampled while the storm lasts."""
    config = {
        "target": endpoint,
        "proto_root": str(PROTO_ROOT),
        "polls": polls,
        "connections": max(1, polls // per_connection),
        "window_s": window_s,
        "await_ms": await_ms,
        "group": group,
        "topic": topic,
        "telemetry": target != "bare",
        "warm": False,
        "tls": None if tls is None else {"root_pem": tls.root.decode(), "name": tls.name},
    }
    rss_before = process.rss_bytes()
    peak = rss_before
    samples: list[tuple[float, int]] = []
    started = time.perf_counter()

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, process.rss_bytes())
            if held is not None:
                with contextlib.suppress(Exception):
                    samples.append((time.perf_counter() - started, await held()))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    try:
        result = await run_generator(generator, config)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    answered = sum(1 for c in result["calls"] if c.get("status") == "OK")
    parked_at = next((t for t, n in samples if answered and n >= answered), None)
    row = summarize(result, polls, parked_at)
    row.update(
        target=target,
        generator=generator,
        connections=config["connections"],
        held_max=max((n for _, n in samples), default=None),
        rss_mb=[round(rss_before / 2**20), round(peak / 2**20)],
        load=load_average(),
    )
    return row


# -- the systems -------------------------------------------------------------------------------


def default_workers() -> int:
    """What ``rmq-proxy`` runs by default: one worker per usable core, at most 4."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from bench import scenarios
    from bench.peer import PEER, PeerSystem

    sizes = [int(n) for n in args.polls.split(",")]
    generators = args.generators.split(",")
    wanted = args.targets.split(",")
    workers = default_workers()
    if args.tls_mode == "enforcing":
        os.environ["RMQ_PROXY_SECURITY_TLS_MODE"] = "enforcing"
    ours_workers = tuple(sorted({1, workers}))
    system: System
    if args.smoke:
        system = System(brokers=2, modes=("notify",), workers=ours_workers)
    else:
        system = PeerSystem(
            brokers=2, modes=("notify",), apache="apache" in wanted, notify_workers=ours_workers
        )
    bare: Process | None = None
    rows: list[dict[str, Any]] = []
    await system.start()
    try:
        targets: dict[str, tuple[Process, str]] = {
            label: (p, p.address["grpc"]) for label, p in system.proxies.items()
        }
        if "bare" in wanted:
            bare = await _spawn("bare", "bench.storm", "bare_main")
            targets["bare"] = (bare, bare.address["remoting"])
        ours = [t for t in targets if t not in (PEER, "bare")]
        names = [t for t in targets if t in wanted or (t in ours and "ours" in wanted)]
        for polls in sizes:
            for generator in generators:
                for name in random.sample(names, len(names)):
                    process, endpoint = targets[name]
                    topic = group = f"storm-{name}-{polls}-{uuid.uuid4().hex[:6]}"
                    if name != "bare":
                        await system.create_topic(topic)
                    tls = None
                    if args.tls_mode == "enforcing" and name != "bare":
                        tls = await asyncio.to_thread(server_tls, endpoint)
                    held: Any = None
                    if name == PEER and isinstance(system, PeerSystem):
                        held = lambda g=group, t=topic: system.parked_pops(g, t)  # noqa: E731
                    elif name != "bare":
                        held = lambda p=process: scenarios._in_flight(p)  # noqa: E731
                    row = await storm(
                        name, endpoint, generator, polls=polls,
                        per_connection=args.per_connection, window_s=args.window_s,
                        await_ms=args.await_ms, process=process, held=held, tls=tls,
                        group=group, topic=topic,
                    )  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    await asyncio.sleep(2.0)  # the connections close
    finally:
        if bare is not None:
            await terminate(bare.proc, 5)  # type: ignore[arg-type]
        await system.stop()
    return rows


# The response status codes as numbers (rows written before they were named) -> names.
CODE_NAMES = {str(v): k for k, v in pb.Code.items()}


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| polls | target | generator | answered | errors | all parked (s) | answers (s) "
        "| RSS MB before → peak | load |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        by_status: Counter[str] = Counter()
        for key, n in r["errors"].items():
            by_status[key.split(" (")[0]] += n  # rows that kept the message in the key
        errors = ", ".join(f"{k}: {v:,}" for k, v in by_status.items()) or "0"
        # Answers that are not the empty one (the Apache proxy's TOO_MANY_REQUESTS).
        other = {
            CODE_NAMES.get(code, code): n
            for code, n in r.get("answer_codes", {}).items()
            if CODE_NAMES.get(code, code) != "MESSAGE_NOT_FOUND"
        }
        answered = f"{r['answered']:,}" + "".join(f" ({n:,} {c})" for c, n in other.items())
        answers = "-" if r["answers_s"] is None else f"{r['answers_s'][0]} to {r['answers_s'][1]}"
        parked = "-" if r["all_parked_s"] is None else str(r["all_parked_s"])
        lines.append(
            f"| {r['polls']:,} | {r['target']} | {r['generator']} | {answered} "
            f"| {errors} | {parked} | {answers} | {r['rss_mb'][0]} → {r['rss_mb'][1]} "
            f"| {r['load'][0]} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="broker stubs, 500 polls, 5 s")
    parser.add_argument("--polls", default=None, help="storm sizes (default 2000,5000,20000)")
    parser.add_argument("--per-connection", type=int, default=20, help="polls per connection")
    parser.add_argument("--targets", default="apache,ours,bare")
    parser.add_argument("--generators", default="python,node")
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--await-ms", type=int, default=None, help="default 20000 (smoke 5000)")
    parser.add_argument("--tls-mode", choices=("permissive", "enforcing"), default="permissive")
    parser.add_argument("--out", type=Path, default=None, help="write the rows here (JSON)")
    args = parser.parse_args()
    if args.polls is None:
        args.polls = "500" if args.smoke else "2000,5000,20000"
    if args.await_ms is None:
        args.await_ms = 5000 if args.smoke else 20000
    if args.smoke and "apache" in args.targets.split(","):
        args.targets = ",".join(t for t in args.targets.split(",") if t != "apache")
    print(f"machine: {machine()}, load {load_average()}", flush=True)
    rows = run_main(run(args))
    print(table(rows))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
