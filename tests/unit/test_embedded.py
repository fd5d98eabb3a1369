"""``rmq-proxy --embedded-brokers`` needs the broker stub, a distribution of its own
(rmq-broker-stub): without it, the proxy says what to install and exits 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

MAIN = (
    "from proxy.cli import main; "
    "main(['--embedded-brokers', '1', '--grpc-port', '0', '--http-port', '0', '--workers', '1'])"
)
# The proxy's entry point where only the proxy's wheel is installed (no entry point names a
# starter), or where the stub's entry point is listed but its package cannot be imported.
WITHOUT_STUB = {
    "not installed": "import importlib.metadata as m; m.entry_points = lambda **kw: (); " + MAIN,
    "not importable": "import sys; sys.modules['broker_stub'] = None; " + MAIN,
}


@pytest.mark.parametrize("how", WITHOUT_STUB)
def test_embedded_brokers_without_the_stub_say_what_to_install(how):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_STUB[how]], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 2
    assert "pip install rmq-broker-stub" in done.stderr
    assert "Traceback" not in done.stderr
