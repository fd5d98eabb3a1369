"""deploy/docker/Dockerfile and .dockerignore, checked without a Docker engine (none runs
here): the instructions parsed, the build context as .dockerignore leaves it turned into a
wheel the way the build stage does, and the HEALTHCHECK command run against a real proxy."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from proxy.config import load
from tests.deploy._packaging import declared_scripts

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for k, args in self.instructions if k == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"no {keyword} in stage {self.name}"
        return found[-1]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions per stage: comments dropped, backslash continuations joined."""
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM, usable in FROM lines
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "ARG" and not stages:
            name, _, default = args.strip().partition("=")
            global_args[name] = default
        elif keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            base = words[0]
            for arg, value in global_args.items():
                base = base.replace(f"${{{arg}}}", value)
            stages.append(Stage(name, base))
        elif stages:
            stages[-1].instructions.append((keyword, args.strip()))
    return stages


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    return value


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_final_stage_is_a_small_non_root_proxy_image(stages):
    assert len(stages) >= 2  # multi-stage: the build tools stay in the build stage
    final = stages[-1]
    assert final.name == "proxy"
    assert final.base.startswith("python:3.11-slim"), final.base  # Debian slim, no compilers
    for stage in stages[1:]:  # every runtime stage drops root
        user = stage.last("USER").split(":")[0]
        assert user not in ("root", "0"), stage.name
        assert user.isdigit(), "numeric uid, so runAsNonRoot can verify it"
    # Only the built wheel crosses into the final stage, never the sources or build tools.
    copies = final.all("COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), copies
    scripts = declared_scripts()
    assert exec_form(final.last("CMD"))[0] in scripts
    config = load(env=env_of(final))
    assert (config.grpc_host, config.http_host) == ("0.0.0.0", "0.0.0.0")
    exposed = {int(p) for args in final.all("EXPOSE") for p in args.split()}
    assert exposed == {config.grpc_port, config.http_port}
    assert final.last("STOPSIGNAL") == "SIGTERM"


def _dockerignore_rules() -> list[tuple[str, bool]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.lstrip("!").removeprefix("**/"), line.startswith("!")))
    return rules


def ignored(path: str, rules: list[tuple[str, bool]]) -> bool:
    """Docker's rule: the last matching pattern wins; a match on a directory covers what is
    in it. ``**/x`` is taken as x at any depth, which is all .dockerignore uses."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    out = False
    for pattern, negated in rules:
        anywhere = "/" not in pattern
        for prefix in prefixes:
            tail = prefix.rsplit("/", 1)[-1] if anywhere else prefix
            if PurePosixPath(tail).match(pattern) if anywhere else prefix == pattern:
                out = not negated
                break
    return out


def test_dockerignore_keeps_the_sources_the_build_copies_and_drops_the_rest(stages):
    rules = _dockerignore_rules()
    build = stages[0]
    sources = [s for args in build.all("COPY") for s in args.split()[:-1]]
    assert sources, "the build stage copies from the context"
    for source in sources:
        assert (REPO / source).exists(), source
        assert not ignored(source, rules), source
    for kept in (
        "proxy/app.py",
        "broker_stub/cli.py",
        "analytics/polling_report/job.py",
        "proxy/api/v2/service_pb2.py",
    ):
        assert not ignored(kept, rules), kept
    for dropped in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "proxy/__pycache__"):
        assert ignored(dropped, rules), dropped


def test_build_stage_makes_the_three_wheels_and_the_proxys_holds_the_proxy_alone(stages, tmp_path):
    """What `pip wheel . ./broker_stub ./analytics` in the build stage does, on the context
    .dockerignore leaves: the proxy's wheel has the proxy and nothing else (no stub, no Spark
    job, no tests); the stub and the analytics job are wheels of their own, each with its
    console scripts."""
    rules = _dockerignore_rules()
    context = tmp_path / "context"
    build = stages[0]
    for args in build.all("COPY"):
        for source in args.split()[:-1]:
            src = REPO / source
            files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
            for f in files:
                rel = f.relative_to(REPO).as_posix()
                if not ignored(rel, rules):
                    (context / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, context / rel)
    (command,) = [a for a in build.all("RUN") if "pip wheel" in a]
    projects = [word for word in command.split() if word == "." or word.startswith("./")]
    assert projects == [".", "./broker_stub", "./analytics"]
    out = tmp_path / "wheels"
    # --no-build-isolation/--no-deps: the venv's setuptools, no downloads in the test.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), *(str(context / p) for p in projects)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    def contents(pattern: str) -> tuple[set[str], str]:
        (wheel,) = out.glob(pattern)
        with zipfile.ZipFile(wheel) as z:
            names = set(z.namelist())
            entry_points = next(n for n in names if n.endswith("entry_points.txt"))
            return names, z.read(entry_points).decode()

    proxy, proxy_scripts = contents("rmq_notify_proxy-*.whl")
    packages = {n.split("/")[0] for n in proxy if not n.startswith("rmq_notify_proxy-")}
    assert packages == {"proxy"}
    assert {"proxy/app.py", "proxy/api/v2/service_pb2.py"} <= proxy
    final = stages[-1]
    assert f"{exec_form(final.last('CMD'))[0]} = " in proxy_scripts
    assert "rmq-broker-stub" not in proxy_scripts and "rmq-polling-report" not in proxy_scripts

    stub, stub_scripts = contents("rmq_broker_stub-*.whl")
    assert "broker_stub/cli.py" in stub and not any(n.startswith("proxy/") for n in stub)
    assert "rmq-broker-stub = " in stub_scripts and "rmq-namesrv-stub = " in stub_scripts

    report, report_scripts = contents("rmq_polling_report-*.whl")
    assert "polling_report/job.py" in report and not any(n.startswith("proxy/") for n in report)
    assert "rmq-polling-report = " in report_scripts


async def test_healthcheck_passes_while_ready_and_fails_while_draining(stages, start_proxy):
    """The HEALTHCHECK command itself, run against a real proxy (the container's port
    taken from RMQ_PROXY_HTTP_PORT as inside the image)."""
    final = stages[-1]
    args = final.last("HEALTHCHECK")
    assert "--interval=" in args and "--timeout=" in args
    command = exec_form(args[args.index("CMD ") + 4 :])
    assert command[0] == "python"
    app = await start_proxy(brokers=1)

    async def check() -> int:
        env = {"RMQ_PROXY_HTTP_PORT": str(app.http_port), "PATH": "/usr/bin:/bin"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *command[1:], env=env, stderr=asyncio.subprocess.DEVNULL
        )
        return await asyncio.wait_for(proc.wait(), 15)

    assert await check() == 0
    app.ready = False  # what SIGTERM does first (proxy/app.py stop)
    assert await check() != 0
    await app.stop()
    assert await check() != 0
