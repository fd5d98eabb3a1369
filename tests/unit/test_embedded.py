"""``rmq-proxy --embedded-brokers`` needs the broker stub, a distribution of its own
(rmq-broker-stub): without it, the proxy says what to install and exits 2."""

from __future__ import annotations

import subprocess
import sys

# The proxy's entry point in a process where importing broker_stub fails, as it does where
# only the proxy's wheel is installed.
WITHOUT_STUB = (
    "import sys; sys.modules['broker_stub'] = None; "
    "from proxy.cli import main; "
    "main(['--embedded-brokers', '1', '--grpc-port', '0', '--http-port', '0', '--workers', '1'])"
)


def test_embedded_brokers_without_the_stub_say_what_to_install():
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_STUB], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 2
    assert "pip install rmq-broker-stub" in done.stderr
    assert "Traceback" not in done.stderr
