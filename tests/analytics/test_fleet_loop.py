"""The whole loop with a fleet: proxies export their polling, Spark aggregates it on the
standalone cluster, the advice goes back to the proxies and changes how they poll.

Three proxies front one stub cluster (two brokers), each writing its own event log into one
shared directory with short rotation (many files each), all watching one thresholds file.
Two in this process, writing JSON lines; the third, ``fleet-c``, an ``rmq-proxy`` process
writing Parquet (the default), so the job reads a directory of both formats. fleet-c is
SIGKILLed mid-run and started again under the same id: the Parquet file it was writing is
left hidden without its footer (and a torn end), and the restart removes it, so no file
breaks the job's run. Consumers (the lean gRPC client)
drive two groups through every proxy:

- ``busy``: a receive every 125 ms per proxy (5-8 a second) from topics full of messages: every
  first pop hits;
- ``quiet``: a few long polls per second on an empty topic: none hits.

With the proxies' default threshold (50 requests per second) both stay in notify mode. The
job on the cluster reads every proxy's rotated files and advises a threshold below the busy
group's rate (its first pops hit) and keeps the quiet one's at the default (they never do).
Each proxy reloads the file, and the busy group goes coupled on all three while the quiet
one stays in notify: the loop closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from broker_stub import BrokerConfig, StubCluster
from proxy.receive.thresholds import parse
from proxy.remoting.broker_client import BrokerClient
from testkit.event_log import record_count
from testkit.spark_cluster import running, submit
from testkit.waits import wait_until
from tests.support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

BUSY, QUIET = ("busy", "Busy"), ("quiet", "Quiet")
RECEIVE = dict(
    min_polling_ms=200,
    adaptive_thresholds_check_s=0.1,
    adaptive_window_s=3.0,
    adaptive_min_polls=5,
)
# Files complete (and become visible to the job) every 2 s or 8 kB.
EVENT_LOG = dict(event_log_max_bytes=8 * 1024, event_log_max_age_s=2.0)
TORN = b'{"ts": 1, "proxy": "fleet-c", "group": "bu'  # a line cut off by the kill


class ProxyProcess:
    """``rmq-proxy`` in a process of its own, configured by a TOML file; stopped by pid.
    A restart keeps its ports, as a pod restarted in place keeps its address: clients
    reconnect by themselves."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.grpc_port, self.http_port = free_port(), free_port()
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy.cli", "--config", str(self.config),
            "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:
                assert self.proc.returncode is None, "rmq-proxy exited at start"
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{self.http_port}/readyz") as r:
                        if r.status == 200:
                            return
                assert time.monotonic() < deadline, "rmq-proxy not ready in 30 s"
                await asyncio.sleep(0.2)

    async def status(self) -> dict:
        url = f"http://127.0.0.1:{self.http_port}/v1/status"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            return await r.json()

    async def adaptive(self) -> list[dict]:
        return (await self.status())["receive"]["adaptive"]

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            await asyncio.wait_for(self.proc.wait(), 10)


async def drive(client, group_topic: tuple[str, str], interval: float, until: float) -> int:
    """Receive (and ack) through ``client`` every ``interval`` s until ``until``; how many
    receives were answered. A proxy that is down (the killed one) is retried."""
    group, topic = group_topic
    answered = 0
    while time.monotonic() < until:
        started = time.monotonic()
        with contextlib.suppress(Exception):  # UNAVAILABLE while fleet-c restarts
            got = await client.receive(group, topic, await_ms=300, batch=1, timeout_s=3.0)
            answered += 1
            if got.messages:
                await client.ack(group, topic, got.messages)
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
    return answered


async def current_modes(local, remote: ProxyProcess) -> list[dict[tuple[str, str], str]]:
    """Per proxy, the adaptive mode of each (group, topic) it saw lately."""
    modes = [{(g, t): app.engine.switch.current(g, t) for g, t in (BUSY, QUIET)} for app in local]
    modes.append({(e["group"], e["topic"]): e["mode"] for e in await remote.adaptive()})
    return modes


def hidden_files(events: Path) -> list[Path]:
    """fleet-c's files being written."""
    return list(events.glob("proxy=fleet-c/date=*/.part-*.inprogress"))


async def killed_mid_file(remote: ProxyProcess, events: Path) -> Path:
    """SIGKILL ``remote`` while it writes a file: the file it leaves hidden. It opens a
    file at its first event after a rotation, so a kill in between leaves none: then it
    starts again and is killed again, a few times at most."""
    for _ in range(5):
        await wait_until(lambda: bool(hidden_files(events)), timeout=10, what="no file open")
        await remote.kill()
        hidden = hidden_files(events)
        if hidden:
            assert len(hidden) == 1, hidden
            return hidden[0]
        await remote.start()
    raise AssertionError("fleet-c was never killed with a file open, in 5 kills")


def published_records(events: Path) -> dict[str, int]:
    """Records in the visible files of either format, per proxy; hidden files skipped."""
    records: dict[str, int] = {}
    for path in events.glob("proxy=*/date=*/part-*"):
        proxy = path.parts[-3].removeprefix("proxy=")
        records[proxy] = records.get(proxy, 0) + record_count(path)
    return records


async def test_a_fleet_of_proxies_takes_the_advice_of_the_job_on_the_cluster(
    start_proxy, lean, standalone_cluster, driver_python, tmp_path
):
    events, thresholds = tmp_path / "events", tmp_path / "thresholds.json"
    async with StubCluster(2, template=BrokerConfig(topics=["Busy", "Quiet"])) as stubs:
        options = dict(
            namesrv=stubs.namesrv_address, mode="adaptive", event_log_dir=str(events),
            adaptive_thresholds_file=str(thresholds),
            proxy_options={**EVENT_LOG, "event_log_format": "jsonl"}, **RECEIVE,
        )  # fmt: skip
        local = [await start_proxy(**options) for _ in range(2)]
        config = tmp_path / "fleet-c.toml"
        config.write_text(
            f'proxy_id = "fleet-c"\nnamesrv_addrs = ["{stubs.namesrv_address}"]\n'
            f'event_log_dir = "{events}"\nworkers = 1\n'
            + "".join(f"{k} = {v}\n" for k, v in EVENT_LOG.items())
            + f'[receive]\nmode = "adaptive"\nadaptive_thresholds_file = "{thresholds}"\n'
            + "".join(f"{k} = {v}\n" for k, v in RECEIVE.items())
        )
        remote = ProxyProcess(config)
        try:
            await remote.start()
            await run_the_loop(local, remote, lean, stubs, standalone_cluster, driver_python,
                               events, thresholds, tmp_path)  # fmt: skip
        finally:
            await remote.kill()


async def fill(stubs: StubCluster, messages: int) -> None:
    """``messages`` on each broker's Busy topic: the busy group's first pops all hit."""
    for broker in stubs.brokers:
        client = BrokerClient(broker.name, broker.address)
        try:
            for i in range(messages):
                await client.send("Busy", f"m{i}".encode())
        finally:
            await client.close()


def run_job(cluster, driver_python: str, args: list[str], tmp_path: Path) -> str:
    """The job submitted to the cluster; its stdout (the report). Fails with its stderr."""
    out_log, err_log = tmp_path / "job.out", tmp_path / "job.err"
    with open(out_log, "w") as o, open(err_log, "w") as e:
        proc = submit(cluster, driver_python, args, o, e)
    with running(proc):
        returncode = proc.wait(timeout=300)
    assert returncode == 0, err_log.read_text()[-4000:]
    return out_log.read_text()


async def run_the_loop(
    local, remote, lean, stubs, cluster, driver_python, events, thresholds, tmp_path
):
    await fill(stubs, 600)
    clients = [lean(app) for app in local] + [lean(SimpleNamespace(grpc_port=remote.grpc_port))]

    async def phase(seconds: float, busy_interval: float = 0.125) -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(drive(c, BUSY, busy_interval, until) for c in clients),
            *(drive(c, QUIET, 0.4, until) for c in clients),
        )

    # Quiet and busy under the defaults: notify everywhere.
    phase_one = asyncio.ensure_future(phase(24))
    await asyncio.sleep(10)
    for modes in await current_modes(local, remote):
        assert modes[BUSY] == modes[QUIET] == "notify", modes
    # fleet-c dies mid-run; the Parquet file it was writing stays hidden, without its
    # footer, and a torn end.
    hidden = await killed_mid_file(remote, events)
    assert hidden.name.endswith(".parquet.inprogress"), hidden
    with hidden.open("ab") as f:
        f.write(TORN)
    await remote.start()  # same id: its writer removes the unreadable file, and counts it

    async def discarded() -> bool:
        return (await remote.status())["event_log"]["files_discarded"] == 1

    await wait_until(discarded, timeout=10, step=0.2, what="the file left not discarded")
    assert not hidden.exists()
    await phase_one
    await asyncio.sleep(EVENT_LOG["event_log_max_age_s"] + 2)  # every file completed

    records = published_records(events)
    assert set(records) == {"test-proxy-0", "test-proxy-1", "fleet-c"}
    for proxy, suffix in (("test-proxy-0", "jsonl"), ("test-proxy-1", "jsonl"),
                          ("fleet-c", "parquet")):  # fmt: skip
        files = list(events.glob(f"proxy={proxy}/date=*/part-*"))
        assert len(files) >= 3, (proxy, files)  # rotated
        assert {f.suffix for f in files} == {f".{suffix}"}, files
    assert not any(TORN in p.read_bytes() for p in events.glob("proxy=*/date=*/part-*"))

    # The job, on the standalone cluster, over the shared directory.
    args = [str(events), str(tmp_path / "out"), "--window", "10s", "--min-requests", "20",
            "--thresholds-out", str(thresholds)]  # fmt: skip
    report = await asyncio.to_thread(run_job, cluster, driver_python, args, tmp_path)
    total = sum(records.values())
    assert f"rmq-polling-report: {total:,} records, 0 malformed lines" in report, report[:400]
    advice = parse(thresholds.read_bytes())
    busy_rate = 1 / 0.125
    assert advice[BUSY].high_rate < busy_rate, advice  # its first pops hit: coupled pays
    assert advice[QUIET].high_rate == 50.0, advice  # none hit: notify, the default

    # Every proxy reloads the advice, and the busy group goes coupled. A little busier than
    # before: the advice is the lowest rate the busy windows ran at, so the same load would
    # hover around it.
    await phase(12, busy_interval=0.08)
    for modes in await current_modes(local, remote):
        assert modes[BUSY] == "coupled" and modes[QUIET] == "notify", modes
