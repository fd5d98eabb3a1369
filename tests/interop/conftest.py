"""Fixtures for the interop tests: the proxy as a process, and the official clients' drivers.

``proxy`` starts ``rmq-proxy --embedded-brokers 3`` on free loopback ports for one test and
stops it by pid afterwards (SIGTERM, then SIGKILL after 10 s, which fails the test). Set
RMQ_INTEROP_MODE=notify|coupled|slicing|adaptive to run the suite against one receive mode,
and RMQ_INTEROP_PROXY=/path/to/rmq-proxy to test another build than the venv's.
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.interop._harness import run_client as _run_client
from tests.interop._harness import start_proxy

TOPICS = ("interop-py", "interop-node")


@pytest.fixture
def proxy(tmp_path):
    """A running proxy with 3 embedded broker stubs; every topic in TOPICS on every broker."""
    running = start_proxy(tmp_path / "proxy", TOPICS, mode=os.environ.get("RMQ_INTEROP_MODE"))
    try:
        yield running
    finally:
        complaint = running.stop()
    assert complaint is None, f"{complaint}\n{running.logs()}"


@pytest.fixture
def run_client(tmp_path):
    """``run_client(lang, *args, timeout=...)`` -> the driver's JSON; HOME is a temp dir, so
    the clients' logs stay there."""
    return functools.partial(_run_client, home=tmp_path / "home")
