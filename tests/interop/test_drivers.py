"""The drivers themselves, without a proxy: the installed clients load, and a client that
cannot reach its server fails quickly with a message instead of hanging."""

from __future__ import annotations

import time

import pytest

from testkit.official.harness import LANGS, run_driver
from tests.support.ports import free_port

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

# Python: QueryRoute is refused at once. Node: 3 QueryRoute attempts, 1 s and 2 s apart.
FAIL_WITHIN_SECONDS = 15


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize(
    "command",
    [
        "produce --topic interop-py --count 1",
        "consume --group g --topic interop-py --await-seconds 5 --expect 1",
        "consume --group g --topic interop-py --start-only",
    ],
    ids=["produce", "consume", "start-only"],
)
def test_closed_port_fails_fast(lang, command, tmp_path):
    args = [*command.split(), "--endpoint", f"127.0.0.1:{free_port()}"]
    started = time.monotonic()
    done = run_driver(lang, args, timeout=FAIL_WITHIN_SECONDS + 15, home=tmp_path)
    elapsed = time.monotonic() - started
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    assert "failed" in done.stderr, done.stderr
    assert elapsed < FAIL_WITHIN_SECONDS, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("lang", LANGS)
def test_bad_usage_exits_2(lang, tmp_path):
    done = run_driver(lang, ["consume", "--topic", "t"], timeout=30, home=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.strip(), done.stderr
