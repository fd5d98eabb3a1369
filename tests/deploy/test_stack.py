"""`make stack` (deploy/local/stack.py) as a process: every component up and answering, a
message through each proxy, Prometheus scraping, then a clean stop on SIGINT; and the same
stack on real RocketMQ brokers (``--real``), stopped in order on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from proxy.api.v2 import definition_pb2 as pb
from testkit.event_log import part_files, read_records
from testkit.lean_client import LeanClient
from testkit.waits import wait_for, wait_until

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deploy" / "local" / "stack.py"
COMPONENTS = {
    "namesrv", "broker-a", "broker-b", "broker-c", "proxy-1", "proxy-2", "prometheus",
    "pushgateway",
}  # fmt: skip

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> str:
    def printed() -> bool:
        out = path.read_text() if path.exists() else ""
        if text in out:
            return True
        if proc.poll() is not None:
            raise AssertionError(f"stack exited with {proc.returncode}:\n{out}")
        return False

    wait_for(printed, timeout=timeout, step=0.1, what=f"{text!r} printed")
    return path.read_text()


@contextlib.contextmanager
def _running_stack(tmp_path: Path, *args: str, ready_timeout: float = 90):
    """The stack on free ports; stopped (and every child killed by pid) at the end."""
    run = tmp_path / "run"
    out_path = tmp_path / "stack.out"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(STACK), "--free-ports", "--run-dir", str(run), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoints: list[dict] = []
    try:
        printed = _wait_for_text(out_path, "Ctrl-C stops everything", proc, ready_timeout)
        endpoints = json.loads((run / "stack.json").read_text())
        yield proc, printed, {e["name"]: e for e in endpoints}, run, out_path
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for e in endpoints:
            if _alive(e["pid"]):
                os.kill(e["pid"], signal.SIGKILL)


@pytest.fixture
def stack(tmp_path):
    with _running_stack(tmp_path) as running:
        yield running


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
        return r.status, await r.text()


async def _send_and_receive(via: str, to: str, group: str, topic: str) -> None:
    """Send through one proxy and receive the same message through the other."""
    sender, receiver = LeanClient(via), LeanClient(to)
    try:
        body = f"through {via} to {to}".encode()
        sent = await sender.send(topic, body)
        assert sent.status.code == pb.Code.OK, sent.status
        got = None
        for _ in range(5):  # bounded: each poll waits at most 5 s
            got = await receiver.receive(group, topic, await_ms=5000)
            if got.messages:
                break
        assert got is not None and [m.body for m in got.messages] == [body]
        acked = await receiver.ack(group, topic, got.messages)
        assert acked.status.code == pb.Code.OK
    finally:
        await sender.close()
        await receiver.close()


def _rule_groups() -> set[str]:
    names = set()
    for path in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml"):
        names |= {g["name"] for g in yaml.safe_load(path.read_text())["groups"]}
    return names


async def test_stack_serves_then_stops_cleanly_on_sigint(stack):
    proc, printed, endpoints, run, out_path = stack
    assert set(endpoints) == COMPONENTS
    for e in endpoints.values():  # every address and URL is printed, with its pid
        assert e["address"] in printed and f"pid {e['pid']}" in printed
        assert all(url in printed for url in e["urls"])
        assert _alive(e["pid"])
    proxies = [endpoints["proxy-1"], endpoints["proxy-2"]]
    prometheus = endpoints["prometheus"]["urls"][0].rstrip("/")

    async with aiohttp.ClientSession() as http:
        for p in proxies:
            readyz = next(u for u in p["urls"] if u.endswith("/readyz"))
            assert (await _get(http, readyz))[0] == 200
        await _send_and_receive(
            proxies[0]["address"], proxies[1]["address"], "stack-g1", "TestTopic"
        )
        await _send_and_receive(
            proxies[1]["address"], proxies[0]["address"], "stack-g2", "OrderTopic"
        )

        status, text = await _get(http, endpoints["pushgateway"]["urls"][1])
        assert status == 200 and "pushgateway_build_info" in text

        # Prometheus scrapes both proxies and the Pushgateway (the first scrape comes
        # within one scrape interval, 15 s in deploy/prometheus/prometheus.yml).
        wanted = {p["urls"][0].split("/")[2] for p in proxies}
        wanted.add(endpoints["pushgateway"]["address"])
        up: set[str] = set()

        async def all_up() -> bool:
            _, body = await _get(http, f"{prometheus}/api/v1/targets")
            active = json.loads(body)["data"]["activeTargets"]
            up.clear()
            up.update(t["labels"]["instance"] for t in active if t["health"] == "up")
            return wanted <= up

        await wait_until(all_up, timeout=60, step=0.5, what=lambda: f"{wanted} up (up: {up})")
        _, body = await _get(http, f"{prometheus}/api/v1/rules")
        loaded = {g["name"] for g in json.loads(body)["data"]["groups"]}
        assert loaded == _rule_groups()

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    out = out_path.read_text()
    for e in endpoints.values():
        assert not _alive(e["pid"]), f"{e['name']} (pid {e['pid']}) still running"
        assert f"{e['name']:<12} stopped" in out
    # Each proxy wrote the receives it served to its event log under the run dir.
    for name, group in (("proxy-1", "stack-g2"), ("proxy-2", "stack-g1")):
        lines = read_records(part_files(run / "events" / f"proxy={name}"))
        assert any(r["group"] == group and r["messages"] == 1 for r in lines), lines


async def test_stack_with_fleet_links_its_proxies(tmp_path):
    """``make stack STACK_ARGS=--fleet``: the two proxies share their probes (each names the
    other in its [fleet] peers), link up, and serve a message across."""
    with _running_stack(tmp_path, "--fleet") as (_proc, _printed, endpoints, _run, _out):
        proxies = [endpoints["proxy-1"], endpoints["proxy-2"]]
        async with aiohttp.ClientSession() as http:

            async def linked_fleet(url: str) -> dict:
                fleet: dict = {}

                async def linked() -> bool:
                    fleet.update(json.loads((await _get(http, url))[1])["fleet"])
                    return len(fleet["up"]) == 1

                await wait_until(linked, timeout=10, step=0.1, what=lambda: f"linked: {fleet}")
                return fleet

            for proxy in proxies:
                url = next(u for u in proxy["urls"] if u.endswith("/v1/status"))
                fleet = await linked_fleet(url)
                assert len(fleet["up"]) == 1 and len(fleet["members"]) == 2, fleet
        await _send_and_receive(
            proxies[0]["address"], proxies[1]["address"], "stack-fleet", "TestTopic"
        )


def _is_jvm_with_log(endpoint: dict) -> bool:
    cmdline = Path(f"/proc/{endpoint['pid']}/cmdline").read_bytes()
    return b"java" in cmdline and Path(endpoint["log"]).is_file()


async def _route_brokers(via: str, topic: str) -> set[str]:
    client = LeanClient(via)
    try:
        route = await client.query_route(topic)
    finally:
        await client.close()
    assert route.status.code == pb.Code.OK, route.status
    return {q.broker.name for q in route.message_queues}


@pytest.mark.real
async def test_real_stack_serves_then_stops_in_order_on_sigterm(tmp_path):
    """``--real``: a real name server and three real brokers (launcher, test profile) under
    the same supervisor; topics on every broker, a message through the proxies, and the
    ordered stop on SIGTERM, every process gone by pid."""
    started = time.monotonic()
    with _running_stack(tmp_path, "--real", ready_timeout=150) as running:
        proc, printed, endpoints, _, out_path = running
        ready_s = time.monotonic() - started
        assert set(endpoints) == COMPONENTS
        assert "real RocketMQ" in printed
        for e in endpoints.values():
            assert e["address"] in printed and f"pid {e['pid']}" in printed
            assert _alive(e["pid"]), e
        for name in ("namesrv", "broker-a", "broker-b", "broker-c"):
            assert _is_jvm_with_log(endpoints[name]), endpoints[name]
        proxies = [endpoints["proxy-1"], endpoints["proxy-2"]]
        async with aiohttp.ClientSession() as http:
            for p in proxies:
                readyz = next(u for u in p["urls"] if u.endswith("/readyz"))
                assert (await _get(http, readyz))[0] == 200
            assert (await _get(http, endpoints["pushgateway"]["urls"][1]))[0] == 200
            prometheus = endpoints["prometheus"]["urls"][0].rstrip("/")
            assert (await _get(http, f"{prometheus}/-/ready"))[0] == 200
        for topic in ("TestTopic", "OrderTopic"):
            assert await _route_brokers(proxies[0]["address"], topic) == {
                "broker-a", "broker-b", "broker-c"
            }  # fmt: skip
        await _send_and_receive(
            proxies[0]["address"], proxies[1]["address"], "stack-real-g1", "TestTopic"
        )

        stop_started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, out_path.read_text()
        stop_s = time.monotonic() - stop_started
        out = out_path.read_text()
        for e in endpoints.values():
            assert not _alive(e["pid"]), f"{e['name']} (pid {e['pid']}) still running"
        # Proxies first, then Prometheus and the Pushgateway, the brokers, the name server.
        order = [out.index(f"{name:<12} stopped") for name in
                 ("proxy-2", "prometheus", "broker-c", "namesrv")]  # fmt: skip
        assert order == sorted(order), out
        print(f"real stack ready in {ready_s:.1f}s, stopped in {stop_s:.1f}s:")
        print(out[out.index("SIGTERM: stopping") :])
