"""The probe hub recovers from a probe loop that fails: its watchers still hear hasMsg."""

from __future__ import annotations

import asyncio

from proxy.receive.probes import ProbeHub
from proxy.remoting.broker_client import NotificationResult


class _Broker:
    """A broker client that always has a message."""

    async def notification(self, group, topic, *, poll_ms, order, timeout):
        return NotificationResult(has_msg=True, polling_full=False)


class _PoolWithADefect:
    """A pool whose first look-up raises what no broker error would: a defect in our
    code. This is the only way to make the loop itself fail; the probes after it are
    real hub code."""

    def __init__(self) -> None:
        self.lookups = 0

    def broker(self, name):
        self.lookups += 1
        if self.lookups == 1:
            raise RuntimeError("a defect")
        return _Broker()


async def test_a_probe_that_raises_is_logged_reported_and_started_again(caplog):
    outcomes: list[tuple[str, str]] = []
    hub = ProbeHub(
        _PoolWithADefect(),  # type: ignore[arg-type]
        error_backoff_s=0.05,
        on_result=lambda broker, outcome: outcomes.append((broker, outcome)),
    )
    loop = asyncio.get_running_loop()
    heard: asyncio.Future[str] = loop.create_future()

    def hear(broker: str) -> None:
        if not heard.done():
            heard.set_result(broker)

    hub.watch(("broker-a", "g", "t"), loop.time() + 5, hear, lambda: None)
    try:
        assert await asyncio.wait_for(heard, 2) == "broker-a"
    finally:
        await hub.close()
    assert outcomes[0] == ("broker-a", "error")
    assert "probe of ('broker-a', 'g', 't') failed" in caplog.text
