"""Every make target the README or docs/ tell a user to run, run as a user runs it: ``make
<target> VAR=...`` from the repository root, in its smallest size, its results written into
the test's temporary folder (``RESULTS=...``; never results/ or docs/). Each must exit 0
and write what it says it writes; ``make run`` and ``make stack`` must serve, then stop
cleanly on Ctrl-C (SIGINT to make's process group, as a terminal sends it).

Through make, not the functions behind it: the suite once ran every benchmark's code on
pytest's event loop while the commands ran on uvloop (``proxy.loop.run_main``), whose
subprocess call refused a keyword asyncio takes, and every benchmark crashed at its first
process with nobody told (issue 39). Here the interpreter, the loop, the Makefile's flags
and prerequisites are the user's.

The real-broker targets (bench-real, bench-peer, bench-cold, bench-fleet-hop, soak) start
their own RocketMQ JVMs, as the commands do; missing jars or a JVM that does not start
fail them, never skip them (``make test`` runs ``make rocketmq`` first).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.soak_checks import (
    assert_drains_cost_at_most_crossed_calls,
    assert_every_message_accounted,
)
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

pytestmark = [pytest.mark.smoke, pytest.mark.slow]

# The documented targets this file does not run, and why. Everything else the README and
# docs/ name must have a test_make_<target> here (test_every_documented_target_is_smoked).
NOT_RUN_HERE = {
    "test": "the whole suite, this file included",
    "test-latest": "the whole suite, in a virtualenv of its own",
    "check": "a part of the suite",
    "check-pythons": "make test runs it after the suite",
    "lint": "make check and make test run it",
    "bench": "its four benchmarks, each run here: bench-modes, bench-calibrate, bench-broker, "
    "bench-analytics",
    "venv": "an install: every target here runs it first, as its prerequisite",
    "system-deps": "an install, as above",
    "rocketmq": "an install, as above",
    "interop-deps": "an install, as above",
    "deploy-node-deps": "an install, as above",
    "lock": "rewrites the committed constraints.txt from PyPI",
    "clean": "removes the virtualenv this file runs in",
}
# Stop: Ctrl-C, then at most this long before SIGKILL of what is left in the group.
STOP_S = 60.0
# After make exits, how long what it started may take to be gone before it counts as left.
EXIT_GRACE_S = 10.0
# How long a benchmark's RocketMQ JVM may take to start (rocketmq_local.launcher); the
# real-broker targets' bounds below leave room for it.
REAL_READY_S = 240


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO / "Makefile").read_text(), re.M))


def documented_targets() -> set[str]:
    """Makefile targets that the README or a page of docs/ shows as ``make <target>``."""
    said: set[str] = set()
    for doc in DOCS:
        said |= set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", doc.read_text()))
    return said & _makefile_targets()


def _environment() -> dict[str, str]:
    """This process's environment, less what a make above pytest exports to its recipes
    (``make test``) or pytest-xdist to its workers: a user's shell has none of it, and a
    jobserver or command-line variables of another make must not reach the one started
    here."""
    drop = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR"}
    env = {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_XDIST")
    }
    # A benchmark's own RocketMQ JVMs start here beside the suite's session cluster, on the
    # same 2 cores: give them longer than the 90 s a lone cluster gets to say it is ready.
    env.setdefault("RMQ_REAL_READY_TIMEOUT_S", str(REAL_READY_S))
    return env


def _venv_args() -> list[str]:
    """``VENV=...`` when the suite runs in another virtualenv than the Makefile's default
    (``make test-latest``'s), so that make runs the same interpreter and packages."""
    if sys.prefix == sys.base_prefix:
        pytest.fail(
            "the smoke tier runs make with the virtualenv it runs in: run pytest from one "
            "(make test)",
            pytrace=False,
        )
    if Path(sys.prefix).resolve() == (REPO / ".venv").resolve():
        return []
    return [f"VENV={sys.prefix}"]


def _start(target: str, variables: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``make <target> <variables>`` from the repository root, in a process group of its
    own (its id is make's pid), output into ``log``."""
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            ["make", target, *_venv_args(), *variables],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_environment(),
            start_new_session=True,
        )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> int | None:
    """Ctrl-C to make's process group while anything of it runs (the benchmarks stop what
    they started in their ``finally``); past ``STOP_S``, SIGKILL to whatever is left of the
    group. make's exit code, None if it had to be killed."""
    code: int | None = proc.poll()
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(STOP_S)
    deadline = time.monotonic() + STOP_S
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
        code = None
    if proc.poll() is None:
        proc.wait(10)
    return code


def _tail(log: Path, chars: int = 6000) -> str:
    return log.read_text(errors="replace")[-chars:]


def make(tmp_path: Path, target: str, *variables: str, timeout: float) -> str:
    """Run ``make <target> <variables>`` to its end (at most ``timeout`` s; past it the run
    is stopped and the test fails); its output. Fails unless it exited 0."""
    log = tmp_path / f"make-{target}.log"
    proc = _start(target, list(variables), log)
    started = time.monotonic()
    try:
        code = proc.wait(timeout)
        # What it started and did not stop: a child still exiting (a Spark JVM whose
        # driver has gone) gets a few seconds to be gone.
        gone_by = time.monotonic() + EXIT_GRACE_S
        while _group_alive(proc.pid) and time.monotonic() < gone_by:
            time.sleep(0.1)
        left_running = _group_alive(proc.pid)
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        pytest.fail(f"make {target} still running after {timeout:.0f} s:\n{_tail(log)}")
    finally:
        _stop_group(proc)
    took = time.monotonic() - started
    print(f"make {target}: exit {code} in {took:.1f} s")
    assert code == 0, f"make {target} exited with {code}:\n{_tail(log)}"
    assert not left_running, f"make {target} left processes running:\n{_tail(log)}"
    return log.read_text(errors="replace")


def load_json(path: Path, output: str) -> dict:
    assert path.is_file(), f"no {path}; the command's output:\n{output[-6000:]}"
    data = json.loads(path.read_text())
    assert isinstance(data, dict), path
    return data


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _wait_for_output(proc: subprocess.Popen[bytes], log: Path, pattern: str, timeout: float):
    """The first match of ``pattern`` (multiline) in the output of a make that runs on;
    fails if make exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, log.read_text(errors="replace"), re.M)
        if match:
            return match
        if proc.poll() is not None:
            pytest.fail(f"make exited with {proc.returncode} before it served:\n{_tail(log)}")
        time.sleep(0.2)
    pytest.fail(f"{pattern!r} not printed within {timeout:.0f} s:\n{_tail(log)}")


def _wait_http_200(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (status := _http_status(url)) != 200:
        assert time.monotonic() < deadline, f"{url} answered {status} for {timeout:.0f} s"
        time.sleep(0.2)


def _ctrl_c(proc: subprocess.Popen[bytes], log: Path) -> str:
    """Ctrl-C as a terminal sends it (SIGINT to make's process group); make must end and
    leave nothing of its group running. The output."""
    code = _stop_group(proc)
    output = log.read_text(errors="replace")
    assert code is not None, f"it did not stop within {STOP_S:.0f} s of Ctrl-C:\n{output[-6000:]}"
    # make passes the interrupt on and ends by it (-SIGINT), after its recipe has exited.
    assert code in (0, -signal.SIGINT), f"make ended with {code}:\n{output[-6000:]}"
    assert "Traceback" not in output, output[-6000:]
    return output


# --- the list of targets itself ------------------------------------------------------------


def test_every_documented_target_is_smoked():
    """A target a page tells a user to run gets a test here the day it is documented."""
    documented = documented_targets()
    assert {"run", "stack", "bench-modes", "soak"} <= documented  # the scan finds them
    smoked = {  # test_make_<target>[__<variant>]
        name.removeprefix("test_make_").split("__")[0].replace("_", "-")
        for name in globals()
        if name.startswith("test_make_")
    }
    missing = documented - smoked - set(NOT_RUN_HERE)
    assert not missing, f"documented make targets with no smoke test: {sorted(missing)}"
    assert not smoked - _makefile_targets(), "a smoke test for a target make does not have"


# --- the benchmarks on broker stubs ----------------------------------------------------------


@pytest.mark.timeout(400)
def test_make_bench_modes(tmp_path):
    output = make(
        tmp_path, "bench-modes", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--scenarios sparse,fanin,filtered --modes notify,adaptive --brokers 2 "
        "--rounds 1 --sparse-slot-s 2 --fanin-polls 200 --filtered-slot-s 2",
        timeout=300,
    )  # fmt: skip
    results = load_json(tmp_path / "bench" / "results.json", output)
    assert set(results["sparse"]) == {"notify", "adaptive"}, results.keys()
    assert all(row["delivered"] > 0 for row in results["sparse"].values()), results["sparse"]
    assert set(results["fanin"]) == {"200"}, results["fanin"]
    assert set(results["filtered"]) == {"tag", "sql92"}, results.keys()
    for kind, rows in results["filtered"].items():
        assert all(row["delivered"] > 0 for row in rows.values()), (kind, rows)
    assert results["summary"], results.keys()
    for chart in results["charts"]:
        assert (tmp_path / "bench" / chart).stat().st_size > 0, chart
    assert "latency_by_mode.png" in results["charts"]  # matplotlib: the bench extra


@pytest.mark.timeout(300)
def test_make_bench_storm(tmp_path):
    """One small storm on stubs, the Node generator (its npm install is the target's first
    run): the command runs and reports every poll, answered or not. Whether a storm costs
    a call is the benchmark's figure, and at the load of this suite a poll's deadline can
    pass; that grpcio takes up every call of a storm is tests/unit/test_grpc_intake.py."""
    output = make(
        tmp_path, "bench-storm", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--smoke --polls 100 --targets notify --generators node", timeout=240,
    )  # fmt: skip
    rows = load_json(tmp_path / "bench-storm.json", output)["rows"]
    assert [(r["target"], r["generator"], r["polls"]) for r in rows] == [("notify", "node", 100)]
    row = rows[0]
    assert row["answered"] > 0 and row["answered"] + sum(row["errors"].values()) == 100, row
    assert "CANCELLED" not in row["errors"], row  # grpcio's intake drops none


@pytest.mark.timeout(200)
def test_make_config_doc(tmp_path):
    """What the target writes (elsewhere than the committed file) is the committed file."""
    written = tmp_path / "configuration.md"
    make(tmp_path, "config-doc", f"CONFIG_DOC={written}", timeout=120)
    assert written.read_text() == (REPO / "docs" / "configuration.md").read_text()


@pytest.mark.timeout(200)
def test_make_bench_broker(tmp_path):
    output = make(
        tmp_path, "bench-broker", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--messages 2000 --wakeups 20", timeout=120,
    )  # fmt: skip
    results = load_json(tmp_path / "bench-broker.json", output)
    assert results["pop_ack_msgs_per_s"] > 0, results
    assert results["wakeups"] == 20, results
    assert results["wakeup_ms_p99"] is not None, results


@pytest.mark.timeout(300)
def test_make_bench_registrations(tmp_path):
    """Six clients of two groups on one proxy and on three, over one round: each client
    named to both brokers once a round, and each group's lag asked of both brokers once a
    refresh by each proxy with a consumer of it."""
    output = make(
        tmp_path, "bench-registrations", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--clients 6 --groups 2 --rounds 1", timeout=240,
    )  # fmt: skip
    results = load_json(tmp_path / "bench-registrations.json", output)["fleets"]
    assert [r["proxies"] for r in results] == [1, 3], results
    for r in results:
        assert r["heartbeats_per_round"] == r["clients"] * r["brokers"], r
        # Every proxy holds a consumer of both groups (6 clients in turn over 1 or 3).
        assert r["consume_stats_per_refresh"] == r["proxies"] * r["groups"] * r["brokers"], r


@pytest.mark.timeout(300)
def test_make_soak_exporters(tmp_path):
    """The clients' metric exporters over two workers whose connections age out: every
    histogram on the supervisor's /metrics is what the exporters recorded."""
    output = make(
        tmp_path, "soak-exporters", f"RESULTS={tmp_path}", "SOAK_EXPORTERS=100", timeout=200
    )
    results = load_json(tmp_path / "soak" / "exporters.json", output)
    assert results["exports"] == 100 * results["rounds"], results
    assert all(n > 0 for n in results["exports_per_worker"]), results  # both workers took some
    assert results["on_metrics"] == results["recorded"], results


@pytest.mark.timeout(300)
def test_make_bench_hostile(tmp_path):
    output = make(
        tmp_path, "bench-hostile", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--seconds 2 --warmup 1 --cooldown 1 --hoard-streams 50 --hoard-clients 2 "
        "--heartbeat-concurrency 10 --flood-streams 2",
        timeout=200,
    )  # fmt: skip
    results = load_json(tmp_path / "hostile" / "hostile.json", output)
    phases = [p["phase"] for p in results["phases"]]
    assert phases == ["baseline", "hoard", "heartbeat", "telemetry", "all"], phases
    assert all(p["good"] for p in results["phases"]), results["phases"]
    assert (tmp_path / "hostile" / "hostile.md").read_text().startswith("| phase |")


@pytest.mark.timeout(300)
def test_make_bench_account(tmp_path):
    output = make(
        tmp_path, "bench-account", f"RESULTS={tmp_path}", "BENCH_ARGS=--polls 200", timeout=200
    )
    account = load_json(tmp_path / "poll-account.json", output)
    assert account["polls"] == 200 and account["rss_per_poll_bytes"] > 0, account
    # The proxy's own objects are in the account: its parts and its types are named.
    assert account["python_by_part"]["proxy"] > 0, account["python_by_part"]
    types = {row["type"] for row in account["objects"]}
    assert "proxy.receive.context.PollContext" in types, types


@pytest.mark.timeout(300)
def test_make_bench_memory(tmp_path):
    """Every kind of poll is run and measured from its RSS readings (after the warm-up, per
    1,000 polls, over the last half) and its tracked objects, and most of its polls ended
    as the kind says. The bound (50 KB per 1,000 polls, a flat last half) is the
    full run's: over a few hundred polls the allocator alone moves RSS by more, so the run
    here reports only (--no-check). That a poll leaves no cycle is
    tests/unit/test_notify_poll.py."""
    polls = 400
    output = make(
        tmp_path, "bench-memory", f"RESULTS={tmp_path}",
        f"BENCH_ARGS=--polls {polls} --concurrency 50 --no-check", timeout=240,
    )  # fmt: skip
    result = load_json(tmp_path / "poll-memory.json", output)
    kinds = result["kinds"]
    ends = {
        "answered": "found",
        "empty": "empty",
        "cancelled": "cancelled",
        "deadline": "deadline_exceeded",
    }
    assert list(kinds) == list(ends), kinds.keys()
    for kind, row in kinds.items():
        assert row["polls"] == polls and row["warmup"] > 0, (kind, row)
        assert len(row["samples"]) > 10 and row["samples"][-1][0] == polls, (kind, row)
        assert row["rss_after_warmup_mb"] > 0, (kind, row)
        for figure in ("kb_per_1000_polls", "last_half_growth_kb", "objects_per_1000_polls"):
            assert isinstance(row[figure], int | float), (kind, figure, row)
        assert isinstance(row["within_bound"], bool) and isinstance(row["flat"], bool), row
        run = row["polls_run"]  # with the wind-down past the last reading
        assert sum(row["outcomes"].values()) == run, (kind, row["outcomes"])
        assert row["outcomes"].get(ends[kind], 0) > run / 2, (kind, row["outcomes"])
    assert result["checked"] is False, result.keys()


@pytest.mark.timeout(300)
def test_make_bench_calibrate(tmp_path):
    output = make(
        tmp_path, "bench-calibrate", f"RESULTS={tmp_path}", "BENCH_ARGS=--messages 3 --await-s 4",
        timeout=200,
    )  # fmt: skip
    results = load_json(tmp_path / "bench" / "calibration.json", output)
    clients = results["clients"]
    assert set(clients) == {"official", "lean"}, clients.keys()
    for name, row in clients.items():
        assert row["sent"] == 3 and row["delivered"] == 3, (name, row)
    assert results["verdict"], results


@pytest.mark.timeout(600)
def test_make_bench_analytics(tmp_path):
    # The proxy's writer in both formats under a short busy scenario, then the Spark job
    # and its reference on 2,000 records generated into the temporary folder, in both
    # formats, on local[2] only: the standalone cluster the command goes on to start is the
    # one tests/analytics/test_cluster.py runs (about a minute more here).
    output = make(
        tmp_path, "bench-analytics", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--records 2000 --runs 1 --no-cluster --profile 1"
        " --writer-slot-s 2 --writer-rounds 1 --writer-age-s 2"
        f" --data {tmp_path / 'data'}",
        timeout=540,  # a cold Spark plans the one-pass job in minutes on a loaded machine
    )  # fmt: skip
    results = load_json(tmp_path / "bench-analytics.json", output)
    assert results["records"] == 2000, results
    assert set(results["sizes"]) == {"parquet", "jsonl"}, results["sizes"]
    for writer in results["writers"]:
        assert writer["events"] > 0 and writer["cpu_us_per_event"] > 0, writer
    assert {w["format"] for w in results["writers"]} == {"parquet", "jsonl"}, results["writers"]
    where = [(p["name"], p["format"]) for p in results["places"]]
    assert where == [("local[2]", "parquet"), ("local[2]", "jsonl")], where
    for place in results["places"]:
        assert len(place["runs"]) == 1 and place["best_job_records_per_s"] > 0, place
    steps = results["profile"]  # --profile 1: each step of the job timed once
    assert len(steps) == 5 and all(len(s["runs_s"]) == 1 for s in steps), steps


@pytest.mark.timeout(300)
def test_make_simulate(tmp_path):
    chart = tmp_path / "scale-parked.png"
    committed = (REPO / "docs" / "scale-parked.png").read_bytes()
    output = make(
        tmp_path, "simulate", f"RESULTS={tmp_path}", f"SIM_CHART={chart}",
        "SIM_ARGS=--quick --warmup 5 --measure 5", timeout=200,
    )  # fmt: skip
    runs = json.loads((tmp_path / "sim" / "results.json").read_text())
    assert isinstance(runs, list) and runs, output[-4000:]
    assert (tmp_path / "sim" / "tables.md").read_text().strip()
    assert chart.read_bytes().startswith(b"\x89PNG"), output[-4000:]
    assert (REPO / "docs" / "scale-parked.png").read_bytes() == committed


@pytest.mark.timeout(300)
def test_make_fuzz(tmp_path):
    output = make(tmp_path, "fuzz", "FUZZ_EXAMPLES=3", timeout=200)
    assert re.search(r"^\d+ passed", output, re.M), output[-4000:]


# --- the benchmarks and the soak on real RocketMQ brokers ------------------------------------


@pytest.mark.real
@pytest.mark.timeout(700)
def test_make_bench_real(tmp_path):
    output = make(
        tmp_path, "bench-real", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--modes notify --brokers 1 --rounds 1 --sparse-slot-s 2 "
        "--sparse-warmup-s 0",
        timeout=600,
    )  # fmt: skip
    results = load_json(tmp_path / "bench-real" / "results.json", output)
    assert results["sparse"]["notify"]["delivered"] > 0, results["sparse"]


@pytest.mark.real
@pytest.mark.timeout(800)
def test_make_bench_peer(tmp_path):
    # The Apache proxy beside ours; the Rust one is left out (its first build takes about
    # 10 minutes).
    output = make(
        tmp_path, "bench-peer", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--peers apache,ours --scenarios reported,remoting --modes notify "
        "--brokers 1 --rounds 1 --reported-slot-s 3 --reported-await-s 4 "
        "--remoting-messages 200",
        timeout=700,
    )  # fmt: skip
    results = load_json(tmp_path / "bench-peer" / "results.json", output)
    rows = results["reported"]
    assert set(rows) == {"apache", "notify"}, rows.keys()
    for label, row in rows.items():
        assert row["sent"] > 0 and row["delivered"] == row["sent"], (label, row)
    assert results["summary"], results.keys()
    remoting = results["remoting"]
    assert set(remoting) == {"apache", "ours"}, remoting.keys()
    for label, row in remoting.items():
        assert row["sent"] == row["delivered"] == 200 and row["send_errors"] == 0, (label, row)


@pytest.mark.real
@pytest.mark.timeout(700)
def test_make_bench_cold(tmp_path):
    output = make(
        tmp_path, "bench-cold", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--runs 1 --modes notify --messages 1 --brokers 1 --await-s 4", timeout=600,
    )  # fmt: skip
    results = load_json(tmp_path / "bench-cold" / "results.json", output)
    summary = results["summary"]["notify"]
    assert summary["runs"] == 1 and summary["undelivered"] == 0, summary
    assert summary["first_ms_max"] is not None, summary


@pytest.mark.real
@pytest.mark.timeout(700)
def test_make_bench_fleet_hop(tmp_path):
    output = make(
        tmp_path, "bench-fleet-hop", f"RESULTS={tmp_path}",
        "BENCH_ARGS=--rounds 1 --slot 2 --brokers 1 --await-seconds 4", timeout=600,
    )  # fmt: skip
    results = load_json(tmp_path / "fleet-hop" / "results.json", output)
    cases = results["cases"]
    assert set(cases) == {"alone", "owner", "hop"}, cases.keys()
    for case, row in cases.items():
        assert row["sent"] > 0 and row["undelivered"] == 0, (case, row)


@pytest.mark.real
@pytest.mark.timeout(800)
def test_make_soak(tmp_path):
    # Both halves as the target runs them (real brokers, then stubs), a few seconds each,
    # with one proxy killed and restarted.
    output = make(
        tmp_path, "soak", f"RESULTS={tmp_path}", "SOAK_MINUTES=0.1",
        "SOAK_ARGS=--faults proxy --interval 4 --drain 30", timeout=700,
    )  # fmt: skip
    for backend in ("real", "stub"):
        report = load_json(tmp_path / "soak" / f"{backend}.json", output)
        assert report["backend"] == backend, report
        assert report["confirmed"] > 0 and report["lost"] == 0, report
        assert any("SIGKILL+restart proxy" in f for f in report["faults"]), report["faults"]


@pytest.mark.timeout(600)
def test_make_soak__official_crowd(tmp_path):
    # The official-client soak's crowd (docs/reliability.md, "A crowd through its drains")
    # at its smallest: two Java processes of 20 SimpleConsumers and one of 5 PushConsumers
    # on two proxies over broker stubs, each proxy restarted once; each drain sends the
    # clients it holds to the other proxy.
    output = make(
        tmp_path, "soak", "SOAK_CLIENTS=official", "SOAK_BACKEND=stub", f"RESULTS={tmp_path}",
        "SOAK_MINUTES=0.5",
        "SOAK_ARGS=--roster crowd --crowd 20 --proxies 2 --faults rolling --interval 10 "
        "--drain 120 --seed 5",
        timeout=540,
    )  # fmt: skip
    report = load_json(tmp_path / "soak-official" / "stub.json", output)
    assert report["backend"] == "stub" and report["roster"] == "crowd", report
    crowd = sorted(name for name in report["exits"] if "-x" in name)
    assert crowd == [
        "java-push-soak-push-x5-1", "java-simple-soak-simple-x20-1",
        "java-simple-soak-simple-x20-2",
    ], report["exits"]  # fmt: skip
    assert "rolling" in [f["fault"] for f in report["faults"]], report["faults"]
    assert report["sent"] > 50, report["sent"]
    assert_every_message_accounted(report, at_least=25)
    assert_drains_cost_at_most_crossed_calls(report)
    assert all(code == 0 for code in report["exits"].values()), report["exits"]


# --- the long-running ones: serve, then stop on Ctrl-C ---------------------------------------


@pytest.mark.timeout(300)
def test_make_run(tmp_path):
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "make-run.log"
    proc = _start("run", [f"RUN_ARGS=--grpc-port {grpc_port} --http-port {http_port}"], log)
    try:
        ready = _wait_for_output(
            proc, log, r"^rmq-proxy ready grpc=(\S+) http=(\S+) namesrv=(\S+)$", 120
        )
        assert ready[1] == f"127.0.0.1:{grpc_port}", ready[0]
        assert ready[2] == f"127.0.0.1:{http_port}", ready[0]
        _wait_http_200(f"http://{ready[2]}/readyz", 30)
    finally:
        _ctrl_c(proc, log)
    assert _http_status(f"http://127.0.0.1:{http_port}/readyz") is None  # nothing listens


@pytest.mark.timeout(400)
def test_make_stack(tmp_path):
    run = tmp_path / "stack"
    log = tmp_path / "make-stack.log"
    proc = _start("stack", [f"STACK_ARGS=--free-ports --run-dir {run}"], log)
    endpoints: list[dict] = []
    try:
        _wait_for_output(proc, log, r"Ctrl-C stops everything", 240)
        endpoints = json.loads((run / "stack.json").read_text())
        names = {e["name"] for e in endpoints}
        assert {"namesrv", "proxy-1", "proxy-2", "prometheus", "pushgateway"} <= names, names
        for e in endpoints:
            for url in e["urls"]:
                if url.endswith("/readyz"):
                    _wait_http_200(url, 30)
    finally:
        output = _ctrl_c(proc, log)
    assert "stopped; logs kept in" in output, output[-6000:]
    # Every part stopped on the stack's SIGTERM by itself, none killed or dead before.
    assert not re.search(r"stopped with code|had already exited", output), output[-6000:]
    for e in endpoints:
        with pytest.raises(ProcessLookupError):
            os.kill(e["pid"], 0)
