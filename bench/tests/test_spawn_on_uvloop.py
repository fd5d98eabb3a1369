"""``testkit.processes._spawn`` on the loop the entry points run on (uvloop, through
``proxy.loop.run_main``), with and without a group id: uvloop's ``subprocess_exec`` takes
fewer keywords than asyncio's (it refused ``group=``, and every benchmark crashed at its
first process). The smoke tier (tests/smoke) runs the commands themselves; this is the
seconds-long check of the one call they all share."""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
from pathlib import Path

from bench import netfault
from proxy.loop import run_main
from testkit.processes import _spawn, terminate


def _gids(pid: int) -> list[int]:
    """The real, effective, saved and filesystem group ids of ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("Gid:"))
    return [int(x) for x in line.split()[1:]]


def _spawn_stub_namesrv(group: int | None) -> list[int]:
    """Start a stub name server through ``_spawn`` on uvloop; its group ids while it runs."""

    async def main() -> list[int]:
        # uvloop is a dependency on Linux: run_main runs on it, as the entry points do.
        assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
        process = await _spawn(
            "namesrv", "broker_stub.cli", "namesrv_main", "--port", "0", "--log-level",
            "warning", group=group,
        )  # fmt: skip
        try:
            assert process.address["remoting"].startswith("127.0.0.1:")
            return _gids(process.pid)
        finally:
            assert not isinstance(process.proc, subprocess.Popen)
            await terminate(process.proc, 10)

    return run_main(main())


def test_spawn_starts_a_process_on_uvloop():
    assert _spawn_stub_namesrv(None) == _gids(os.getpid())


def test_spawn_runs_the_process_under_the_group_it_is_given():
    # As root (the soak's network faults run as root), the group netfault tells a proxy's
    # packets by; otherwise this process's own group, the only one it may set.
    gid = netfault.proxy_gid(0) if os.geteuid() == 0 else os.getgid()
    assert _spawn_stub_namesrv(gid) == [gid] * 4


# What uvloop's subprocess_exec takes besides the program and its arguments (uvloop 0.23,
# ``Loop.__subprocess_run`` in loop.pyx), and ``limit``, which asyncio's
# create_subprocess_exec keeps for its own StreamReaders. Anything else that
# ``subprocess.Popen`` knows (group, user, extra_groups, umask, process_group, pipesize,
# text, encoding, ...) raises "unexpected kwargs" on uvloop.
UVLOOP_KEYWORDS = {
    "stdin", "stdout", "stderr", "universal_newlines", "shell", "bufsize", "preexec_fn",
    "close_fds", "cwd", "env", "startupinfo", "creationflags", "restore_signals",
    "start_new_session", "executable", "pass_fds", "limit",
}  # fmt: skip
SPAWNERS = {"create_subprocess_exec", "create_subprocess_shell", "subprocess_exec"}
SOURCES = ("bench", "proxy", "broker_stub", "analytics", "rocketmq_local", "deploy/local", "tests")


def test_no_subprocess_call_passes_a_keyword_uvloop_refuses():
    """Any process the tools start from a coroutine may run on uvloop one day, as _spawn's
    did: each asyncio subprocess call in the tree passes only what uvloop takes."""
    repo = Path(__file__).resolve().parents[2]
    refused = []
    for top in SOURCES:
        for path in sorted((repo / top).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name not in SPAWNERS:
                    continue
                for kw in node.keywords:
                    if kw.arg is not None and kw.arg not in UVLOOP_KEYWORDS:
                        refused.append(f"{path.relative_to(repo)}:{node.lineno} {kw.arg}=")
    assert not refused, refused
